"""Durable storage of ``store:true`` responses and the usage ledger (docs/http-and-store.md).

The records, the :class:`Store` interface, the config and the JSON body both backends
share; the backends live in :mod:`store.sqlite` (embedded default, a file in the data
directory) and :mod:`store.redis` (multi-node clusters).  Records are owned: a read or delete with
another owner behaves exactly like a missing id, so existence is never revealed across API
keys.  ``store:false`` responses never reach a store.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """Everything needed to serve GET/input_items and to continue from a response."""

    id: str
    owner: str  # API-key fingerprint of the creator
    created_at: float
    response: dict[str, Any]  # the terminal Response object as sent to the client
    input_items: list[dict[str, Any]]  # this request's input items, each with an "id"
    context: list[dict[str, Any]]  # the whole conversation after it: inherited + input + output


@dataclass(frozen=True, slots=True)
class UsageEntry:
    """One line of the usage (billing) ledger: the ``usage`` of a response's terminal event,
    at most one line per response id (docs/reliability.md, usage is billed exactly once)."""

    response_id: str
    owner: str
    model: str
    transport: Literal["websocket", "http"]
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    created_at: float


class StoreRefused(RuntimeError):
    """The store answered and refused this client (a wrong or missing credential, a denied
    command): a misconfiguration, not an outage that waiting cures."""


class WriteUnavailable(RuntimeError):
    """The store cannot take a write now, and a moment later it may: its shard has no
    primary (a failover under way), a connection to it was lost, or (``store.wait_replicas_policy:
    strict``) it has fewer replicas than ``store.wait_replicas``.  Retryable: every write is
    idempotent (docs/reliability.md, "The cluster store")."""


class ReadUnavailable(RuntimeError):
    """The store cannot answer a read now, and a moment later it may: a connection to it was
    lost or its shard has no primary (a failover under way).  Retryable; not "not found"."""


class Store(Protocol):
    async def put(self, record: StoredResponse, usage: UsageEntry | None = None) -> None:
        """Insert or replace the record and, atomically with it, add ``usage``'s ledger line
        unless its response already has one."""

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The record, or ``None`` if missing, deleted, or owned by someone else."""

    async def delete(self, response_id: str, owner: str) -> bool:
        """``True`` if a record of ``owner`` was deleted."""

    async def find_items(self, item_ids: Sequence[str], owner: str) -> dict[str, dict[str, Any]]:
        """The items of ``owner``'s stored responses with these ids (an input item or an
        output item of the response that first held it: :func:`new_item_ids`), as the
        conversation holds them; an id that is unknown, deleted or someone else's is left out."""

    async def add_usage(self, entries: Sequence[UsageEntry]) -> None:
        """Add the ledger lines atomically; a line whose response already has one is skipped."""

    async def usage(self, owner: str) -> list[UsageEntry]:
        """The ledger entries of ``owner``, oldest first."""

    async def probe(self) -> None:
        """Write one small health record (overwriting the last); raises if the store cannot
        be written.  The gateway's readiness check (serve/health.py)."""

    async def close(self) -> None: ...


class StoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["sqlite", "redis"] = Field(
        "sqlite", description="sqlite (embedded: a file in data_dir) | redis (multi-node clusters)"
    )
    data_dir: str = Field("data", description="sqlite: directory of responses.sqlite3 (created)")
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="redis: server URL; with redis_cluster, one or more nodes' URLs, comma-separated",
    )
    redis_cluster: bool = Field(False, description="redis: redis_url is a Redis Cluster (hash-tagged keys)")
    ledger_shards: int = Field(
        16,
        ge=1,
        le=1024,
        description="redis cluster: lists (hash slots) each owner's usage ledger is split into",
    )
    wait_replicas: int | None = Field(
        None,
        ge=0,
        description=(
            "redis: replicas that must acknowledge a record or ledger line (WAIT) before its terminal "
            "event is sent; None = 1 with redis_cluster, 0 on one server"
        ),
    )
    wait_timeout_ms: int = Field(1000, ge=1, description="redis: how long a write waits for wait_replicas")
    wait_replicas_policy: Literal["available", "strict"] = Field(
        "available",
        description=(
            "redis: a shard with fewer online replicas than wait_replicas (its replica lost, or a "
            "promoted primary without one): available = its writes wait for the replicas it has "
            "(logged, counted in responses_ws_store_degraded_writes); strict = they are refused "
            "(store_unavailable, retryable), as Redis's min-replicas-to-write refuses them"
        ),
    )
    write_retry_s: float = Field(
        5.0,
        ge=0,
        description=(
            "how long a write the store cannot take now (a shard without a primary during a "
            "failover, a lost connection) is retried before its response fails with "
            "store_unavailable"
        ),
    )
    redis_password_file: str | None = Field(
        None,
        description=(
            "redis: a file holding the server's password (``requirepass``), read where the store "
            "opens, on every node; ``~`` is that node's home (keeps the secret out of the config)"
        ),
    )
    key_prefix: str = Field("rws:", description="redis: prefix of every key")
    ledger: Literal["auto", "journal", "commit"] = Field(
        "auto",
        description=(
            "where a store:false response's ledger line is kept before its terminal event leaves: "
            "journal = the node's local journal file, committed write-behind; commit = committed "
            "to the store (lines waiting at once share one commit); auto = commit with redis, "
            "journal with sqlite (docs/reliability.md, usage is billed exactly once)"
        ),
    )

    @field_validator("key_prefix")
    @classmethod
    def _no_hash_tag(cls, prefix: str) -> str:
        if "{" in prefix or "}" in prefix:
            raise ValueError("key_prefix may not contain { or }: the store puts its own hash tags in keys")
        return prefix

    @property
    def replicas_to_wait(self) -> int:
        """``wait_replicas`` resolved: one replica on a cluster, none on one server."""
        if self.wait_replicas is not None:
            return self.wait_replicas
        return 1 if self.redis_cluster else 0

    @property
    def ledger_mode(self) -> Literal["journal", "commit"]:
        """``ledger`` resolved: ``auto`` commits to a cluster store (Redis), journals with SQLite."""
        if self.ledger != "auto":
            return self.ledger
        return "commit" if self.backend == "redis" else "journal"

    @property
    def journal_dir(self) -> Path:
        """Where a node's processes keep their ledger journals (store/journal.py): local disk,
        whichever the backend."""
        return Path(self.data_dir) / "ledger-journal"


def new_item_ids(record: StoredResponse) -> list[str]:
    """The ids of the items ``record``'s response added to its conversation, its input and
    its output: what an ``item_reference`` may name (docs/protocol.md §2.2)."""
    ids = [item["id"] for item in record.input_items if isinstance(item.get("id"), str)]
    ids += [item["id"] for item in record.response.get("output") or () if isinstance(item.get("id"), str)]
    return ids


def item_in(record: StoredResponse, item_id: str) -> dict[str, Any] | None:
    """The item ``item_id`` as ``record``'s conversation holds it (the last with that id)."""
    for item in reversed(record.context):
        if item.get("id") == item_id and item.get("type") != "item_reference":
            return item
    return None


def encode_body(record: StoredResponse) -> str:
    """The JSON ``body`` both backends keep: ``{response, input_items, context}``.

    ASCII-escaped on purpose: a lone surrogate from a client's ``"\\ud800"`` escape survives
    (it could not be encoded as UTF-8 text for SQLite or Redis otherwise).
    """
    return json.dumps(
        {"response": record.response, "input_items": record.input_items, "context": record.context},
        separators=(",", ":"),
    )


def decode_record(response_id: str, owner: str, created_at: float, body: str) -> StoredResponse:
    """The inverse of :func:`encode_body`, given the columns kept beside the body."""
    data = json.loads(body)
    return StoredResponse(
        id=response_id,
        owner=owner,
        created_at=created_at,
        response=data["response"],
        input_items=data["input_items"],
        context=data["context"],
    )
