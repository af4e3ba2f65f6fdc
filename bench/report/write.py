"""Write a run's files: ``scaling.json`` (validated first), ``report.html``, ``scaling.csv``,
``scaling-nodes.csv`` and ``scaling.md``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .page import report_html
from .schema import validate
from .tables import markdown, nodes_csv, steps_csv

FILES = {
    "scaling.json": lambda doc: json.dumps(doc, indent=2) + "\n",
    "report.html": report_html,
    "scaling.csv": steps_csv,
    "scaling-nodes.csv": nodes_csv,
    "scaling.md": markdown,
}


def write_report(doc: Mapping[str, Any], out_dir: Path | str) -> dict[str, Path]:
    """Validate ``doc`` against the schema (``ValueError`` naming the first violation, nothing
    written) and write every file into ``out_dir`` (made if missing); returns them by name."""
    validate(doc)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, render in FILES.items():
        path = out / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(render(doc), encoding="utf-8")
        tmp.replace(path)
        written[name] = path
    return written
