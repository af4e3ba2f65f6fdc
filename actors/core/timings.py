"""Per-response server-side time by phase (milliseconds), with an injected clock.

API phases (``parse_validate``, ``history_load``, ``render``, ``classify``,
``model_resolution``, ``post``, and a hook's calls before each model call,
:meth:`PhaseTimer.service`), the model's (``queue``, ``prefill``, ``decode``), and
``api_overhead`` (the response's time on the server less the model's), ``backend`` and
``other``; on a session host also ``loop_lag``, the longest its event loop kept ready work
waiting while the response was on the server (:mod:`actors.core.loop_lag`), not a phase and
not in the sums: what each covers, where the clock starts and stops (:meth:`Report.restamp`),
and how a client asks for them is docs/performance.md, "Timings users can see".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType

METADATA_KEY = "responses_ws.timings"
API_PHASES = ("parse_validate", "history_load", "render", "classify", "model_resolution", "post")
INFERENCE_PHASES = ("queue", "prefill", "decode")


class PhaseTimer:
    __slots__ = (
        "_api",
        "_lag",
        "_model",
        "_perf",
        "_queued_at",
        "_waiting_since",
        "inference_wait_ms",
        "ms",
        "started",
    )

    def __init__(
        self,
        perf: Callable[[], float],
        started: float | None = None,
        lag: Callable[[float], float] | None = None,
    ) -> None:
        """``started``: when the request reached the server, on ``perf``'s clock (now if not
        given).  ``lag``: the event loop's worst stall (s) since a time on ``perf``'s clock
        (:meth:`actors.core.loop_lag.LoopLag.worst_since`), reported as ``loop_lag``."""
        self._perf = perf
        self._lag = lag
        self.ms: dict[str, float] = dict.fromkeys(API_PHASES + INFERENCE_PHASES, 0.0)
        self.started = perf() if started is None else started
        self._waiting_since: float | None = None
        self._queued_at: float | None = None
        self.inference_wait_ms = 0.0
        self._api = self._model = 0.0  # of the last report: what again() keeps

    def phase(self, name: str) -> _Phase:
        """``with timer.phase(name):`` adds the block's time to ``name`` (a few phases a
        turn: an object with two slots, not a generator-based context manager)."""
        return _Phase(self, name)

    @contextmanager
    def service(self, name: str) -> Iterator[None]:
        """A call before the model call (:class:`~actors.backend.BeforeCall`), made while the
        response waits for inference: it is API work, not inference time; reported only once
        made."""
        t = self._perf()
        try:
            yield
        finally:
            ms = (self._perf() - t) * 1000.0
            self.ms[name] = self.ms.get(name, 0.0) + ms
            self.inference_wait_ms -= ms

    def queued(self) -> None:
        self._queued_at = self._perf()

    def restart(self) -> None:
        """A queued request starts now: the time it spent queued behind its lane is not overhead."""
        if self._queued_at is not None:
            self.started += self._perf() - self._queued_at
            self._queued_at = None

    def wait_inference(self) -> None:
        self._waiting_since = self._perf()

    def inference_done(self) -> None:
        if self._waiting_since is not None:
            self.inference_wait_ms += (self._perf() - self._waiting_since) * 1000.0
            self._waiting_since = None

    def report(self, queue_ms: float, prefill_ms: float, decode_ms: float) -> dict[str, float]:
        self.ms.update(queue=queue_ms, prefill=prefill_ms, decode=decode_ms)
        total = (self._perf() - self.started) * 1000.0
        model = queue_ms + prefill_ms + decode_ms
        overhead = max(0.0, total - model)
        backend = max(0.0, self.inference_wait_ms - model)
        out = {k: round(v, 3) for k, v in self.ms.items()}
        out["backend"] = round(backend, 3)
        out["api_overhead"] = round(overhead, 3)
        api = sum(v for k, v in self.ms.items() if k not in INFERENCE_PHASES) + backend  # services too
        out["other"] = round(max(0.0, overhead - api), 3)
        self._api, self._model = api, model
        if self._lag is not None:
            out["loop_lag"] = round(self._lag(self.started) * 1000.0, 3)
        return out

    def again(self, last: dict[str, float]) -> dict[str, float]:
        """This timer's ``last`` :meth:`report` taken again now, once its phases are over (a
        finished response's): only what runs to now changes — ``api_overhead``, ``other``,
        ``loop_lag``."""
        overhead = max(0.0, (self._perf() - self.started) * 1000.0 - self._model)
        out = dict(last)
        out["api_overhead"] = round(overhead, 3)
        out["other"] = round(max(0.0, overhead - self._api), 3)
        if self._lag is not None:
            out["loop_lag"] = round(self._lag(self.started) * 1000.0, 3)
        return out


class _Phase:
    __slots__ = ("_at", "_name", "_timer")

    def __init__(self, timer: PhaseTimer, name: str) -> None:
        self._timer = timer
        self._name = name

    def __enter__(self) -> None:
        self._at = self._timer._perf()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        timer = self._timer
        timer.ms[self._name] += (timer._perf() - self._at) * 1000.0


@dataclass(slots=True)
class Report:
    """A finished response's figures (``ms``), taken when it finished and once more by
    :meth:`restamp`, just before its terminal event is encoded.  ``into`` is the terminal
    response's metadata when the client asked for the figures there; ``final`` once they may
    not change (a stored response's record holds them as sent)."""

    response_id: str
    ms: dict[str, float]
    timer: PhaseTimer
    model_ms: tuple[float, float, float]  # queue, prefill, decode
    into: dict[str, str] | None
    final: bool

    @classmethod
    def at_finish(
        cls, response_id: str, timer: PhaseTimer, model_ms: tuple[float, float, float], *, final: bool
    ) -> Report:
        return cls(response_id, timer.report(*model_ms), timer, model_ms, None, final)

    def restamp(self) -> dict[str, float]:
        """The figures taken again now (unless final): the terminal event is about to be
        encoded, so they include building and queueing it and writing the frames before it."""
        if not self.final:
            self.final = True
            self.ms = self.timer.again(self.ms)
            if self.into is not None:
                self.into.update(as_metadata(self.ms))
        return self.ms


_COMPACT = json.JSONEncoder(separators=(",", ":")).encode  # made once: json.dumps makes one a call


def as_metadata(report: dict[str, float]) -> dict[str, str]:
    return {METADATA_KEY: _COMPACT(report)}
