"""A listener that leaves the port under a flood of connections: how many are reset.

    python -m investigations.handover [--cycles 40] [--clients 8] [--pauses 0,5]

No server and no Ray: two threads of this process play two gateway replicas on one port,
``--clients`` threads connect in a loop (send a request, read the answer).  Every
``--period-ms`` the "old" replica leaves as a draining gateway does (serve/front.py): it
stops accepting, accepts and answers what is queued, pauses ``--pauses`` ms (a process
preempted there: 0 is none), and closes its listener; then a new one joins.  Modes:

- ``group``: each replica binds its own socket into the port's ``SO_REUSEPORT`` group (the
  gateway before it shared its listener);
- ``shared``: the replicas share one listening socket (serve/port_claim.py's ``claim``);
- ``shutdown``: ``group``, with ``shutdown(SHUT_RD)`` on the listener before the final
  accepts (a way one might try to leave the group first).

Counts connections answered, reset, and closed unanswered (docs/reliability.md, "The last
unanswered upgrades").
"""

from __future__ import annotations

import argparse
import contextlib
import select
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import results

MODES = ("group", "shared", "shutdown")
HOST = "127.0.0.1"
OWNER = "bench-handover@local"


def _answer(conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError):
        conn.settimeout(5)
        conn.recv(100)
        conn.sendall(b"OK")


def _accept_one(listener: socket.socket) -> bool:
    try:
        conn, _ = listener.accept()
    except OSError:  # BlockingIOError: nothing queued
        return False
    conn.setblocking(True)
    threading.Thread(target=_answer, args=(conn,), daemon=True).start()
    return True


def _serve(listener: socket.socket, leaving: threading.Event, leave: Any, counts: Counter[str]) -> None:
    while not leaving.is_set():
        if select.select([listener], [], [], 0.01)[0]:
            _accept_one(listener)
    leave(listener, counts)


def _client(port: int, stop: threading.Event, counts: Counter[str], lock: threading.Lock) -> None:
    while not stop.is_set():
        with socket.socket() as c:
            try:
                c.settimeout(5)
                c.connect((HOST, port))
                c.sendall(b"GET")
                outcome = "answered" if c.recv(10) == b"OK" else "closed_unanswered"
            except ConnectionResetError:
                outcome = "reset"
            except ConnectionRefusedError:
                outcome = "refused"
            except OSError as exc:
                outcome = f"error {type(exc).__name__}"
        with lock:
            counts[outcome] += 1


def one(mode: str, pause_ms: float, cycles: int, clients: int, period_ms: float) -> dict[str, Any]:
    from serve.front import bind_socket
    from serve.port_claim import claim

    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def join(port: int) -> tuple[socket.socket, Any]:
        if mode == "shared":
            return claim(HOST, port, OWNER, bind_socket)
        return bind_socket(HOST, port), None

    def leave_with(claimed: Any) -> Any:
        def leave(listener: socket.socket, counts: Counter[str]) -> None:
            if claimed is not None:
                claimed.close()
            if mode == "shutdown":
                with contextlib.suppress(OSError):
                    listener.shutdown(socket.SHUT_RD)
            while _accept_one(listener):
                with lock:
                    counts["final_accepts"] += 1
            time.sleep(pause_ms / 1000)
            listener.close()

        return leave

    old, old_claim = join(0)
    port = old.getsockname()[1]
    stays, stays_claim = join(port)
    never = threading.Event()
    threading.Thread(target=_serve, args=(stays, never, leave_with(stays_claim), counts), daemon=True).start()
    stop = threading.Event()
    threads = [
        threading.Thread(target=_client, args=(port, stop, counts, lock), daemon=True) for _ in range(clients)
    ]
    for t in threads:
        t.start()
    for _ in range(cycles):
        leaving = threading.Event()
        server = threading.Thread(target=_serve, args=(old, leaving, leave_with(old_claim), counts))
        server.start()
        time.sleep(period_ms / 1000)
        leaving.set()
        server.join()
        old, old_claim = join(port)
    stop.set()
    for t in threads:
        t.join(10)
    leave_with(old_claim)(old, Counter())
    never.set()
    if stays_claim is not None:
        stays_claim.close()
    stays.close()
    return {
        "mode": mode,
        "pause_ms": pause_ms,
        "counts": dict(sorted(counts.items())),
        "unanswered": sum(n for k, n in counts.items() if k not in ("answered", "final_accepts")),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    p.add_argument(
        "--pauses", default="0,5", help="ms between the last accept and the close, comma-separated"
    )
    p.add_argument("--cycles", type=int, default=40, help="times the old replica leaves, per mode and pause")
    p.add_argument("--clients", type=int, default=8, help="client threads connecting in a loop")
    p.add_argument("--period-ms", type=float, default=100.0, help="how long each old replica serves")
    p.add_argument("--out", type=Path, default=Path("results/handover.json"))


def run(args: argparse.Namespace) -> int:
    rows = []
    for mode in args.modes.split(","):
        for pause in (float(p) for p in args.pauses.split(",")):
            row = one(mode, pause, args.cycles, args.clients, args.period_ms)
            rows.append(row)
            print(
                f"{mode:9} pause {pause:4.0f} ms: {row['unanswered']} unanswered of "
                f"{sum(n for k, n in row['counts'].items() if k != 'final_accepts')}  {row['counts']}"
            )
    results.write(
        args.out,
        {"cycles": args.cycles, "clients": args.clients, "period_ms": args.period_ms, "rows": rows},
        args.run,
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from investigations import main

    raise SystemExit(main("investigations.handover"))
