"""``responses-ws replay``: recorded agent sessions (Codex CLI rollouts, Claude Code logs)
re-driven over every transport (docs/replay.md).  ``formats`` finds and reads the logs
(``codex``, ``claude``) into privacy-safe shapes (``shape``); ``synth`` re-synthesises the
requests, ``driver`` runs them step by step, ``report`` says what was measured; the command is
:mod:`bench.kinds.replay`."""
