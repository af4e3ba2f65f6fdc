"""``item_reference`` input items resolved to the items they name (docs/protocol.md §2.2).

A reference names an item of an earlier response by its id: an input item or an output item.
It is replaced by that item, as the conversation that held it has it, before anything else
looks at the input, so the model, the pairing of tool outputs with their calls, the stored
input and the token counts all see the item itself, on every transport.  Where the item is
looked for: the request's parent conversation and every conversation the connection caches
(its lanes' latest responses, ``store:false`` ones included), then the store (``store:true``
responses of the same API key, any connection or transport).  An id found nowhere is a 400
(:class:`ItemNotFound`).  Pure: the session asks its driver for the store's part.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import InvalidRequest
from ..protocol import InputItem, ItemReference, parse_items


class ItemNotFound(InvalidRequest):
    code = "item_not_found"

    def __init__(self, item_id: str, index: int, *, connection_only: bool = False) -> None:
        where = (
            "Input for a running response can reference only items of responses this connection still holds"
            if connection_only
            else "Only items of stored responses (store: true) and of responses this connection "
            "still holds can be referenced"
        )
        super().__init__(
            f"Item with id '{item_id}' not found. {where}; send the item itself instead.",
            param=f"input[{index}]",
        )


def referenced(items: Sequence[InputItem]) -> list[str]:
    """The ids the input's references name, in order (empty: nothing to resolve)."""
    return [item.id for item in items if isinstance(item, ItemReference)]


def find(ids: Iterable[str], conversations: Iterable[Sequence[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The items with these ids in ``conversations`` (stored item dicts), the first found
    of each id (a reference kept as sent by an older version is not an item)."""
    wanted = set(ids)
    found: dict[str, dict[str, Any]] = {}
    for conversation in conversations:
        if not wanted:
            break
        for item in reversed(conversation):
            item_id = item.get("id")
            if item_id in wanted and item.get("type") != "item_reference":
                found[item_id] = item
                wanted.discard(item_id)
    return found


def resolve(
    items: Sequence[InputItem], found: Mapping[str, dict[str, Any]], *, connection_only: bool = False
) -> list[InputItem]:
    """``items`` with every reference replaced by the item it names; :class:`ItemNotFound`
    for the first one ``found`` lacks (``connection_only``: the store was not asked)."""
    out: list[InputItem] = []
    for i, item in enumerate(items):
        if not isinstance(item, ItemReference):
            out.append(item)
            continue
        target = found.get(item.id)
        if target is None:
            raise ItemNotFound(item.id, i, connection_only=connection_only)
        out.extend(parse_items([target]))
    return out
