"""A TCP balancer stand-in for tests: one port in front of a backend the test can switch, the
way a load balancer sends a reconnecting client to whichever node is up (the multi-node
harness uses HAProxy; on one node this is enough to move a client between two apps)."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class Balancer:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.upstream_ports: list[int] = []  # the local port of each upstream connection, in order
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), name="balancer", daemon=True).start()
        ready.wait(10)
        assert self._server is not None
        self.port: int = self._server.sockets[0].getsockname()[1]

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
            ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self.upstream_ports.append(up_writer.get_extra_info("sockname")[1])

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                with contextlib.suppress(OSError, RuntimeError):
                    dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def close(self) -> None:
        def stop() -> None:
            if self._server is not None:
                self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
