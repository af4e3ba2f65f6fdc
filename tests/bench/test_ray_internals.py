"""bench.ray_internals: written against one Ray series; an upgrade fails here first."""

from __future__ import annotations

import importlib
import re
import tomllib
from importlib import metadata
from pathlib import Path

from bench import ray_internals

ROOT = Path(__file__).resolve().parents[2]


def test_the_internals_were_written_for_the_pinned_and_installed_ray():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(d for d in deps if d.startswith("ray["))
    assert re.fullmatch(rf"ray\[serve\]=={re.escape(ray_internals.RAY_SERIES)}\.\*", pin), pin
    assert metadata.version("ray").startswith(ray_internals.RAY_SERIES + ".")


def test_the_internals_are_where_the_wrapper_reaches_for_them():
    state = importlib.import_module("ray._private.state")
    utils = importlib.import_module("ray._private.utils")
    serve_api = importlib.import_module("ray.serve._private.api")
    long_poll = importlib.import_module("ray.serve._private.long_poll")
    assert callable(state.actors)
    assert callable(utils.write_ray_address)
    assert callable(serve_api.serve_start)
    assert callable(long_poll.LongPollClient.stop)
