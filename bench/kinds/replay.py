"""Replay recorded Codex CLI and Claude Code sessions over every transport, side by side.

    responses-ws replay ~/.codex/sessions ~/.claude/projects/my-project --json replay.json

Each PATH is a log or a folder of them (``*.jsonl``; Codex rollouts and Claude Code logs are
told apart by their records).  Every log becomes a privacy-safe shape (sizes, kinds,
durations; the text is measured and dropped), which is re-synthesised and driven step by
step over each transport, the emulated model scripted to produce each step's recorded
output.  Without --url an embedded server is started.  docs/replay.md explains the report.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from .. import results
from ..replay import log_formats as formats
from ..replay import report
from ..replay.driver import SessionRun, ToolTime, replay
from ..replay.shape import SessionShape, ShapeFile

REPLAY_TRANSPORTS = ("ws", "http-chained", "http-full")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="session logs, or folders of them")
    p.add_argument(
        "--transports",
        default=",".join(REPLAY_TRANSPORTS),
        help="comma-separated, of " + ", ".join(REPLAY_TRANSPORTS),
    )
    p.add_argument("--url", default=None, help="server base URL (default: start an embedded server)")
    p.add_argument("--config", type=Path, default=None, help="server YAML for the embedded server")
    p.add_argument("--model", default="emu-fast", help="the emulated model every step is sent to")
    p.add_argument(
        "--api-key",
        default=None,
        help="one key for every transport (default: a key per transport, so no transport "
        "reuses another's prefix-cache entries; a server without keys accepts them)",
    )
    p.add_argument(
        "--tool-time",
        default="recorded",
        type=ToolTime.parse,
        metavar="MODE",
        help="the tools' time: recorded, none, xFACTOR (x0.5: half) or SECONDS per step with calls",
    )
    p.add_argument(
        "--breakpoints",
        choices=("30m", "12h"),
        default=None,
        help="place prompt-cache breakpoints as a client would (bench/breakpoints.py), the first "
        "with this ttl; reads and writes by ttl are reported per transport (e.g. --model emu-cache)",
    )
    p.add_argument(
        "--human-gaps",
        action="store_true",
        help="also wait the recorded time before each user message (excluded by default)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument(
        "--export-shape",
        type=Path,
        default=None,
        help="write the sessions' shapes (no text: sizes, kinds, durations) here",
    )
    p.add_argument("--plot", type=Path, default=None, help="write the time-per-step chart (PNG) here")
    p.add_argument("--no-run", action="store_true", help="only read the logs (and --export-shape): no server")
    p.add_argument("--no-warmup", action="store_true", help="skip the unmeasured warm-up replay")
    p.add_argument("--quiet", action="store_true", help="no report on stdout (problems still go to stderr)")


def run(args: argparse.Namespace) -> int:
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    unknown = sorted(set(transports) - set(REPLAY_TRANSPORTS))
    if unknown or not transports:
        print(
            f"responses-ws replay: unknown transports {unknown}; known: {', '.join(REPLAY_TRANSPORTS)}",
            file=sys.stderr,
        )
        return 2
    sessions, errors = formats.read_sessions(args.paths)
    for error in errors:
        print(f"responses-ws replay: {error}", file=sys.stderr)
    if args.export_shape:
        args.export_shape.write_text(ShapeFile(sessions=sessions).model_dump_json(indent=1) + "\n")
    if not sessions:
        print("responses-ws replay: no session to replay", file=sys.stderr)
        return 1
    if args.no_run:
        if not args.quiet:
            for s in sessions:
                print(
                    f"{s.label}: {s.format}, {len(s.steps)} steps, "
                    f"{1 + sum(st.new_chain for st in s.steps)} chain(s)"
                )
        return 0
    if args.url:
        payload = measure(args, args.url, sessions, transports)
    else:
        from serve.embedded import embedded_server, local_config

        if not args.quiet:
            print("starting an embedded Ray and the responses-ws app …", flush=True)
        with embedded_server(local_config(args.config)) as url:
            payload = measure(args, url, sessions, transports)
    payload["read_errors"] = [str(e) for e in errors]
    if not args.quiet:
        print("\n".join(report.render(payload)))
    if args.json:
        results.write(args.json, payload, args.run)
    if args.plot:
        report.plot(args.plot, payload)
    failed = any(t["error"] for s in payload["sessions"] for t in s["transports"].values())
    return 1 if failed else 0


def measure(
    args: argparse.Namespace, url: str, sessions: list[SessionShape], transports: list[str]
) -> dict[str, Any]:
    async def main() -> list[dict[str, Any]]:
        if not args.no_warmup:  # first-use costs (actor pool, handles, store) outside the numbers
            short = sessions[0].model_copy(update={"steps": sessions[0].steps[:2]})
            for name in transports:
                await replay(
                    short,
                    name,
                    url,
                    model=args.model,
                    api_key=_key(args, name, "warmup"),
                    tool_time=ToolTime(scale=0.0),
                )
        out = []
        for s in sessions:
            runs: dict[str, SessionRun] = {}
            for name in transports:  # the same session on every transport, one after the other
                runs[name] = await replay(
                    s,
                    name,
                    url,
                    model=args.model,
                    api_key=_key(args, name, "run"),
                    tool_time=args.tool_time,
                    human_gaps=args.human_gaps,
                    cache_breakpoints=args.breakpoints,
                )
            out.append(report.session_payload(s, runs))
        return out

    payload_sessions = asyncio.run(main())
    return {
        "url": args.url or "embedded",
        "model": args.model,
        "tool_time": vars(args.tool_time),
        "human_gaps": args.human_gaps,
        "breakpoints": args.breakpoints,
        "sessions": payload_sessions,
        "total": report.total(payload_sessions),
    }


def _key(args: argparse.Namespace, transport: str, label: str) -> str:
    if args.api_key:
        return args.api_key
    return f"sk-replay-{label}-{transport}"
