"""The ledger journal: a process's ledger lines on local disk before they are committed.

A ``store:false`` response's ledger line is appended to its process's journal (one
``write(2)`` to a file opened ``O_APPEND``: once it returns, the line is in the kernel's page
cache and survives the process being killed) before the response's terminal event leaves,
and is committed to the store write-behind, in batches.  The journal is emptied whenever
every line appended to it is committed; a process that dies leaves its journal behind, and
:func:`replay` commits what it holds (lines are unique by response id in the store, so a
line committed twice is billed once) and removes it, as it does with one its process closed
with lines it could not commit (a store outage).  A journal is ``<dir>/<name>.<pid>.jsonl``;
closed uncommitted, ``<dir>/<name>.<pid>.closed.jsonl``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import fields
from pathlib import Path

from .base import Store, UsageEntry

log = logging.getLogger(__name__)

_FIELDS = tuple(f.name for f in fields(UsageEntry))  # flat: a line is its fields as they are
_COMPACT = json.JSONEncoder(separators=(",", ":")).encode  # made once: json.dumps makes one a call

SUFFIX = ".jsonl"
CLOSED = ".closed" + SUFFIX


class Journal:
    """This process's journal ``<directory>/<name>.<pid>.jsonl`` (created, appended, emptied)."""

    def __init__(self, directory: str | Path, name: str) -> None:
        self.path = Path(directory) / f"{name}.{os.getpid()}{SUFFIX}"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = os.fstat(self._fd).st_size

    def append(self, entry: UsageEntry) -> None:
        """Write ``entry``'s line; raises ``OSError`` if it could not be written whole."""
        data = (_COMPACT({name: getattr(entry, name) for name in _FIELDS}) + "\n").encode()
        if os.write(self._fd, data) != len(data):
            raise OSError(f"short write to the ledger journal {self.path}")
        self._size += len(data)

    def clear(self) -> None:
        """Every line appended so far is committed."""
        if self._size:
            os.ftruncate(self._fd, 0)
            self._size = 0

    def close(self, *, committed: bool) -> None:
        """Close; the file is removed when every line is ``committed``, else left for :func:`replay`."""
        os.close(self._fd)
        if committed:
            self.path.unlink(missing_ok=True)
        else:
            self.path.rename(self.path.with_name(self.path.name[: -len(SUFFIX)] + CLOSED))


def _alive(path: Path) -> bool:
    if path.name.endswith(CLOSED):
        return False
    try:
        pid = int(path.name[: -len(SUFFIX)].rsplit(".", 1)[1])
    except (IndexError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def orphans(directory: str | Path) -> list[Path]:
    """The journals in ``directory`` whose process is gone."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(f"*{SUFFIX}") if not _alive(p))


def read(path: Path) -> list[UsageEntry]:
    """The lines of a journal; a torn last line (the process died mid-write) is skipped."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            out.append(UsageEntry(**json.loads(line)))
        except (ValueError, TypeError):
            log.warning("ledger journal %s:%d: unreadable line skipped", path, n)
    return out


async def replay(directory: str | Path, store: Store) -> int:
    """Commit the lines of every orphaned journal in ``directory`` and remove it; the number
    of lines read (already committed ones included: the store bills each id once)."""
    total = 0
    for path in orphans(directory):
        entries = read(path)
        if entries:
            await store.add_usage(entries)
        path.unlink(missing_ok=True)
        total += len(entries)
        log.info("ledger journal %s replayed: %d lines", path.name, len(entries))
    return total
