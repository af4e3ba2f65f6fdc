"""What a scaling experiment shows and keeps: the schema of ``scaling.json`` and its
:func:`validate`, :func:`write_report` (``report.html``, the CSV and markdown tables, the JSON),
the driver's :class:`LivePage` and its terminal :func:`progress_line`.  A headless-Chromium
checker of the pages is :mod:`bench.report.browser`."""

from __future__ import annotations

from .live import LivePage
from .progress import progress_line
from .schema import validate
from .write import write_report

__all__ = ["LivePage", "progress_line", "validate", "write_report"]
