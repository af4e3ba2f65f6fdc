"""The session host: the I/O around the sans-I/O core of :mod:`actors`, one job a module
(docs/architecture.md lists them all).

- :mod:`.actor` — the Ray actor (:class:`SessionHost`), its Ray metrics in :mod:`.host_metrics`;
- :mod:`.server` — runs a WebSocket on each handed-over socket: its upgrade answered by
  :mod:`.upgrade`, its connection state by :mod:`.lifecycle`, its frames sent by
  :mod:`.sender`, measurement through the one observer seam :mod:`.figures`;
- :mod:`.websocket` — one client's WebSocket: websockets' sans-I/O ``ServerProtocol``
  driven by an ``asyncio.Protocol`` of our own (:class:`~.websocket.WebSocket`);
- :mod:`.handoff` — both sides of passing an accepted socket from the gateway to a host;
- :mod:`.connection` — the asyncio side of one :class:`~actors.core.session.Session`, the
  port its :class:`~actors.core.driver.Driver` carries the session's effects out through
  (its model calls in :mod:`.model_calls`);
- :mod:`.resume` and :mod:`.continuity` — resumable connection states, on this host or any node.
"""
