"""The shapes of the runner's own workloads besides the Codex-like loop: the ``chains``
workload's (:class:`Chains`: bench/runner/chains.py) and the ``resume`` workload's
(:class:`Resume`: bench/runner/resume.py).  Pure data, checked when made."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Chains:
    """The ``chains`` workload (bench/runner/chains.py): each loop runs ``store:false`` chains
    of ``turns_per_chain`` short turns (``max_tokens`` each, ``think_s`` between them), one
    connection a chain, a new one ``reconnect_s`` after a close, until the run ends.  With
    ``resend_history`` a loop is Codex: one conversation across its connections, every turn
    resending all of it with a ``prompt_cache_key`` (a >1024-token prefix first), a turn left
    without ``response.completed`` sent again on the next connection, and after
    ``server_shutting_down`` it waits for the server's close.  ``ping_interval_s``: the
    connections' keepalive (None: no pings); ``compression``: ``"deflate"`` negotiates
    permessage-deflate.

    ``store_share`` of the turns are ``store:true`` (drawn per turn, seeded by the loop);
    ``text_tokens`` (least, most): each turn asks the emulated model for that many output
    tokens, drawn per turn, and no tool call (``reasoning_tokens``: that many hidden
    reasoning tokens before them); ``think_s`` varies by ``think_spread`` either
    way.  ``chains_per_connection``: a connection's chains before the loop opens another.
    With ``continue_stored`` a new connection continues the last completed response when it
    was stored (a ``store:false`` one dies with its connection), and a turn that failed starts
    a new chain on the same connection; with ``resend_unstarted`` as well the loop follows
    docs/reliability.md across a drain: a create that got no ``response.created`` (its
    connection ended under it, or it was answered ``server_shutting_down``) is sent again on
    the next connection (its record ``resent``), and after ``server_shutting_down`` it waits
    for the server's close, at most ``close_wait_s`` when given (longer: its connection's
    ``left_open``; ``resend_history`` waits the same way).

    Over ``http-full`` (no connection of its own) each turn is a streamed ``POST`` of its
    own, without ``previous_response_id``; a turn whose request failed is recorded with the
    error ``http_error:<type>`` and the next sent ``reconnect_s`` later."""

    turns_per_chain: int = 4
    think_s: float = 0.2
    max_tokens: int | None = None
    reconnect_s: float = 0.2
    ping_interval_s: float | None = 5.0
    resend_history: bool = False
    model: str = "emu-fast"
    store_share: float = 0.0
    text_tokens: tuple[int, int] | None = None
    think_spread: float = 0.0
    continue_stored: bool = False
    resend_unstarted: bool = False
    chains_per_connection: int = 1
    close_wait_s: float | None = None
    compression: str | None = None
    reasoning_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.reasoning_tokens is not None and self.text_tokens is None:
            raise ValueError("Chains.reasoning_tokens shapes the emulated model's answer: with text_tokens")
        if not 0.0 <= self.store_share <= 1.0:
            raise ValueError(f"Chains.store_share is a share, 0 to 1, not {self.store_share}")
        if self.text_tokens is not None and not 0 < self.text_tokens[0] <= self.text_tokens[1]:
            raise ValueError(
                f"Chains.text_tokens is (least, most), 0 < least <= most, not {self.text_tokens}"
            )
        if not 0.0 <= self.think_spread < 1.0:
            raise ValueError(f"Chains.think_spread is a share of think_s below 1, not {self.think_spread}")
        if self.continue_stored and self.resend_history:
            raise ValueError("Chains.continue_stored chains by previous_response_id: not with resend_history")
        if self.resend_unstarted and not self.continue_stored:
            raise ValueError("Chains.resend_unstarted resends a chain's create: with continue_stored")
        if self.chains_per_connection < 1 or self.turns_per_chain < 1:
            raise ValueError("Chains.turns_per_chain and chains_per_connection must be at least 1")


@dataclass(frozen=True)
class Resume:
    """The ``resume`` workload (bench/runner/resume.py): each loop one ``store:false`` chain on
    one session, then done.  Its first create (``first_input``; ``{loop}`` in it is the loop's
    index) is not timed; then ``resumes`` times: ``steady`` turns on the open connection, the
    connection dropped (a TCP abort, no close frame: a lost network), ``pause_s`` later a new
    one opened with the session's resume token (the upgrade answer's ``header``) and the next
    turn sent on it (kind ``resume``, its ``connect_ms`` the reconnect's handshake); then
    ``steady`` more turns.  Later inputs are ``next_input`` (``{turn}``: the turn's number);
    ``text_tokens`` output tokens a turn, no tool call (with ``seeded`` the emulated model's
    seed is the loop's index).  A turn that does not complete ends its loop (the result's
    ``errors``).

    With ``steps`` the loops take no turn by themselves: each opens its session at the
    release and the driver steps them all at once (:class:`~bench.runner.drive.LoadRun`'s
    ``turns``, ``resume``, ``go`` and ``halt``: turns in lockstep, a resume each at a target
    chosen by the node its connection is on, turns ``think_s`` apart until halted).
    ``inspect`` (picklable, blocking: it runs in a thread of the client process) is asked
    after each completed turn, with the session's resume token and the response's id, for a
    note its record keeps (``TurnRecord.note``: e.g. the replica that served it, as the
    session's state in the store says)."""

    resumes: int = 12
    steady: int = 2
    first_input: str = "go"
    next_input: str = "step {turn}: go on"
    text_tokens: int | None = None
    model: str = "emu-fast"
    header: str = "x-responses-ws-resume-token"
    pause_s: float = 0.05
    compression: str | None = None
    seeded: bool = False
    steps: bool = False
    inspect: Callable[[str, str], str | None] | None = None

    def __post_init__(self) -> None:
        if self.resumes < 0 or self.steady < 0:
            raise ValueError("Resume.resumes and steady must be at least 0")


ROLLOUT_TRANSPORTS = ("ws", "append", "http-chained", "http-full")


@dataclass(frozen=True)
class Rollouts:
    """The ``rollouts`` workload (bench/runner/agent.py): the agentloop kind's rollouts, side by
    side.  Rollouts ``first`` to ``first + count - 1`` of the spec's workload, each on every
    one of ``transports``, queued transport by transport within each rollout (``ws#0,
    http-chained#0, http-full#0, ws#1, …``: :meth:`jobs`) and taken in that order by the
    spec's ``loops`` (that many rollouts at once), so drift and load hit every transport alike.
    Rollout ``r`` is the same on every transport: task, model script, tool outputs, tool times.
    Each rollout opens a connection (an HTTP client) of its own inside its measured time.

    ``api_key``: each transport's key, ``{transport}`` in it replaced by its name (each its own
    prefix-cache scope).  ``warmup``: before the release, one short rollout per transport (two
    tool rounds, no resumed history), one after another, its turns not recorded, then
    ``settle_s``.  A workload with a resumed history has each rollout's history put in the
    prefix cache under its transport's key just before it runs (a ``generate:false`` create on a
    connection of its own, outside the rollout's time)."""

    transports: tuple[str, ...] = ("ws", "http-chained", "http-full")
    count: int = 1
    first: int = 0
    api_key: str = "sk-bench-{transport}"
    warmup: bool = False
    settle_s: float = 3.0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.transports) - set(ROLLOUT_TRANSPORTS))
        if unknown or not self.transports:
            raise ValueError(f"unknown transports {unknown}; known: {sorted(ROLLOUT_TRANSPORTS)}")
        if self.count < 0:
            raise ValueError(f"Rollouts.count must be at least 0, not {self.count}")

    def jobs(self) -> list[tuple[str, int]]:
        """(transport, rollout) in the order the loops take them."""
        return [(t, r) for r in range(self.first, self.first + self.count) for t in self.transports]

    def key(self, transport: str) -> str:
        return self.api_key.format(transport=transport)
