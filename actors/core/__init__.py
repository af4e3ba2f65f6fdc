"""The session core: one connection's state machine and everything it owns, sans-I/O."""
