"""The settings this project gives Ray through the environment, pinned to the Ray they were read
against (:data:`RAY_SERIES`).

Ray reads them when its processes start (Serve's, the dashboard's and the log monitor's
constants, and ``RAY_<name>`` for each entry of the raylet's, the GCS's and the core worker's
``RayConfig``).  None of them is a public API: each is named in Ray's source, not in its
reference, and may be renamed or dropped by any release.  So every one is here, with the Ray
file that reads it (:data:`READ_BY`), and tests/serve/test_ray_options.py fails when the
installed Ray is of another series or no longer reads one of them.

- :data:`RAY_ENV` — every Ray the project starts, and the ones its docs tell operators to
  start (``ray start`` on a cluster exports the same).
- :data:`DEV_NODE_ENV` — a Ray that ``responses-ws serve``, ``demo`` and the benchmarks start
  themselves (no ``--address``): a development node, its background loops set for a small
  idle cost, each with its trade-off (docs/capacity.md, "Ray's own processes").  A cluster
  keeps Ray's defaults unless its operator exports these.
- :data:`LOOPBACK_ENV` — a Ray started here listens on 127.0.0.1 only.

Values already in the environment win (:func:`apply`).  This module does not import ``ray``:
:data:`LOOPBACK_ENV` has to be set before ``ray`` is first imported (serve/embedded.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from importlib.metadata import version as installed_version

RAY_SERIES = "2.60."

# Serve's throughput mode (no per-request logging, user code on the replica's own loop,
# gRPC between handles and replicas) cuts a turn's Serve hop roughly in half on this
# machine (docs/architecture.md).  It must be in the environment of every Ray process, so
# it is set before an embedded Ray starts; a cluster you join must be started with it.
# That mode also turns on Serve's direct ingress, which keeps a stopping ingress replica
# "reachable" for 30 s before its destructor runs.  The gateway does not depend on it (its
# drain watch sees Serve's stop at once: docs/reliability.md); 1 s only lets a drained
# replica's process go sooner (and ``serve.delete`` return sooner).
#
# Serve's replicas and every process holding a handle (the gateway, each session host)
# export their cached request metrics every RAY_SERVE_METRICS_EXPORT_INTERVAL_MS (100 ms by
# default: ten wake-ups a second in each, idle or not); once a second is as fresh as any
# scrape (docs/capacity.md, "Ray's own processes").
#
# Ray starts its workers at niceness 15 (``worker_niceness``), so that the OS gives its own
# processes and the node's other programs the cores first.  Here the workers are the
# server: the gateway, the session hosts and the inference replicas answer turns, and at 15
# any program at 0 that wants a core (a load generator on the node, Ray's metrics agent
# ingesting a burst of histogram values every 10 s) takes it from them almost entirely (a
# nice-0 thread weighs 28 times a nice-15 one).  0 gives them an equal share: the steady
# tail under 256 loops, docs/steady-tail.md.
RAY_ENV = {
    "RAY_worker_niceness": "0",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
}

# A development node's settings (docs/capacity.md, "Ray's own processes", has each one's
# cost and trade-off):
#
# - Serve's controller reconciles every 1 s, not 0.1 s: a deploy, a replica's death or a
#   scaling decision is acted on up to 0.9 s later.
# - No direct ingress: throughput mode turns it on, and with it Serve starts a proxy on the
#   head node even with the HTTP proxy disabled (``proxy_location="Disabled"``); the gateway
#   listens on its own port and never uses it.  A stopping gateway replica is no longer kept
#   "reachable" for the direct-ingress draining period (the gateway drains by itself).
# - The dashboard agent checks that its raylet lives every 2 s, not 0.4 s (it exits up to
#   2 s after the raylet), and samples the node's processes for Ray's node metrics
#   (``ray_node_*``, the dashboard's node view) every 30 s, not 5 s.
# - The log monitor looks for new log files every 5 s, not on each of its 0.1 s polls (Ray
#   globs the session's log directory each poll below 1000 files): a new worker's first
#   lines reach the driver's console up to 5 s later; no line is lost.
# - The raylet's timers of 0.1-0.25 s run once a second: its memory monitor (the OOM killer
#   acts up to 1 s after memory crosses its threshold, not 0.25 s), its disk-capacity check
#   (an object created while the disk passes 95 % full is refused up to 1 s later), its check
#   whether the object store needs a global garbage collection, and its idle-worker reaper
#   (an idle worker process is stopped up to 1 s later).
# - The autoscaler's monitor (``monitor.py``: a single node here has nothing to scale) updates
#   its load figures and ``ray status`` every 30 s, not 5 s; the GCS pulls the raylet's
#   resource load (the pending work the monitor reads) every 5 s, not 1 s.
# - The raylet sends the GCS its resources' changes at most once a second, not ten times: the
#   GCS's view of the node's free resources (where it places an actor that asks for some)
#   is up to 1 s old; the project's actors ask for none (``num_cpus=0``).
# - The object manager's timer (it retries pulls of objects from other nodes, which a single
#   node never makes) ticks once a second, not ten times: with nodes joined, a failed pull
#   is retried up to 1 s later.
# - Each process's event loops are probed for their latency (``ray_io_context_*`` metrics)
#   every 10 s, not 1 s.
DEV_NODE_ENV = {
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1",
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    "LOG_NAME_UPDATE_INTERVAL_S": "5",
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0",
    "RAY_DASHBOARD_AGENT_CHECK_PARENT_INTERVAL_S": "2",
    "REPORTER_UPDATE_INTERVAL_MS": "30000",
    "RAY_memory_monitor_refresh_ms": "1000",
    "RAY_local_fs_monitor_interval_ms": "1000",
    "RAY_raylet_check_gc_period_milliseconds": "1000",
    "RAY_kill_idle_workers_interval_ms": "1000",
    "AUTOSCALER_UPDATE_INTERVAL_S": "30",
    "RAY_gcs_pull_resource_loads_period_milliseconds": "5000",
    "RAY_raylet_report_resources_period_milliseconds": "1000",
    "RAY_object_manager_timer_freq_ms": "1000",
    "RAY_io_context_monitor_probe_interval_ms": "10000",
}

# Ray's switch for a single-node Ray (its default on macOS and Windows) makes 127.0.0.1 the
# node's address, and the GCS, raylet, agents, workers and dashboard then listen there instead
# of on every interface and the machine's address.  Ray reads it when ``ray`` is first imported
# (docs/reliability.md).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

# Where Ray reads each setting: a file of the ``ray`` package (relative to it) that names the
# variable, or ``RAYCONFIG`` for ``RAY_<name>``, an entry of the compiled ``RayConfig``
# (ray_config_def.h) that the raylet's binary names.
RAYCONFIG = "RayConfig"
READ_BY: Mapping[str, str] = {
    "RAY_worker_niceness": RAYCONFIG,
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "serve/_private/constants.py",
    "RAY_USAGE_STATS_ENABLED": "_common/usage/usage_constants.py",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "serve/_private/constants.py",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "serve/_private/constants.py",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "serve/_private/constants.py",
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "_private/log_monitor.py",
    "LOG_NAME_UPDATE_INTERVAL_S": "_private/log_monitor.py",
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "serve/_private/constants.py",
    "RAY_DASHBOARD_AGENT_CHECK_PARENT_INTERVAL_S": "dashboard/consts.py",
    "REPORTER_UPDATE_INTERVAL_MS": "dashboard/modules/reporter/reporter_consts.py",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "_private/ray_constants.py",
    "RAY_memory_monitor_refresh_ms": RAYCONFIG,
    "RAY_local_fs_monitor_interval_ms": RAYCONFIG,
    "RAY_raylet_check_gc_period_milliseconds": RAYCONFIG,
    "RAY_kill_idle_workers_interval_ms": RAYCONFIG,
    "AUTOSCALER_UPDATE_INTERVAL_S": "autoscaler/_private/constants.py",
    "RAY_gcs_pull_resource_loads_period_milliseconds": RAYCONFIG,
    "RAY_raylet_report_resources_period_milliseconds": RAYCONFIG,
    "RAY_object_manager_timer_freq_ms": RAYCONFIG,
    "RAY_io_context_monitor_probe_interval_ms": RAYCONFIG,
}


class UnsupportedRay(RuntimeError):
    """The installed Ray is not the series these settings were read against."""


def check_ray_version(version: str | None = None) -> None:
    """Raise :class:`UnsupportedRay` unless Ray is of :data:`RAY_SERIES`."""
    version = installed_version("ray") if version is None else version
    if not version.startswith(RAY_SERIES):
        raise UnsupportedRay(
            f"serve/ray_options.py's settings were read against Ray {RAY_SERIES}x and Ray {version} "
            "is installed: check that it still reads each (READ_BY), run "
            "tests/serve/test_ray_options.py, then update RAY_SERIES"
        )


def settings(*, dev_node: bool = False) -> dict[str, str]:
    """:data:`RAY_ENV`, and :data:`DEV_NODE_ENV` for a ``dev_node``."""
    return {**RAY_ENV, **(DEV_NODE_ENV if dev_node else {})}


def apply(*, dev_node: bool = False, environ: MutableMapping[str, str] | None = None) -> None:
    """Put :func:`settings` in ``environ`` (this process's environment by default; values already
    set win); Ray processes started afterwards inherit them."""
    env = os.environ if environ is None else environ
    for key, value in settings(dev_node=dev_node).items():
        env.setdefault(key, value)


__all__ = [
    "DEV_NODE_ENV",
    "LOOPBACK_ENV",
    "RAYCONFIG",
    "RAY_ENV",
    "RAY_SERIES",
    "READ_BY",
    "UnsupportedRay",
    "apply",
    "check_ray_version",
    "settings",
]
