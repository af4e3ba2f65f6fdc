"""``python -m bench.report DIR/scaling.json [--out DIR]``: validate a run's ``scaling.json``
and write its report again (``report.html``, the CSV and markdown tables) — after copying it
from the head (``ray rsync-down``), or with a newer lab.  A document that does not match the
schema is refused in one line naming where (exit 2); nothing is written then."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .write import write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "scaling_json", type=Path, help="a scaling.json written by `responses-ws bench scaling`"
    )
    parser.add_argument("--out", type=Path, help="where to write the report (default: beside the JSON)")
    args = parser.parse_args(argv)
    try:
        doc = json.loads(args.scaling_json.read_text(encoding="utf-8"))
        written = write_report(doc, args.out or args.scaling_json.parent)
    except (OSError, ValueError) as exc:  # unreadable, not JSON, or not the schema's
        print(f"python -m bench.report: {args.scaling_json}: {exc}", file=sys.stderr)
        return 2
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
