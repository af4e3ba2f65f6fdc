"""The inference seam: what a session host needs from a model backend.

:class:`InferenceClient` is the whole contract — one streaming call per model call, yielding
chunks of :mod:`inference.types` events (closing the stream cancels the call), and a warm-up
that lists the models.  A backend implements it in a module of its own beside this one
(:mod:`.ray_serve`: the emulator's Serve deployment).  A backend's ``before_call`` is the one
hook the connection awaits before each of its calls (:class:`BeforeCall`, given the
:class:`ModelCall`; the opt-in what-if services, :mod:`actors.backend.whatif_hook`).  Unit
tests put the shipped fake behind the protocol (:mod:`.canned`, ``CannedClient``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from inference.types import InferenceEvent, InferenceRequest

from ..core.timings import PhaseTimer
from ..core.turn import Turn


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model call as a hook before it sees it: the request, the response's timer, and
    how much of the conversation (the prompt after its tools and instructions) is new."""

    request: InferenceRequest
    timer: PhaseTimer
    conversation_tokens: int
    unread_tokens: int  # at the conversation's end, the tokens no earlier model call read

    @classmethod
    def of(cls, turn: Turn) -> ModelCall:
        """The turn's next call: a resumed rollout's (append mode) continues the calls before
        it; a first call continues its parent, whose latest output no call has read."""
        conversation = len(turn.request.prompt_token_ids) - turn.prefix_len
        if turn.rollout is not None:
            unread = turn.rollout.context.fresh_tokens
        else:
            unread = (turn.parent.fresh_tokens if turn.parent is not None else 0) + len(turn.input_tokens)
        return cls(turn.request, turn.timer, conversation, unread)


class BeforeCall(Protocol):
    """Runs before each model call, timed as phases of ``call.timer`` (``PhaseTimer.service``)."""

    async def __call__(self, call: ModelCall) -> None: ...


class EventStream(Protocol):
    """One model call's chunks of events; ``aclose`` ends the call early (an async generator
    is one)."""

    def __aiter__(self) -> AsyncIterator[list[InferenceEvent]]: ...

    async def __anext__(self) -> list[InferenceEvent]: ...

    async def aclose(self) -> None: ...


class InferenceClient(Protocol):
    """A model backend as a session host calls it."""

    # Awaited before each model call; None: nothing runs before the calls.
    before_call: BeforeCall | None

    async def warm(self) -> list[str]:
        """Pay the backend's first-call costs before any client does; the model ids served."""
        ...

    def check_metadata(self, metadata: Mapping[str, str]) -> None:
        """Refuse a create whose ``metadata`` sets this backend's own knobs to values it
        cannot take (an :class:`~actors.errors.InvalidRequest`, sent as a 400 before
        anything is queued); the session is given this check (``Session(check_metadata=)``)."""
        ...

    def stream(self, request: InferenceRequest) -> EventStream:
        """One model call, as chunks of events ending with ``Done``.  Closing the iterator
        early cancels the call and frees what it holds in the backend.  A backend may start
        the call when this is called, before the iterator is read (a direct channel writes
        its request then, :mod:`.direct`): the caller closes the iterator even if it never
        reads it."""
        ...
