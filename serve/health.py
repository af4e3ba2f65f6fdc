"""Liveness and readiness of a gateway replica (docs/operations.md, Health).

- ``GET /healthz`` — the process is alive and its listener accepts (always 200 when answered).
- ``GET /readyz`` — ready for traffic: 200 when every check passes, else 503; the JSON body
  names every check and the reason of each failed one.  Serve's ``check_health`` runs the
  same checks and fails on those a restart can cure, and on a dependency that refuses the
  replica (a wrong store credential: :meth:`Readiness.raise_unless_healthy`).

The checks, each bounded by ``timeout_s``: ``listener`` (accepting connections),
``draining`` (not shutting down), ``inference`` (the inference deployment answers) and
``store`` (a small write to the response store succeeds).  What they look at is behind the
:class:`Probes` seam: the gateway implements it, unit tests use fakes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from store import StoreRefused

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 2.0
LOCAL = ("listener",)  # the checks a restart of the replica can cure
# The failures that are this replica's configuration, not an outage: the dependency answered
# and refused it (store.StoreRefused: a wrong or missing credential).  Waiting cures nothing.
REFUSED_PREFIX = "refused: "


@dataclass(frozen=True, slots=True)
class Probes:
    """What readiness looks at (the gateway's state and its two dependencies)."""

    listening: Callable[[], bool]  # the listener task still accepts connections
    draining: Callable[[], bool | str]  # the replica is shutting down (a string: why)
    inference: Callable[[], Awaitable[Any]]  # completes once the inference deployment answered
    store: Callable[[], Awaitable[Any]]  # completes once a small store write succeeded (Store.probe)


@dataclass(frozen=True, slots=True)
class ReadinessReport:
    """The outcome of one round of checks: ``checks`` maps every check to ``"ok"`` or why
    it failed."""

    checks: dict[str, str]
    failed: list[str] = field(default_factory=list)

    @property
    def refused(self) -> list[str]:
        """The failed checks whose dependency refused this replica (:data:`REFUSED_PREFIX`)."""
        return [name for name in self.failed if self.checks[name].startswith(REFUSED_PREFIX)]

    @property
    def ready(self) -> bool:
        return not self.failed

    def body(self) -> dict[str, Any]:
        return {
            "status": "ready" if self.ready else "not_ready",
            "failed": self.failed,
            "checks": self.checks,
        }


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    reason = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return REFUSED_PREFIX + reason if isinstance(exc, StoreRefused) else reason


class Readiness:
    def __init__(self, probes: Probes, *, timeout_s: float = CHECK_TIMEOUT_S) -> None:
        self._probes = probes
        self._timeout_s = timeout_s
        self._last_failed: tuple[str, ...] = ()

    async def _bounded(self, probe: Callable[[], Awaitable[Any]]) -> str:
        try:
            async with asyncio.timeout(self._timeout_s):
                await probe()
        except TimeoutError:
            return f"no answer within {self._timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 - any failure is a failed check, named in the report
            return _reason(exc)
        return "ok"

    async def check(self, *, include_draining: bool = True) -> ReadinessReport:
        """Run every check (the two remote ones concurrently)."""
        checks = {"listener": "ok" if self._probes.listening() else "not accepting connections"}
        if include_draining:
            why = self._probes.draining()
            checks["draining"] = (
                f"draining: {why if isinstance(why, str) else 'shutting down'}" if why else "ok"
            )
        checks["inference"], checks["store"] = await asyncio.gather(
            self._bounded(self._probes.inference), self._bounded(self._probes.store)
        )
        report = ReadinessReport(checks, [name for name, outcome in checks.items() if outcome != "ok"])
        failed = tuple(report.failed)
        if failed != self._last_failed:  # log changes only: probes poll often
            if failed:
                log.warning("not ready: %s", "; ".join(f"{n}: {checks[n]}" for n in failed))
            else:
                log.info("ready again")
            self._last_failed = failed
        return report

    async def raise_unless_healthy(self) -> None:
        """Serve's ``check_health``: the same checks (``draining`` aside: a stopping replica
        is not restarted); a failure a restart can cure fails it (:data:`LOCAL`), and so
        does a dependency that refuses the replica (a wrong store password: ``serve status``
        must not call such a gateway HEALTHY while ``/readyz`` says 503).  A store or an
        inference deployment that is down or slow does not: a replica restarted meanwhile
        would come back just as unready and drop its connections on the way; those failures
        are reported by ``/readyz`` and logged when they start, here too when nobody polls."""
        report = await self.check(include_draining=False)
        bad = [name for name in report.failed if name in LOCAL or name in report.refused]
        if bad:
            raise RuntimeError("gateway unhealthy: " + "; ".join(f"{n}: {report.checks[n]}" for n in bad))


def add_readiness_route(app: FastAPI, readiness: Readiness) -> None:
    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        report = await readiness.check()
        return JSONResponse(report.body(), status_code=200 if report.ready else 503)
