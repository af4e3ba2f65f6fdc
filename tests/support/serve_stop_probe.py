"""A redeploy with Serve's direct-ingress draining period left at Ray's default (30 s before
Serve calls a stopping gateway's destructor): how soon the old gateway's idle socket closes,
and with what code.  The gateway's drain watch sees Serve's stop (serve/ray_drain.py) and
drains at once.  Prints one JSON line; run in a process of its own by
tests/cluster/test_ray_drain.py (its Ray must start with the default in its environment)."""

from __future__ import annotations

import asyncio
import json
import os
import time

os.environ.pop("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", None)
MIN_DRAINING_PERIOD_S = 30.0  # Ray's default, which this probe runs with


def main() -> dict:
    from serve.embedded import RAY_ENV, deploy, embedded_ray, local_config

    del RAY_ENV["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"]  # Ray's default, not the server's 1 s
    import websockets

    with embedded_ray(object_store_mb=100, num_cpus=2):
        config = local_config()
        url = deploy(config, name="rws-stop-probe")
        ws_url = url.replace("http", "ws", 1) + "/v1/responses"

        async def watch() -> dict:
            async with websockets.connect(ws_url, ping_interval=None) as ws:
                redeploy = asyncio.create_task(
                    asyncio.to_thread(
                        deploy,
                        config.model_copy(
                            update={"server": config.server.model_copy(update={"drain_timeout_s": 29.0})}
                        ),
                        name="rws-stop-probe",
                    )
                )
                await redeploy  # raises what the redeploy raised
                t_ready = time.monotonic()
                try:
                    await asyncio.wait_for(ws.recv(), MIN_DRAINING_PERIOD_S + 20)
                    return {"error": "a message instead of a close"}
                except websockets.ConnectionClosed as closed:
                    return {
                        "env": os.environ.get("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"),
                        "close_code": closed.rcvd.code if closed.rcvd is not None else None,
                        "closed_after_new_replica_ready_s": time.monotonic() - t_ready,
                    }

        return asyncio.run(watch())


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
