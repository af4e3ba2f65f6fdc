"""Fuzz a server with hostile client input and summarise what it answered.

    responses-ws bench fuzz --cases 10000                  # half WebSocket frames, half HTTP requests
    responses-ws bench fuzz --cases 2000 --seed 7 --out results/fuzz.json

The cases are the strategies of ``tests/integration/test_fuzz_events.py`` and
``test_fuzz_http.py`` (:mod:`bench.fuzz_cases`), judged by the same oracle
(:mod:`bench.fuzz_oracle`), against an embedded server configured as the tests' one
(64 KiB frame cap, 8-token answers).  Unlike the tests it does not stop at the first bad
answer: it counts them, keeps the first few, and exits 1 if there were any.  Prints a
table (cases per kind, answers seen, 5xx, closes, wall time) and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from serve.embedded import embedded_server, local_config

from .. import results
from ..client import ws_url
from ..fuzz_cases import http_cases, ws_cases
from ..fuzz_oracle import HttpFuzzer, Outcome, WsFuzzer, server_overrides

ALIVE_EVERY = 500  # cases between checks that the fuzzed sockets and a new one still work
KEPT = 20  # bad answers kept in the JSON


def drive(
    strategy: st.SearchStrategy[Any],
    n: int,
    seed_: int,
    run: Callable[[Any], Outcome],
    every: Callable[[int], list[str]] | None = None,
) -> tuple[list[dict[str, Any]], list[str], float]:
    """Draw ``n`` cases and run each; returns (bad answers, failed alive checks, seconds)."""
    bad: list[dict[str, Any]] = []
    alive: list[str] = []
    count = 0

    @seed(seed_)
    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def one(case: Any) -> None:
        nonlocal count
        count += 1
        outcome = run(case)
        if outcome.problems and len(bad) < KEPT:
            bad.append({"case": repr(case)[:400], "problems": outcome.problems, "replies": outcome.replies})
        if every is not None and count % ALIVE_EVERY == 0:
            alive.extend(every(count))

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hypothesis: "overly large repr" of long strings
        one()
    return bad, alive, time.perf_counter() - t0


def fuzz(url: str, cases: int, seed_: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    n_ws = cases // 2
    ws = WsFuzzer(ws_url(url))
    try:
        ws_bad, ws_alive, ws_s = drive(
            ws_cases(), n_ws, seed_, ws.run, lambda i: [f"after {i}: {p}" for p in ws.check_alive()]
        )
        ws_alive += [f"at the end: {p}" for p in ws.check_alive()]
    finally:
        ws.close()
    http = HttpFuzzer(url)
    try:
        http_bad, _, http_s = drive(http_cases(), cases - n_ws, seed_, http.run)
    finally:
        http.close()
    ws_5xx = sum(n for r, n in ws.replies.items() if r.startswith("error 5") or "server_error" in r)
    http_5xx = sum(n for s, n in http.statuses.items() if s.startswith("5"))
    return {
        "wall_s": round(time.perf_counter() - t0, 1),
        "websocket": {
            "cases": sum(ws.kinds.values()),
            "wall_s": round(ws_s, 1),
            "kinds": dict(ws.kinds),
            "answers": dict(ws.replies.most_common()),
            "closes": {str(k): v for k, v in ws.closes.items()},
            "bad_cases": ws.problems,
            "alive_check_failures": ws_alive,
            "first_bad": ws_bad,
            "server_errors": ws_5xx,
        },
        "http": {
            "cases": sum(http.kinds.values()),
            "wall_s": round(http_s, 1),
            "kinds": dict(http.kinds),
            "statuses": dict(http.statuses.most_common()),
            "bad_cases": http.problems,
            "first_bad": http_bad,
            "server_errors": http_5xx,
        },
    }


def render(result: dict[str, Any]) -> str:
    ws, http = result["websocket"], result["http"]
    head = (
        f"fuzz: {ws['cases'] + http['cases']} cases in {result['wall_s']:.1f} s "
        f"(seed {result['seed']}, {result['url']})"
    )
    lines = [head, ""]
    for title, part, answers in (("WebSocket frames", ws, "answers"), ("HTTP requests", http, "statuses")):
        lines.append(
            f"{title}: {part['cases']} cases in {part['wall_s']:.1f} s, "
            f"{part['bad_cases']} with a bad answer, {part['server_errors']} 5xx/server_error"
        )
        lines += [f"  {kind:<22}{n:>7}" for kind, n in sorted(part["kinds"].items(), key=lambda kv: -kv[1])]
        lines.append("  answers seen:")
        lines += [f"    {answer:<40}{n:>7}" for answer, n in part[answers].items()]
        lines.append("")
    lines.append(
        "WebSocket closes: " + (", ".join(f"{code} × {n}" for code, n in ws["closes"].items()) or "none")
    )
    lines.append(
        "alive checks: "
        + ("all passed" if not ws["alive_check_failures"] else f"{len(ws['alive_check_failures'])} failed")
    )
    for part in (ws, http):
        for bad in part["first_bad"]:
            lines.append(f"BAD {bad['case'][:160]} → {bad['problems']}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cases", type=int, default=10_000, help="total cases, split evenly between WebSocket and HTTP"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--url",
        default=None,
        help="a running server started with bench.fuzz_oracle.server_overrides() "
        "(default: start an embedded one)",
    )
    p.add_argument("--out", type=Path, default=Path("results/fuzz.json"))


def run(args: argparse.Namespace) -> int:
    if args.url:
        result = fuzz(args.url, args.cases, args.seed)
    else:
        with (
            tempfile.TemporaryDirectory(prefix="fuzz-store-", ignore_cleanup_errors=True) as data_dir,
            embedded_server(local_config(None, **{"store.data_dir": data_dir, **server_overrides()})) as url,
        ):
            result = fuzz(url, args.cases, args.seed)
    result = {
        "command": args.command,
        "url": args.url or "embedded",
        "seed": args.seed,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        **result,
    }
    print(render(result))
    results.write(args.out, result, args.run)
    print(f"wrote {args.out}")
    ws, http = result["websocket"], result["http"]
    return 1 if ws["bad_cases"] or http["bad_cases"] or ws["alive_check_failures"] else 0
