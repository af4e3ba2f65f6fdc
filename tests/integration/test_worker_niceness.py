"""The processes that answer turns run at niceness 0 on a Ray the project starts, not at the
15 Ray gives its workers by default (serve/ray_options.py ``RAY_worker_niceness``): the
gateway, the session host that served a turn, and the inference replica, every thread."""

from __future__ import annotations

import asyncio
import json
import os

import websockets

from bench.processes import server_processes
from tests.support.wire import raw_collect

SERVING_ROLES = {"gateway", "session_host", "inference"}


def thread_niceness(pid: int) -> dict[int, int]:
    """Each live thread of ``pid``: its niceness (Linux keeps one per thread)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = os.getpriority(os.PRIO_PROCESS, int(tid))
        except ProcessLookupError:  # the thread ended meanwhile
            continue
    return out


async def one_turn(ws_url: str) -> str:
    async with websockets.connect(ws_url) as ws:
        create = {
            "type": "response.create",
            "model": "emu-fast",
            "store": False,
            "input": "hi",
            "metadata": {"emulator.tool_rounds": "0", "emulator.text_tokens": "4"},
        }
        await ws.send(json.dumps(create))
        return (await raw_collect(ws))[-1]["type"]


def test_the_processes_answering_turns_run_at_niceness_0(server_url):
    ws_url = server_url.replace("http", "ws", 1) + "/v1/responses"
    assert asyncio.run(one_turn(ws_url)) == "response.completed"
    serving = {pid: role for pid, role in server_processes().items() if role in SERVING_ROLES}
    assert set(serving.values()) == SERVING_ROLES, serving
    niceness = {(serving[pid], pid): thread_niceness(pid) for pid in serving}
    reniced = {key: {t: n for t, n in threads.items() if n != 0} for key, threads in niceness.items()}
    assert not any(reniced.values()), f"threads not at niceness 0 (role, pid): {reniced}"
