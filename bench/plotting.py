"""The one matplotlib setup of the benchmarks: plots go to PNG files (the Agg backend, chosen
here once, before pyplot loads) and :func:`save` writes and closes a figure."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any


@functools.cache
def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, title: str | None = None, *, dpi: int = 110) -> Path:
    """Title (if any), lay out, write ``fig`` as a PNG and close it; returns ``path``."""
    if title is not None:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
