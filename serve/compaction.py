"""``POST /v1/responses/compact``: shrink a conversation into a new input window
(docs/protocol.md §6.7).

The emulated compaction is :func:`actors.core.compaction.compact` — the same one
server-side compaction (``context_management``) runs inside a response: every user message
kept verbatim, everything else replaced by one ``compaction`` item carrying an extractive
summary.  Sending the output back as ``input`` starts a new chain; the renderer decodes the
summary, so the model sees it (``actors.core.render.compaction_text``).
"""

from __future__ import annotations

from actors.core.compaction import EXCERPT, compact

__all__ = ["EXCERPT", "compact"]
