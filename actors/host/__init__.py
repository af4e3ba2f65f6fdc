"""The session host: the I/O around the sans-I/O core of :mod:`actors`.

- :mod:`.actor` — the Ray actor (:class:`SessionHost`); with :mod:`.metrics` (its Ray
  metrics) the only modules here importing Ray;
- :mod:`.server` — the WebSocket server on handed-over sockets;
- :mod:`.websocket` — one client's WebSocket: websockets' sans-I/O ``ServerProtocol``
  driven by an ``asyncio.Protocol`` of our own (:class:`~.websocket.WebSocket`);
- :mod:`.handoff` — both sides of passing an accepted socket from the gateway to a host;
- :mod:`.connection` — the asyncio driver of one :class:`~actors.core.session.Session`;
- :mod:`.resume` — parked connection states and resume tokens.
"""
