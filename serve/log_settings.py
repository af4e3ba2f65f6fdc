"""Log settings in Ray's and Serve's terms (docs/operations.md, Logs): what
``responses-ws serve --log-level/--log-format`` passes to ``ray.init`` and to Serve (the
app's own loggers take the same settings as ``AppConfig.logs``, :mod:`actors.logs`)."""

from __future__ import annotations

from typing import Any

from actors.logs import LogSettings


def ray_logging_config(settings: LogSettings) -> Any:
    """Ray's job ``LoggingConfig``: the root logger of the driver and of every worker of
    the job (Serve's controller and replicas started by it, the session hosts)."""
    import ray

    return ray.LoggingConfig(encoding=settings.encoding, log_level=settings.level)


def serve_logging_config(settings: LogSettings) -> dict[str, Any]:
    """Serve's ``logging_config`` (its controller's, and the application's): Serve's own
    loggers, and through the gateway the app's (no access log: the gateway answers HTTP
    itself, and throughput mode turns Serve's per-request logging off anyway)."""
    return {"log_level": settings.level, "encoding": settings.encoding, "enable_access_log": False}
