"""The session core, sans-I/O: the wire protocol, the per-connection :class:`Session` state
machine and what it is built from (context, rendering, safety, response building, turns,
errors, timings).  Unit tests drive it in microseconds.

The I/O driver that runs sessions — the Ray actor, the asyncio connection driver, the
WebSocket server, socket handoff and resume — is :mod:`actors.host`; the inference seam it
calls models through, with its backends, is :mod:`actors.backend`.
"""
