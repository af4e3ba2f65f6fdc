"""Log settings (actors/logs.py): read from Serve's logging_config, applied to the
project's loggers with or without a handler Ray put on the root logger."""

from __future__ import annotations

import json
import logging

import pytest
from ray.serve.schema import LoggingConfig as ServeLoggingConfig

from actors.logs import PACKAGES, LogSettings, configure
from serve.log_settings import serve_logging_config

NAMES = ("", "ray.serve", *PACKAGES)


@pytest.fixture
def clean_loggers():
    """The loggers configure() touches, restored afterwards (pytest's own root handlers
    included: a test removes them to stand for a process Ray has not configured)."""
    saved = {
        n: (logging.getLogger(n).level, list(logging.getLogger(n).handlers), logging.getLogger(n).propagate)
        for n in NAMES
    }
    yield
    for n, (level, handlers, propagate) in saved.items():
        logger = logging.getLogger(n)
        logger.setLevel(level)
        logger.handlers = handlers
        logger.propagate = propagate


def test_settings_come_from_serve_logging_config_as_a_mapping_or_a_model():
    assert LogSettings.from_serve(None) is None
    assert LogSettings.from_serve({"log_level": "ERROR", "encoding": "JSON"}) == LogSettings("ERROR", "JSON")
    assert LogSettings.from_serve(ServeLoggingConfig(log_level="DEBUG", encoding="JSON")) == LogSettings(
        "DEBUG", "JSON"
    )
    assert LogSettings.from_serve({"log_level": logging.INFO}) == LogSettings("INFO", "TEXT")
    assert LogSettings.from_serve(serve_logging_config(LogSettings("ERROR", "JSON"))) == LogSettings(
        "ERROR", "JSON"
    )


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="log level"):
        LogSettings(level="LOUD")
    with pytest.raises(ValueError, match="log encoding"):
        LogSettings(encoding="XML")  # type: ignore[arg-type]


def test_without_a_root_handler_the_project_logs_to_stderr_in_the_encoding(clean_loggers, capfd):
    logging.getLogger().handlers = []
    configure(LogSettings("WARNING", "JSON"))
    configure(LogSettings("WARNING", "JSON"))  # idempotent: one handler, one line
    logging.getLogger("actors.host.connection").info("not shown")
    logging.getLogger("actors.host.connection").warning("inference failed for %s", "resp_1")
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["levelname"] == "WARNING" and entry["message"] == "inference failed for resp_1"
    assert entry["name"] == "actors.host.connection"
    assert logging.getLogger("ray.serve").level == logging.WARNING


def test_with_ray_s_root_handler_only_levels_are_set(clean_loggers, capfd):
    records: list[logging.LogRecord] = []
    root_handler = logging.Handler()
    root_handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger().handlers = [root_handler]
    configure(LogSettings("ERROR", "TEXT"))
    logging.getLogger("serve.gateway").warning("filtered out")
    logging.getLogger("serve.gateway").error("a session host died")
    assert [r.getMessage() for r in records] == ["a session host died"]
    assert capfd.readouterr().err == ""  # Ray's handler formats it, no second copy
