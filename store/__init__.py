"""Durable storage of ``store:true`` responses and the usage ledger, laid out like httpx's
transports: :mod:`.base` (records, the :class:`Store` protocol, the codec, the config), one
module per backend (:mod:`.sqlite`, :mod:`.redis`), the write-through :mod:`.writer`, and
:func:`open_store`.  Used by ``serve/`` and ``actors/``; imports neither.
"""

from __future__ import annotations

from .base import Store, StoreConfig, StoredResponse, UsageEntry, decode_record, encode_body
from .writer import StoreWriter, WriterClosed

__all__ = ["Store", "StoreConfig", "StoreWriter", "StoredResponse", "UsageEntry", "WriterClosed",
           "decode_record", "encode_body", "open_store"]


def open_store(config: StoreConfig) -> Store:
    """The backend ``config`` names; call it in the process (and thread) that will use it."""
    if config.backend == "redis":
        from .redis import RedisStore  # imported on demand: redis is only needed when chosen

        return RedisStore(config.redis_url, config.key_prefix)
    from .sqlite import SQLiteStore

    return SQLiteStore(config.data_dir)
