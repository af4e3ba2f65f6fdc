"""Durable storage of ``store:true`` responses and the usage ledger, laid out like httpx's
transports: :mod:`.base` (records, the :class:`Store` protocol, the codec, the config), one
module per backend (:mod:`.sqlite`, :mod:`.redis`; the Redis client, a server or a Redis
Cluster, and its replicated writes in :mod:`.redisconn`), the write-through :mod:`.writer`,
and :func:`open_store`; each shard's replicas, what a write waits for and
:func:`replication_status`: :mod:`.replication`.  Resumable connections' states: :mod:`.connection_states` (its per-turn
changes: :mod:`.splice`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .base import (
    ReadUnavailable,
    Store,
    StoreConfig,
    StoredResponse,
    StoreRefused,
    UsageEntry,
    WriteUnavailable,
    decode_record,
    encode_body,
)
from .journal import Journal, replay
from .replication import ReplicationObserver, ReplicationStatus, Shard
from .writer import StoreWriter, WriterClosed

__all__ = [
    "ReadUnavailable",
    "ReplicationObserver",
    "ReplicationStatus",
    "Shard",
    "Store",
    "StoreConfig",
    "StoreRefused",
    "StoreWriter",
    "StoredResponse",
    "UsageEntry",
    "WriteUnavailable",
    "WriterClosed",
    "decode_record",
    "encode_body",
    "open_store",
    "open_writer",
    "redis_password",
    "replication_status",
]


def open_store(config: StoreConfig, *, observer: ReplicationObserver | None = None) -> Store:
    """The backend ``config`` names; call it in the process (and thread) that will use it.
    ``observer`` hears of the Redis shards' replication (:mod:`.replication`)."""
    if config.backend == "redis":
        from .redis import RedisStore  # imported on demand: redis is only needed when chosen
        from .redisconn import Replication

        return RedisStore(
            config.redis_url,
            config.key_prefix,
            cluster=config.redis_cluster,
            shards=config.ledger_shards,
            replication=Replication(
                config.replicas_to_wait, config.wait_timeout_ms, config.wait_replicas_policy
            ),
            password=redis_password(config),
            observer=observer,
        )
    from .sqlite import SQLiteStore

    return SQLiteStore(config.data_dir)


async def replication_status(config: StoreConfig) -> ReplicationStatus:
    """Each Redis primary's online replicas against ``store.wait_replicas`` (``INFO
    replication``, asked now with the config's credential; ``responses-ws status``); no
    shards for SQLite or when no replica is waited for.  Raises :class:`StoreRefused` if the
    server refuses the credential, the client's error if it cannot be reached."""
    status = ReplicationStatus(config.wait_replicas_policy, config.replicas_to_wait)
    if config.backend != "redis" or not config.replicas_to_wait:
        return status
    from redis import exceptions as redis_errors

    from .redis import REFUSALS, RedisStore

    store = open_store(config)
    assert isinstance(store, RedisStore)
    store.replicas.quiet = True  # a one-off look: no log line for what it sees
    try:
        await store.replicas.refresh()
    except (redis_errors.AuthenticationError, redis_errors.NoPermissionError) as exc:
        raise StoreRefused(f"redis refused this client: {exc}") from exc
    except redis_errors.RedisError as exc:
        if str(exc).lstrip("-").startswith(REFUSALS):
            raise StoreRefused(f"redis refused this client: {exc}") from exc
        raise
    finally:
        await store.close()
    return store.replication_status()


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
    config: StoreConfig,
    name: str,
    *,
    on_failure: Callable[[], None] | None = None,
    observer: ReplicationObserver | None = None,
) -> StoreWriter:
    """The process's writer: with ``config.ledger_mode`` ``journal`` it journals its
    ``store:false`` ledger lines under ``name``, with ``commit`` it commits them before their
    terminal event (no file); the journals of this node's dead processes are committed first
    (:func:`replay`; none exist in a node that never journaled).  A write the store cannot
    take now is retried for ``config.write_retry_s``."""
    store = open_store(config, observer=observer)
    await replay(config.journal_dir, store)
    retry_s = config.write_retry_s
    if config.ledger_mode == "commit":
        return StoreWriter(store, on_failure=on_failure, commit_lines=True, retry_s=retry_s)
    return StoreWriter(
        store, on_failure=on_failure, journal=Journal(config.journal_dir, name), retry_s=retry_s
    )
