"""Session-scoped fixtures: the embedded Ray, the main test server, a throw-away redis-server,
and the child processes with a Ray of their own (``responses-ws serve``, a ``ray start``
cluster, the multi-node scenario).  Helpers the tests share are in tests/support/."""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.children import Launcher
    from tests.support.cluster_scenario import ScenarioProcess
    from tests.support.loopback import LoopbackSweep
    from tests.support.ray_cluster import LocalCluster
    from tests.support.redis import Cluster
    from tests.support.serve_process import ServeProcess

# A test is `integration` when it lives in a tier of real deployments or asks for a fixture
# that starts a real service (Ray and Serve, a redis-server), or is a parameter marked
# `integration` that does (tests/store/test_store.py's Redis backends); every other test is `unit`:
# pure logic that runs in milliseconds (`make test-unit`, `pytest -m unit`).
INTEGRATION_DIRS = ("integration", "operations", "cluster", "real_model", "multinode")
SERVICE_FIXTURES = {"ray_cluster", "redis_server", "redis_cluster"}
# The real-model tier (a real model on vLLM's CPU build, its own virtualenv: `make
# test-real-model`) is `real_model` too, deselected by default (pyproject addopts).
REAL_MODEL_DIR = "real_model"
# The multi-node tier (real nodes in network namespaces behind HAProxy, bench/multinode; root:
# `make test-multinode`) is `multinode`, deselected by default too.
MULTINODE_DIR = "multinode"
# The tiers of child processes with a Ray of their own run last: their processes (the
# fixtures CHILDREN, started by the `children` fixture at the operations tier's first test,
# in the order the tests need them) start in the background while the tests that need none
# of them run first.
LAST_TIERS = ("operations", "cluster")
CHILDREN = ("operator_server", "json_logs_server", "shared_ray_cluster", "cluster_scenario")
# Parallel workers (not what `make test` runs: docs/testing.md): `pytest -n 2 --dist
# loadgroup --no-loadscope-reorder`.  A Ray lives in one worker process, so the tests that
# share one are an xdist group, which stays on one worker: the tests on the embedded Ray in
# two groups (each group's worker starts an embedded Ray of its own), FAULT_FILES — the ones
# that redeploy, kill or drain, the slow half — and the rest; and the LAST_TIERS' tests that
# start Rays of their own (the children, `ray start` clusters).  The groups come first,
# largest first: each worker starts with one of the two embedded-Ray groups, the one done
# first takes the children's, and the tests of no group (pure logic, the store against a
# redis-server) fill the gaps module by module.  Every Ray start holds a lock the workers share
# (tests/support/children.py, ray_start_lock).
FAULT_FILES = {
    "integration/test_faults.py",
    "integration/test_resume_any_node.py",
    "integration/test_store_backends.py",
    "integration/test_crowd.py",
    "integration/test_ledger.py",
    "integration/test_node_drain.py",
    "integration/test_store_failover.py",
}
GROUPS = ("embedded-ray-faults", "embedded-ray", "children")  # in the order the workers take them


def group(item: pytest.Item) -> str | None:
    """The xdist group of ``item``: the tests sharing a Ray are on one worker."""
    path = item.path.relative_to(item.config.rootpath / "tests")
    if "ray_cluster" in getattr(item, "fixturenames", ()):
        return GROUPS[0] if path.as_posix() in FAULT_FILES else GROUPS[1]
    if path.parts[0] in LAST_TIERS:
        return GROUPS[2]
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "unit: pure logic, no service started (the fast tier)")
    config.addinivalue_line("markers", "integration: real Ray/Serve, a real store server or real clients")
    config.addinivalue_line("markers", "real_model: a real model on a real engine (make test-real-model)")
    config.addinivalue_line("markers", "multinode: real nodes behind a load balancer (make test-multinode)")
    config.addinivalue_line(
        "markers", "operations: tests/operations and tests/cluster, Rays of their own (make test-operations)"
    )
    config.addinivalue_line(
        "markers", "loopback_sweep: checks the scaling experiment's sweep run from the session's first test"
    )
    config.addinivalue_line(
        "markers", "default_tier: a test of tests/operations or tests/cluster that runs in the default tier"
    )
    config.addinivalue_line("markers", "xdist_group(name): pytest-xdist keeps a group on one worker")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups' marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def tier(item: pytest.Item) -> str:
        return item.path.relative_to(item.config.rootpath / "tests").parts[0]

    for item in items:
        real = (
            tier(item) in INTEGRATION_DIRS
            or SERVICE_FIXTURES & set(getattr(item, "fixturenames", ()))
            or item.get_closest_marker("integration") is not None  # a parameter that starts a service
        )
        item.add_marker(pytest.mark.integration if real else pytest.mark.unit)
        if tier(item) == REAL_MODEL_DIR:
            item.add_marker(pytest.mark.real_model)
        if tier(item) == MULTINODE_DIR:
            item.add_marker(pytest.mark.multinode)
        if tier(item) in LAST_TIERS and item.get_closest_marker("default_tier") is None:
            item.add_marker(pytest.mark.operations)
        # A test of no group goes with its module: a worker takes a module at a time (one
        # test at a time, it would wait for the scheduler between every two tests).
        item.add_marker(
            pytest.mark.xdist_group(group(item) or item.path.relative_to(item.config.rootpath).as_posix())
        )

    parallel = hasattr(config, "workerinput")  # an xdist worker: the groups first

    def order(item: pytest.Item) -> tuple[int, int, bool]:
        name = group(item)
        if item.get_closest_marker("default_tier") is not None and not parallel:
            # after the tests of no group: its cluster ends before the embedded Ray starts
            return (-1, 1, False)
        rank = GROUPS.index(name) if name is not None else (len(GROUPS) if parallel else -1)
        if tier(item) not in LAST_TIERS or name != GROUPS[2]:
            return (rank, 0, False)
        return (
            rank,
            1 + LAST_TIERS.index(tier(item)),
            bool(set(CHILDREN) & set(getattr(item, "fixturenames", ()))),
        )

    items.sort(key=order)


@pytest.fixture(scope="session")
def ray_start_lock_path(tmp_path_factory) -> Path:
    """The file every Ray start of this run locks: with xdist, beside the workers' own
    temporary directories (so all of them lock the same one)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "ray-start.lock"


# The embedded Ray's Serve controller reconciles every 0.25 s, not a development node's 1 s
# (serve/ray_options.py DEV_NODE_ENV): an app the suite deploys (`start_app`, ~30 of them) runs
# ~3 s sooner, a redeploy's or a deletion's steps follow each other sooner, at no idle cost
# measured (docs/testing.md).  Only the embedded Ray's processes get it: the programs the
# tests start afterwards (`responses-ws serve`, `ray start` nodes) get the development node's.
SUITE_RAY_ENV = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.25"}


@pytest.fixture(scope="session")
def ray_cluster(ray_start_lock_path):
    import ray

    from serve.embedded import DEV_NODE_ENV, embedded_ray
    from tests.support.children import ray_start_lock

    added = {k: v for k, v in SUITE_RAY_ENV.items() if k not in os.environ}  # a value set by hand wins
    with contextlib.ExitStack() as stack:
        with ray_start_lock(ray_start_lock_path):
            os.environ.update(added)
            try:
                # its end takes Serve and every actor with it
                # the `client` resource: the load runner's actors may run here (bench/runner)
                stack.enter_context(embedded_ray(object_store_mb=200, num_cpus=2, resources={"client": 1}))
            finally:
                os.environ.update({k: DEV_NODE_ENV[k] for k in added})  # what embedded_ray puts there
        yield ray


@pytest.fixture(scope="session")
def server_url(ray_cluster) -> str:
    """The main test server: emu-fast/emu-gpu, the model calls tools for 20 rounds.  (The
    first test of the suite's Ray that needs a shared app needs this one: it starts alone.)"""
    from inference.emulator.profiles import load_inference_config
    from tests.support.server import start_app

    inference = load_inference_config().model_copy(deep=True)
    inference.policy.tool_rounds = 20
    return start_app("responses-ws", **{"inference.policy": inference.policy.model_dump()})


# The ledgered server's model calls tools this many rounds before it answers (a Codex prompt's
# task, tests/integration/test_codex_cli.py); the other clients on it set theirs per request.
LEDGERED_TOOL_ROUNDS = 24


def session_app_specs(ledgered_data: Path) -> dict[str, tuple[str, dict]]:
    """The session's other shared apps (starting an app costs several seconds): the fixture
    that returns each one's URL, and its app name and overrides."""
    from tests.support.server import ALICE, BOB

    return {
        "two_replicas_url": ("rws-two-replicas", {"inference.replicas": 2}),
        "keyed_url": ("rws-keys", {"server.api_keys": [ALICE, BOB]}),
        "ledgered_server": (
            "rws-ledgered",
            {"store.data_dir": str(ledgered_data), "inference.policy.tool_rounds": LEDGERED_TOOL_ROUNDS},
        ),
    }


@pytest.fixture(scope="session")
def ledgered_data(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ledgered-store")


@pytest.fixture(scope="session")
def session_apps(ray_cluster, request, ledgered_data) -> dict[str, str]:
    """Those of :func:`session_app_specs` that the selected tests use, deployed together at
    the first test that needs one (``start_apps``, tests/support/server.py): fixture name ->
    base URL."""
    from tests.support.server import start_apps

    used = {name for item in request.session.items for name in item.fixturenames}
    specs = {f: spec for f, spec in session_app_specs(ledgered_data).items() if f in used}
    urls = start_apps(dict(specs.values()))
    return {f: urls[app] for f, (app, _) in specs.items()}


def session_app(fixture: str, apps: dict[str, str], ledgered_data: Path) -> str:
    """The URL of the session's app ``fixture``; deployed now if no selected test named it
    (a fixture asked for by ``request.getfixturevalue``)."""
    from tests.support.server import start_app

    if fixture not in apps:
        app, overrides = session_app_specs(ledgered_data)[fixture]
        apps[fixture] = start_app(app, **overrides)
    return apps[fixture]


@pytest.fixture(scope="session")
def two_replicas_url(session_apps, ledgered_data) -> str:
    """A server with two inference replicas (a connection's requests must stay on one)."""
    return session_app("two_replicas_url", session_apps, ledgered_data)


@pytest.fixture(scope="session")
def keyed_url(session_apps, ledgered_data) -> str:
    """A server that accepts only the API keys ``ALICE`` and ``BOB`` (tests/support/server.py),
    shared by the modules on keys and on isolation between them."""
    return session_app("keyed_url", session_apps, ledgered_data)


@pytest.fixture(scope="session")
def ledgered_server(session_apps, ledgered_data) -> tuple[str, Path]:
    """A server whose store, and the usage ledger the tests read, is an SQLite file in a temp
    directory of its own: its URL and that file.  Shared by the modules of the clients whose
    responses are looked up there (Codex CLI, the Vercel AI SDK), each by its responses' ids."""
    return session_app("ledgered_server", session_apps, ledgered_data), ledgered_data / "responses.sqlite3"


@pytest.fixture(scope="session")
def ws_url(server_url) -> str:
    from bench.client import ws_url

    return ws_url(server_url)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """The URL of a private, non-persistent redis-server; the process is killed at the end."""
    from tests.support import redis

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "redis-server is not on PATH: install it (`apt-get install -y redis-server`; "
            ".ci/run does this) to run the Redis store tests",
            pytrace=False,
        )
    started = redis.start(binary)
    if started is None:
        pytest.fail("redis-server did not start (3 attempts)", pytrace=False)
    proc, url = started
    try:
        yield url
    finally:
        redis.stop(proc)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Cluster]:
    """A private Redis Cluster, three primaries with a replica each (tests/support/redis.py),
    started once for the session; every process is killed at the end."""
    from tests.support.redis import Cluster

    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if binary is None or cli is None:
        pytest.fail(
            "redis-server and redis-cli are not on PATH: install them (`apt-get install -y "
            "redis-server`; .ci/run does this) to run the Redis Cluster store tests",
            pytrace=False,
        )
    cluster = Cluster(binary, cli)
    try:
        yield cluster
    finally:
        cluster.stop()


# ------------------------------------------------------------------ the scaling experiment's loopback cluster


def sweep_selected(session: pytest.Session) -> bool:
    """The scaling experiment's loopback sweep (tests/cluster/test_scaling_experiment.py) is selected."""
    return any(item.get_closest_marker("loopback_sweep") is not None for item in session.items)


@pytest.fixture(scope="session")
def loopback_sweep(request, ray_start_lock_path, redis_server, tmp_path_factory) -> Iterator[LoopbackSweep]:
    """The scaling experiment's loopback cluster (tests/support/loopback.py), started on a
    thread of its own, and when the sweep case is selected the sweep run on it right after."""
    from tests.support.loopback import SWEEP, LoopbackSweep

    flags = SWEEP if sweep_selected(request.session) else None
    sweep = LoopbackSweep(
        ray_start_lock_path, redis_server, tmp_path_factory.mktemp("loopback") / "run", flags
    )
    try:
        yield sweep
    finally:
        sweep.stop()


@pytest.fixture(scope="session", autouse=True)
def early_loopback_sweep(request) -> None:
    """With the sweep case selected, ``loopback_sweep`` starts at the session's first test: its
    cluster's set-up and its run (~40 s alone, ~1.3 cores) overlap the tests before it, which
    run in this one process.  Not on a pytest-xdist worker (the worker that runs the case is
    not known here): there it starts at the case."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None and sweep_selected(request.session):
        request.getfixturevalue("loopback_sweep")


# ------------------------------------------------------------------ children with a Ray of their own


@pytest.fixture(scope="session")
def children(request, tmp_path_factory, ray_start_lock_path) -> Iterator[Launcher]:
    """The child processes of the fixtures below that the selected tests use, started
    together in the order of CHILDREN (tests/support/children.py)."""
    from serve.embedded import free_port
    from tests.support.children import Launcher, busy_server
    from tests.support.cluster_scenario import ScenarioProcess
    from tests.support.ray_cluster import LocalCluster

    def operator_server(directory: Path) -> ServeProcess:
        return busy_server(
            directory,
            ["--dashboard", "--dashboard-port", str(free_port())],
            env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)},
        )

    def json_logs_server(directory: Path) -> ServeProcess:
        return busy_server(directory, ["--log-format", "json"])

    def shared_ray_cluster(directory: Path) -> LocalCluster:
        return LocalCluster()  # in a temp directory of its own, removed when it stops

    def cluster_scenario(directory: Path) -> ScenarioProcess:
        return ScenarioProcess(redis_url, directory)

    makers = {
        f.__name__: f for f in (operator_server, json_logs_server, shared_ray_cluster, cluster_scenario)
    }
    assert set(makers) == set(CHILDREN)
    used = {name for item in request.session.items for name in item.fixturenames}
    wanted = [name for name in CHILDREN if name in used]
    if "cluster_scenario" in wanted:
        redis_url = request.getfixturevalue("redis_server")
    # Directories made here: tmp_path_factory is not for the launcher's thread.
    starts = {name: functools.partial(makers[name], tmp_path_factory.mktemp(name)) for name in wanted}
    launcher = Launcher(starts, ray_start_lock_path)
    try:
        yield launcher
    finally:
        launcher.close()


@pytest.fixture
def operator_server(children) -> ServeProcess:
    """``responses-ws serve --config busy.yaml --dashboard`` (token authentication) from a
    directory outside the checkout, with text logs at the default level: an operator's
    server, shared by the tests that need no other (tests/operations: the dashboard, a
    local server's interfaces and port, the logs).  A test may stop it; the next test that
    asks for it gets a new one."""
    server = children.running("operator_server")
    server.wait_ready()
    return server


@pytest.fixture
def json_logs_server(children) -> ServeProcess:
    """``responses-ws serve --config busy.yaml --log-format json``."""
    server = children.running("json_logs_server")
    server.wait_ready()
    return server


@pytest.fixture
def shared_ray_cluster(children) -> Iterator[LocalCluster]:
    """A ``ray start --head`` cluster of the test's own (tests/support/ray_cluster.py),
    stopped at the test's end."""
    cluster = children.get("shared_ray_cluster")
    try:
        cluster.wait_up()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_scenario(children) -> Iterator[ScenarioProcess]:
    """The multi-node scenario's child process (tests/support/cluster_scenario.py)."""
    scenario = children.get("cluster_scenario")
    try:
        yield scenario
    finally:
        scenario.stop()
