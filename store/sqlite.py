"""The embedded store: one SQLite file in the data directory (docs/protocol.md §4.9, §6).

Many processes write the same file at once (every connection actor and the HTTP gateway
open their own ``SQLiteStore``), hence WAL mode, so readers never block the writer, and a
5 s busy timeout, so concurrent writers queue instead of failing with "database is locked".
Every statement is its own autocommit transaction, and the writes of several statements (a
record with its ledger line, a batch of lines) take the write lock up front (``BEGIN
IMMEDIATE``): no read-to-write upgrade can dead-end.  A ledger line is unique by response id
(``ON CONFLICT DO NOTHING``): writing one again changes nothing.

``sqlite3`` connections must not be used from two threads at once, so each store owns one
single-thread executor that opens, uses and closes the connection; the async methods only
hand calls to it, in order.  ``synchronous=NORMAL`` (the usual WAL setting) keeps every
committed write across a process crash; only a power loss may drop the last few.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from .base import StoredResponse, UsageEntry, decode_record, encode_body, item_in, new_item_ids

T = TypeVar("T")

FILE_NAME = "responses.sqlite3"
BUSY_TIMEOUT_MS = 5000
SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY,  -- the rowid, named so VACUUM keeps it: it orders the ledger
    response_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    model TEXT NOT NULL,
    transport TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_owner ON usage (owner);
CREATE UNIQUE INDEX IF NOT EXISTS usage_response ON usage (response_id);  -- one line per response
CREATE TABLE IF NOT EXISTS items (  -- what an item_reference may name: item id -> the response that added it
    id TEXT PRIMARY KEY,
    response_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS health (
    id INTEGER PRIMARY KEY CHECK (id = 1),  -- one row, rewritten by every readiness probe
    checked_at REAL NOT NULL
);
"""
USAGE_COLUMNS = "response_id, owner, model, transport, input_tokens, cached_tokens, output_tokens, created_at"
# Only a line for the same response is skipped (``OR IGNORE`` would drop a NOT NULL violation too).
ADD_LINE = (
    f"INSERT INTO usage ({USAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (response_id) DO NOTHING"
)


def usage_row(entry: UsageEntry) -> tuple:
    return (
        entry.response_id,
        entry.owner,
        entry.model,
        entry.transport,
        entry.input_tokens,
        entry.cached_tokens,
        entry.output_tokens,
        entry.created_at,
    )


def transaction(conn: sqlite3.Connection, write: Callable[[sqlite3.Connection], object]) -> None:
    """Run ``write`` in one transaction holding the write lock from the start; all or nothing."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        write(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


class SQLiteStore:
    """A :class:`~store.Store` on ``<data_dir>/responses.sqlite3``.

    The constructor creates the directory, opens the file and the schema (blocking, once);
    errors such as an unwritable directory surface there.  Use one instance per process and
    event loop; any number of instances, in any processes, may share the file.
    """

    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir) / FILE_NAME
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        try:
            self._executor.submit(self._open).result()
        except BaseException:
            self._executor.shutdown(wait=False)
            raise

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.executescript(SCHEMA)
        self._conn = conn

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise RuntimeError("SQLiteStore is closed")
        conn = self._conn
        assert conn is not None
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, conn)

    async def put(self, record: StoredResponse, usage: UsageEntry | None = None) -> None:
        """Insert or replace the record and, in the same transaction, add ``usage``'s line
        unless its response already has one (a re-put of the same id is idempotent)."""
        row = (record.id, record.owner, record.created_at, encode_body(record))
        items = [(item_id, record.id) for item_id in new_item_ids(record)]

        def write(c: sqlite3.Connection) -> None:
            c.execute(
                "INSERT OR REPLACE INTO responses (id, owner, created_at, body) VALUES (?, ?, ?, ?)", row
            )
            # The first response that held an item keeps it (a later input resending it does not).
            c.executemany("INSERT OR IGNORE INTO items (id, response_id) VALUES (?, ?)", items)
            if usage is not None:
                c.execute(ADD_LINE, usage_row(usage))

        await self._call(lambda c: transaction(c, write))

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The record, or ``None`` if missing, deleted, or owned by someone else."""
        row = await self._call(
            lambda c: c.execute(
                "SELECT created_at, body FROM responses WHERE id = ? AND owner = ?", (response_id, owner)
            ).fetchone()
        )
        return None if row is None else decode_record(response_id, owner, row[0], row[1])

    async def find_items(self, item_ids: Sequence[str], owner: str) -> dict[str, dict[str, Any]]:
        """The items of ``owner``'s stored responses with these ids (:meth:`store.Store.find_items`)."""
        wanted = list(dict.fromkeys(item_ids))
        marks = ", ".join("?" * len(wanted))
        rows = await self._call(
            lambda c: c.execute(
                "SELECT items.id, responses.id, responses.created_at, responses.body FROM items "
                f"JOIN responses ON responses.id = items.response_id WHERE items.id IN ({marks}) "
                "AND responses.owner = ?",
                (*wanted, owner),
            ).fetchall()
        )
        found = {}
        for item_id, response_id, created_at, body in rows:
            item = item_in(decode_record(response_id, owner, created_at, body), item_id)
            if item is not None:
                found[item_id] = item
        return found

    async def delete(self, response_id: str, owner: str) -> bool:
        """``True`` if a record of ``owner`` was deleted."""
        cursor = await self._call(
            lambda c: c.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (response_id, owner))
        )
        return cursor.rowcount > 0

    async def add_usage(self, entries: Sequence[UsageEntry]) -> None:
        """Add the lines in one transaction; a line whose response already has one is skipped."""
        rows = [usage_row(e) for e in entries]
        await self._call(lambda c: transaction(c, lambda t: t.executemany(ADD_LINE, rows)))

    async def usage(self, owner: str) -> list[UsageEntry]:
        """The ledger entries of ``owner``, oldest (first committed) first."""
        rows = await self._call(
            lambda c: c.execute(
                f"SELECT {USAGE_COLUMNS} FROM usage WHERE owner = ? ORDER BY id", (owner,)
            ).fetchall()
        )
        return [UsageEntry(*row) for row in rows]

    async def probe(self) -> None:
        """Rewrite the one row of ``health`` (a committed write, as a stored response is)."""
        now = time.time()
        await self._call(
            lambda c: c.execute("INSERT OR REPLACE INTO health (id, checked_at) VALUES (1, ?)", (now,))
        )

    async def close(self) -> None:
        """Finish the calls already handed to the worker, then close the file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        conn = self._conn
        assert conn is not None
        await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=False)  # idle by now: close ran last, in order
