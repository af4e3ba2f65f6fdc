"""Per-response server-side time by phase (milliseconds), with an injected clock.

Phases: ``parse_validate``, ``history_load``, ``render``, ``classify``,
``model_resolution``, ``post`` (API work), and ``queue``, ``prefill``, ``decode``
(inference, as the emulated model reports them); and the calls a hook makes before each
model call (:meth:`PhaseTimer.service`, e.g. the what-if services' ``hop`` and
``safety_model``, docs/whatif.md), which count as API work.  ``api_overhead`` is the
response's time on the server (from its frame or request to its terminal event) less the
model's own time (queue + prefill + decode): what a client waits for outside the model, as
far as the server can see it — ``backend`` is the model call's own cost beyond the model's
time (the hop to the inference replica and back), ``other`` what no phase accounts for
(the event loop, encoding and writing the earlier frames).  The terminal frame's own
encoding, compression and write come after the figures it carries (docs/performance.md).  A client asks for the numbers with
``metadata={"responses_ws.timings": "1"}`` and reads them, as a JSON string, from the
terminal response's ``metadata["responses_ws.timings"]``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

METADATA_KEY = "responses_ws.timings"
API_PHASES = ("parse_validate", "history_load", "render", "classify", "model_resolution", "post")
INFERENCE_PHASES = ("queue", "prefill", "decode")


class PhaseTimer:
    __slots__ = ("_perf", "_waiting_since", "inference_wait_ms", "ms", "started")

    def __init__(self, perf: Callable[[], float]) -> None:
        self._perf = perf
        self.ms: dict[str, float] = dict.fromkeys(API_PHASES + INFERENCE_PHASES, 0.0)
        self.started = perf()
        self._waiting_since: float | None = None
        self.inference_wait_ms = 0.0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = self._perf()
        try:
            yield
        finally:
            self.ms[name] += (self._perf() - t) * 1000.0

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

    def restart(self) -> None:
        """A queued request starts now: time spent queued behind its lane is not overhead."""
        spent = sum(self.ms[p] for p in API_PHASES)
        self.started = self._perf() - spent / 1000.0

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
        return out


def as_metadata(report: dict[str, float]) -> dict[str, str]:
    return {METADATA_KEY: json.dumps(report, separators=(",", ":"))}
