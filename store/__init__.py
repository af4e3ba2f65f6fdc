"""Durable storage of ``store:true`` responses and the usage ledger, laid out like httpx's
transports: :mod:`.base` (records, the :class:`Store` protocol, the codec, the config), one
module per backend (:mod:`.sqlite`, :mod:`.redis`; the Redis client, a server or a Redis
Cluster, and its replicated writes in :mod:`.redisconn`), the write-through :mod:`.writer`,
and :func:`open_store`.  Resumable connections' states: :mod:`.connection_states` (its per-turn
changes: :mod:`.splice`).  Used by ``serve/`` and ``actors/``; imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .base import Store, StoreConfig, StoredResponse, StoreRefused, UsageEntry, decode_record, encode_body
from .journal import Journal, replay
from .writer import StoreWriter, WriterClosed

__all__ = [
    "Store",
    "StoreConfig",
    "StoreRefused",
    "StoreWriter",
    "StoredResponse",
    "UsageEntry",
    "WriterClosed",
    "decode_record",
    "encode_body",
    "open_store",
    "open_writer",
    "redis_password",
]


def open_store(config: StoreConfig) -> Store:
    """The backend ``config`` names; call it in the process (and thread) that will use it."""
    if config.backend == "redis":
        from .redis import RedisStore  # imported on demand: redis is only needed when chosen
        from .redisconn import Replication

        return RedisStore(
            config.redis_url,
            config.key_prefix,
            cluster=config.redis_cluster,
            shards=config.ledger_shards,
            replication=Replication(config.replicas_to_wait, config.wait_timeout_ms),
            password=redis_password(config),
        )
    from .sqlite import SQLiteStore

    return SQLiteStore(config.data_dir)


def redis_password(config: StoreConfig) -> str | None:
    """The password in ``config.redis_password_file`` (stripped), or ``None`` if none is named."""
    if config.redis_password_file is None:
        return None
    path = Path(config.redis_password_file).expanduser()
    try:
        password = path.read_text().strip()
    except OSError as exc:
        raise StoreRefused(f"store.redis_password_file {path}: {exc.strerror or exc}") from exc
    if not password:
        raise StoreRefused(f"store.redis_password_file {path} is empty")
    return password


async def open_writer(
    config: StoreConfig, name: str, *, on_failure: Callable[[], None] | None = None
) -> StoreWriter:
    """The process's writer: with ``config.ledger_mode`` ``journal`` it journals its
    ``store:false`` ledger lines under ``name``, with ``commit`` it commits them before their
    terminal event (no file); the journals of this node's dead processes are committed first
    (:func:`replay`; none exist in a node that never journaled)."""
    store = open_store(config)
    await replay(config.journal_dir, store)
    if config.ledger_mode == "commit":
        return StoreWriter(store, on_failure=on_failure, commit_lines=True)
    return StoreWriter(store, on_failure=on_failure, journal=Journal(config.journal_dir, name))
