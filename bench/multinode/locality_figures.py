"""What the prefix-locality experiment (``bench.multinode.locality``) counts, from the turns
its clients saw (pure): how the sessions' pins spread over the replicas, which sessions
changed replica across a replica-set change and which had to (their replica was removed),
and whether each turn's ``cached_tokens`` is what the replica it ran on can hold."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# The hosted API's prompt-caching rule, as a client knows it (docs/emulator.md): a prompt
# prefix is cached from 1024 tokens on, and hits are reported in steps of 128 tokens.
CACHE_MIN_TOKENS = 1024
CACHE_STEP_TOKENS = 128


def reported_cached_tokens(reused_tokens: int) -> int:
    """``cached_tokens`` for ``reused_tokens`` of a reused prefix, by that rule."""
    stepped = reused_tokens // CACHE_STEP_TOKENS * CACHE_STEP_TOKENS
    return stepped if stepped >= CACHE_MIN_TOKENS else 0


@dataclass(frozen=True, slots=True)
class Turn:
    """One completed turn of a session: the replica that served it (from the store), its
    usage, and when it completed (monotonic seconds)."""

    replica: str
    input_tokens: int
    cached_tokens: int
    at: float = 0.0


def pins_per_replica(pins: Mapping[str, str], replicas: Iterable[str]) -> dict[str, int]:
    """Sessions pinned to each live replica (those with none included), session → replica."""
    counts = Counter(pins.values())
    return {r: counts.get(r, 0) for r in sorted(set(replicas))}


def imbalance(counts: Mapping[str, int]) -> float:
    """The fullest replica's sessions over the mean (1.0: perfectly even)."""
    if not counts or not sum(counts.values()):
        return 0.0
    return max(counts.values()) / (sum(counts.values()) / len(counts))


@dataclass(frozen=True, slots=True)
class Moves:
    """Across one change of the replica set: the sessions that changed replica and those whose
    replica was removed (they must move); ``minimum`` is k/n, the share a perfectly even
    spread loses when k of n replicas go (0 when none does)."""

    sessions: int
    moved: frozenset[str]
    forced: frozenset[str]
    minimum: float

    @property
    def moved_share(self) -> float:
        return len(self.moved) / self.sessions if self.sessions else 0.0

    @property
    def forced_share(self) -> float:
        return len(self.forced) / self.sessions if self.sessions else 0.0

    @property
    def unforced(self) -> frozenset[str]:
        """Sessions that moved although their replica stayed."""
        return self.moved - self.forced


def moves(
    before: Mapping[str, str],
    after: Mapping[str, Sequence[str]],
    replicas_before: Iterable[str],
    replicas_after: Iterable[str],
) -> Moves:
    """``before``: session → its replica before the change; ``after``: session → the replicas
    of its turns from the change on (a session counts as moved if any differs)."""
    old, new = set(replicas_before), set(replicas_after)
    sessions = set(before)
    moved = {s for s in sessions if any(r != before[s] for r in after.get(s, ()))}
    forced = {s for s in sessions if before[s] not in new}
    removed = len(old - new)
    return Moves(len(sessions), frozenset(moved), frozenset(forced), removed / len(old) if old else 0.0)


@dataclass(frozen=True, slots=True)
class CachedCheck:
    """One turn's ``cached_tokens`` against what its replica can hold: ``kind`` is ``first``
    (the conversation's first turn), ``kept`` (same replica as the turn before: expect at least
    the previous prompt, in the reporting rule's 128-token steps), ``moved`` (a replica that
    never served this conversation: expect 0, as no other conversation shares its prefix) or
    ``returned`` (a replica that served it before, not last: at most the prompt)."""

    kind: str
    cached: int
    expected: int  # kept: the least; first and moved: exactly; returned: the most
    ok: bool

    @property
    def share(self) -> float | None:
        """cached over the expected prefix (kept turns; None where nothing is expected)."""
        return self.cached / self.expected if self.kind == "kept" and self.expected else None


def check_cached(turns: Sequence[Turn]) -> list[CachedCheck]:
    """Each turn of one session's chain, checked (see :class:`CachedCheck`).  Every kind also
    checks that ``cached_tokens`` stays below the prompt (the last token is always computed)."""
    out: list[CachedCheck] = []
    served: set[str] = set()
    for i, t in enumerate(turns):
        below_prompt = t.cached_tokens <= max(0, t.input_tokens - 1)
        if i == 0:
            out.append(CachedCheck("first", t.cached_tokens, 0, t.cached_tokens == 0))
        elif t.replica == turns[i - 1].replica:
            least = reported_cached_tokens(turns[i - 1].input_tokens)
            out.append(CachedCheck("kept", t.cached_tokens, least, below_prompt and t.cached_tokens >= least))
        elif t.replica not in served:
            out.append(CachedCheck("moved", t.cached_tokens, 0, t.cached_tokens == 0))
        else:
            out.append(CachedCheck("returned", t.cached_tokens, t.input_tokens - 1, below_prompt))
        served.add(t.replica)
    return out
