"""Log level and encoding of the app's own loggers in a process it runs in: a gateway replica
and the session hosts it starts (docs/operations.md, Logs).

The settings are the app config's ``logs`` section (``serve.config.AppConfig``):
``responses-ws serve --log-level/--log-format`` set it, and pass the same to Ray (a job
``LoggingConfig``) and to Serve (the application's ``logging_config``); a Serve config file
sets it in ``args.logs``, beside Serve's own ``logging_config``.  The gateway applies it with
:func:`configure` to itself and to every session host it starts, so one setting covers the
whole app.

:func:`configure` sets the level of the project's loggers.  Where Ray already put a handler
on the root logger (a job ``LoggingConfig``: ``responses-ws serve``) that handler formats
the records; elsewhere (a Serve config deployed with ``serve deploy``) the project's
loggers get a stderr handler of their own in the requested encoding.  Records go to the
process's stderr: Ray's worker log files, and the terminal of a driver that forwards them.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from typing import Literal, TextIO

PACKAGES = ("actors", "serve", "inference", "store")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
ENCODINGS = ("TEXT", "JSON")
TEXT_FORMAT = "%(asctime)s\t%(levelname)s %(name)s:%(lineno)d -- %(message)s"


Encoding = Literal["TEXT", "JSON"]


@dataclass(frozen=True, slots=True)
class LogSettings:
    """``level`` and ``encoding`` as Ray's ``LoggingConfig`` and Serve's ``logging_config``
    name them."""

    level: str = "WARNING"
    encoding: Encoding = "TEXT"

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"log level {self.level!r}: one of {', '.join(LEVELS)}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"log encoding {self.encoding!r}: one of {', '.join(ENCODINGS)}")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the keys of Ray's JSON log encoding."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "asctime": self.formatTime(record),
            "levelname": record.levelname,
            "name": record.name,
            "message": record.getMessage(),
            "filename": record.filename,
            "lineno": record.lineno,
            "process": record.process,
        }
        if record.exc_info:
            entry["exc_text"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class _Handler(logging.StreamHandler[TextIO]):
    """The handler :func:`configure` installs (recognised, and replaced, on a second call)."""


def configure(settings: LogSettings) -> None:
    """Apply ``settings`` to the project's loggers in this process (idempotent)."""
    handler = None
    if not logging.getLogger().handlers:  # else Ray's job LoggingConfig formats the records
        # The process's own stderr: a Serve replica in throughput mode redirects sys.stderr
        # into Serve's log file.
        handler = _Handler(sys.__stderr__)
        handler.setFormatter(
            JsonFormatter() if settings.encoding == "JSON" else logging.Formatter(TEXT_FORMAT)
        )
    # Serve's logger: a session host imports ray.serve, which logs at INFO to stderr by
    # default (in the gateway's replica the app's level wins over Serve's logging_config).
    logging.getLogger("ray.serve").setLevel(settings.level)
    for name in PACKAGES:
        logger = logging.getLogger(name)
        logger.setLevel(settings.level)
        for old in [h for h in logger.handlers if isinstance(h, _Handler)]:
            logger.removeHandler(old)
        if handler is not None:
            logger.addHandler(handler)
            logger.propagate = False  # no second copy through a root handler added later
        else:
            logger.propagate = True
