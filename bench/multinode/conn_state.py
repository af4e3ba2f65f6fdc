"""A resumable connection's state as the cluster store keeps it (resume on, the Redis store),
read with its resume token: the sealed snapshot with its change log applied, as a claim
does (store/continuity.py).  The tests and the benchmarks read which inference replica
served a connection's latest response from it."""

from __future__ import annotations

import json
from typing import Any

import redis

from store.continuity import unseal
from store.splice import Splice, apply


def conn_key(conn_id: str, key_prefix: str) -> str:
    """The connection's hash in the store (``ContinuityStore.key``: hash-tagged, one slot)."""
    return f"{key_prefix}conn:{{{conn_id}}}"


def conn_state(store: redis.Redis, token: str, key_prefix: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The connection's hash in the store (its change log under ``"log"``), and its state: the
    snapshot unsealed with the token's secret, then each logged change applied in order."""
    _, conn_id, secret = token.split(".", 2)
    key = conn_key(conn_id, key_prefix)
    # A client made with ``decode_responses=True`` answers str.
    fields: dict[str, str] = {str(k): str(v) for k, v in store.hgetall(key).items()}
    log = [str(entry) for entry in store.lrange(key + ":log", 0, -1)]
    fields["log"] = "\n".join(log)
    if not fields.get("blob"):
        return fields, {}
    state = bytearray(unseal(secret, conn_id, fields["blob"]))
    for position, entry in enumerate(log, 1):
        apply(state, Splice.decode(unseal(secret, conn_id, entry, position)))
    return fields, json.loads(bytes(state))


def serving_replica(store: redis.Redis, token: str, key_prefix: str, response_id: str) -> str | None:
    """The inference replica that served ``response_id``, the latest response of one of the
    connection's lanes (None: no lane's latest is that response)."""
    _, state = conn_state(store, token, key_prefix)
    for lane in state.get("lanes", []):
        if lane.get("id") == response_id:
            return lane.get("replica") or None
    return None
