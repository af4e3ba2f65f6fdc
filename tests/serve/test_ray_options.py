"""Ray's settings from the environment (serve/ray_options.py) are pinned to the Ray they were
read against: the installed Ray is of that series, and each file named as reading a setting
still names it (a setting Ray no longer reads would be silently ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve import ray_options


def ray_package() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


def test_the_installed_ray_is_the_pinned_series():
    ray_options.check_ray_version()


def test_another_series_is_refused_with_what_to_recheck():
    with pytest.raises(ray_options.UnsupportedRay, match="READ_BY"):
        ray_options.check_ray_version("2.61.0")


def test_every_setting_names_where_ray_reads_it():
    every = {**ray_options.RAY_ENV, **ray_options.DEV_NODE_ENV, **ray_options.LOOPBACK_ENV}
    assert set(every) == set(ray_options.READ_BY)


@pytest.mark.parametrize("key", sorted(ray_options.READ_BY))
def test_the_installed_ray_still_reads_each_setting(key: str):
    where = ray_options.READ_BY[key]
    if where == ray_options.RAYCONFIG:
        assert key.startswith("RAY_")
        binary = ray_package() / "core/src/ray/raylet/raylet"
        name = b"\0" + key.removeprefix("RAY_").encode() + b"\0"  # the entry's name, a C string of its own
        assert name in binary.read_bytes(), f"{key}: not in the raylet's RayConfig"
    else:
        assert f'"{key}"' in (ray_package() / where).read_text(), f"{key}: not read by ray/{where}"


def test_values_already_set_win():
    env = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1"}
    ray_options.apply(dev_node=True, environ=env)
    assert env["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.1"
    assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"


def test_a_cluster_keeps_rays_defaults_for_the_development_node_settings():
    env: dict[str, str] = {}
    ray_options.apply(environ=env)
    assert env == ray_options.RAY_ENV and not set(env) & set(ray_options.DEV_NODE_ENV)
