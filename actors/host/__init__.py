"""The session host: the I/O around the sans-I/O core of :mod:`actors`.

- :mod:`.actor` — the Ray actor (:class:`SessionHost`), its Ray metrics in :mod:`.host_metrics`;
- :mod:`.server` — the WebSocket server on handed-over sockets;
- :mod:`.websocket` — one client's WebSocket: websockets' sans-I/O ``ServerProtocol``
  driven by an ``asyncio.Protocol`` of our own (:class:`~.websocket.WebSocket`);
- :mod:`.handoff` — both sides of passing an accepted socket from the gateway to a host;
- :mod:`.connection` — the asyncio side of one :class:`~actors.core.session.Session`, the
  port its :class:`~actors.core.driver.Driver` carries the session's effects out through;
- :mod:`.resume` — parked connection states and resume tokens.
"""
