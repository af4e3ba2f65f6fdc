"""A resumable connection's state as the cluster store keeps it, read with its resume token
(the Redis store, resume on): the sealed snapshot with its change log applied in order, as a
claim does.  A public, read-only view for operators and outside tools (docs/reliability.md,
"Resuming on any node"); it never writes, so reading does not claim or fence the connection."""

from __future__ import annotations

import json
from typing import Any, Protocol

from .connection_states import conn_key, restore


class RedisReader(Protocol):
    """What of a redis-py client (standalone or cluster) the reader uses."""

    def hgetall(self, name: str) -> Any: ...
    def lrange(self, name: str, start: int, end: int) -> Any: ...


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_state(store: RedisReader, token: str, key_prefix: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The connection's hash (its change log joined under ``"log"``) and its state: the
    snapshot unsealed with the token's secret, then each logged change applied in order
    (``{}`` while no snapshot is written)."""
    _, conn_id, secret = token.split(".", 2)
    key = conn_key(conn_id, key_prefix)
    fields = {_text(k): _text(v) for k, v in store.hgetall(key).items()}
    log = [_text(entry) for entry in store.lrange(key + ":log", 0, -1)]
    fields["log"] = "\n".join(log)
    if not fields.get("blob"):
        return fields, {}
    return fields, json.loads(bytes(restore(secret, conn_id, fields["blob"], log)))


def serving_replica(store: RedisReader, token: str, key_prefix: str, response_id: str) -> str | None:
    """The inference replica that served ``response_id``, the latest response of one of the
    connection's lanes (None: no lane's latest is that response)."""
    _, state = read_state(store, token, key_prefix)
    for lane in state.get("lanes", []):
        if lane.get("id") == response_id:
            return lane.get("replica") or None
    return None
