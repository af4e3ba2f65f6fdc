"""Log settings (actors/logs.py): the app config's ``logs`` section, applied to the
project's loggers with or without a handler Ray put on the root logger."""

from __future__ import annotations

import json
import logging

import pytest
from pydantic import ValidationError

from actors.logs import PACKAGES, LogSettings, configure
from serve.config import AppConfig
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


def test_settings_are_the_app_config_logs_section_and_serve_s_logging_config_follows():
    assert AppConfig().logs == LogSettings("WARNING", "TEXT")
    config = AppConfig.model_validate({"logs": {"level": "ERROR", "encoding": "JSON"}})
    assert config.logs == LogSettings("ERROR", "JSON")
    assert AppConfig.model_validate(config.model_dump()).logs == config.logs  # as the gateway gets it
    for bad in ({"level": "LOUD"}, {"encoding": "XML"}, {"lvl": "INFO"}):
        with pytest.raises(ValidationError, match="logs"):
            AppConfig.model_validate({"logs": bad})
    assert serve_logging_config(config.logs) == {
        "log_level": "ERROR",
        "encoding": "JSON",
        "enable_access_log": False,
    }


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
