"""Prompt-cache breakpoints placed as a client places them, and the cache figures a
response's ``usage`` reports (docs/emulator.md, "Prompt caching by breakpoints").

A client marks the end of what it will resend unchanged: the first input block after the
instructions and tools (the task message; with a resumed history, the history's first
item), and the last tool output of each turn, so the next turn reads the conversation up to
it.  An item's last content part carries the mark; a string content or output becomes one
``input_text`` part first.
"""

from __future__ import annotations

from typing import Any


def marked(item: dict[str, Any], ttl: str | None = None) -> dict[str, Any]:
    """``item`` with a ``prompt_cache_breakpoint`` on its last content part (a copy); an item
    without content (a function call) is returned as it is."""
    key = "content" if "content" in item else "output" if item.get("type") == "function_call_output" else None
    if key is None:
        return item
    parts = item[key]
    parts = [{"type": "input_text", "text": parts}] if isinstance(parts, str) else [dict(p) for p in parts]
    if not parts or parts[-1].get("type") not in ("input_text", "input_image", "input_file"):
        return item
    parts[-1]["prompt_cache_breakpoint"] = {"mode": "explicit", **({"ttl": ttl} if ttl else {})}
    return {**item, key: parts}


def place(
    items: list[dict[str, Any]], *, first: bool, ttl: str | None = None, resumed: int = 0
) -> list[dict[str, Any]]:
    """A turn's new items with a client's breakpoints: on the first item of a rollout's
    first turn (``first``, with ``ttl``), at the end of a resumed history of ``resumed``
    items (where its prewarm wrote), and on the turn's last tool output."""
    out = list(items)
    if first and out:
        out[0] = marked(out[0], ttl)
    if resumed:
        out[resumed - 1] = marked(out[resumed - 1])
    for i in range(len(out) - 1, -1, -1):
        if out[i].get("type") == "function_call_output":
            out[i] = marked(out[i])
            break
    return out


def figures(usage: dict[str, Any]) -> tuple[int, int, int]:
    """(cached, written 30m, written 12h) from a ``usage``: the writes by lifetime where
    reported (the breakpoint rule), else all of ``cache_write_tokens`` as 30m (the block
    rule reports no lifetime)."""
    details = usage.get("input_tokens_details") or {}
    ttl = details.get("cache_write_tokens_details")
    if ttl:
        return details.get("cached_tokens", 0), ttl.get("ttl_30m_tokens", 0), ttl.get("ttl_12h_tokens", 0)
    return details.get("cached_tokens", 0), details.get("cache_write_tokens", 0), 0
