"""The ledger journal: store:false lines survive their process, and are billed once."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from store import StoreConfig, StoreWriter, UsageEntry, open_store, open_writer
from store.journal import Journal, orphans, read, replay


def line(n: int) -> UsageEntry:
    return UsageEntry(f"resp_{n}", "k", "emu-fast", "websocket", 100 + n, 0, n, 1.0)


def test_a_line_is_on_disk_when_append_returns_and_clear_empties_the_journal(tmp_path):
    journal = Journal(tmp_path, "host")
    journal.append(line(1))
    journal.append(line(2))
    assert read(journal.path) == [line(1), line(2)]
    journal.clear()
    assert read(journal.path) == []
    journal.close(committed=True)
    assert not journal.path.exists()


def test_a_dead_or_closed_uncommitted_journal_is_an_orphan_a_live_one_is_not(tmp_path):
    live = Journal(tmp_path, "live")
    live.append(line(1))
    dead_pid = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()
    dead = tmp_path / f"dead.{dead_pid}.jsonl"
    dead.write_text(live.path.read_text() + '{"torn": ')  # died mid-write
    closed = Journal(tmp_path, "closed")
    closed.append(line(2))
    closed.close(committed=False)
    assert [p.name for p in orphans(tmp_path)] == sorted(
        [dead.name, f"closed.{closed.path.name.split('.')[1]}.closed.jsonl"]
    )
    assert read(dead) == [line(1)]  # the torn line is skipped
    live.close(committed=True)


def test_replay_bills_each_orphaned_line_once_and_removes_the_journals(tmp_path):
    async def main() -> list[UsageEntry]:
        store = open_store(StoreConfig(data_dir=str(tmp_path)))
        await store.add_usage([line(1)])  # committed before its process died
        journal = Journal(tmp_path / "j", "host")
        journal.append(line(1))
        journal.append(line(2))
        journal.close(committed=False)
        assert await replay(tmp_path / "j", store) == 2
        assert await replay(tmp_path / "j", store) == 0 and orphans(tmp_path / "j") == []
        out = await store.usage("k")
        await store.close()
        return out

    assert sorted(e.response_id for e in asyncio.run(main())) == ["resp_1", "resp_2"]


def test_the_writer_journals_before_it_commits_and_empties_the_journal_once_committed(tmp_path):
    async def main() -> tuple[list[UsageEntry], list[UsageEntry], list[UsageEntry]]:
        journal = Journal(tmp_path / "j", "host")
        writer = StoreWriter(open_store(StoreConfig(data_dir=str(tmp_path))), journal=journal)
        writer.bill_behind(line(1))
        on_disk = read(journal.path)  # before the loop ran the commit
        await writer.flush()
        after = read(journal.path)
        billed = await writer.usage("k")
        await writer.close()
        assert not journal.path.exists() and orphans(tmp_path / "j") == []
        return on_disk, after, billed

    on_disk, after, billed = asyncio.run(main())
    assert on_disk == [line(1)] and after == [] and billed == [line(1)]


def test_auto_commits_lines_to_a_cluster_store_and_journals_with_sqlite():
    assert StoreConfig().ledger_mode == "journal"
    assert StoreConfig(backend="redis").ledger_mode == "commit"
    assert StoreConfig(backend="redis", ledger="journal").ledger_mode == "journal"
    assert StoreConfig(ledger="commit").ledger_mode == "commit"


def test_a_writer_that_commits_its_lines_keeps_no_file_on_the_node(tmp_path):
    """``store.ledger: commit``: no journal is opened (nothing of the ledger on the node's
    disk); a line is in the store when ``bill`` returns."""
    config = StoreConfig(data_dir=str(tmp_path), ledger="commit")

    async def main() -> list[UsageEntry]:
        writer = await open_writer(config, "host")
        assert writer.commits_lines
        await writer.bill(line(1))
        billed = await writer.store.usage("k")
        await writer.close()
        return billed

    assert asyncio.run(main()) == [line(1)]
    assert not config.journal_dir.exists()


def test_the_default_sqlite_writer_journals(tmp_path):
    config = StoreConfig(data_dir=str(tmp_path))

    async def main() -> bool:
        writer = await open_writer(config, "host")
        writer.bill_behind(line(1))
        journaled = [p.name for p in config.journal_dir.iterdir()]
        await writer.close()
        return not writer.commits_lines and len(journaled) == 1

    assert asyncio.run(main())
