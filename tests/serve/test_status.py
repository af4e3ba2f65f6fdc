"""``responses-ws status``'s pure parts: what a snapshot means (serve/status.py, each rule a
row here) and how the dashboard's answers are read (serve/status_probe.py's parsers)."""

from __future__ import annotations

import pytest

from serve import status_probe
from serve.status import (
    HEALTHY,
    UNHEALTHY,
    Application,
    Node,
    Readiness,
    Replica,
    Snapshot,
    StoreCheck,
    as_json,
    exit_status,
    findings,
    one_line,
    render,
)

NODES = (
    Node("h" * 56, "10.0.0.10", True, ("head",)),
    Node("s" * 56, "10.0.0.11", True, ("session",)),
    Node("a" * 56, "10.0.0.21", True, ("accelerator",)),
)
GOOD_STORE = StoreCheck("redis://10.0.0.10:6390/0", True, True, "a probe write succeeded")


def app(status="RUNNING", gateway="RUNNING", deployment="HEALTHY", inference="RUNNING") -> Application:
    return Application(
        "responses-ws",
        status,
        "",
        {"Gateway": deployment, "InferenceDeployment": "HEALTHY"},
        (
            Replica("Gateway", gateway, "s" * 56, "10.0.0.11"),
            Replica("InferenceDeployment", inference, "a" * 56, "10.0.0.21"),
            Replica("InferenceDeployment", "RUNNING", "a" * 56, "10.0.0.21"),
        ),
    )


def snap(apps=None, ready=None, store=GOOD_STORE, connections=None, nodes=NODES) -> Snapshot:
    return Snapshot(
        "http://10.0.0.10:8265",
        nodes,
        (app(),) if apps is None else apps,
        (Readiness("10.0.0.11", "http://10.0.0.11:8765/readyz", 200, {"store": "ok"}),)
        if ready is None
        else ready,
        store,
        {"10.0.0.11": 12} if connections is None else connections,
    )


def not_ready(**checks: str) -> tuple[Readiness, ...]:
    return (Readiness("10.0.0.11", "http://10.0.0.11:8765/readyz", 503, {"listener": "ok", **checks}),)


# (case, snapshot, exit status, the first finding's level, words of its line)
CASES = [
    ("all well", snap(), HEALTHY, None, ""),
    ("no responses-ws app", snap(apps=()), UNHEALTHY, "error", "serve: no application with a Gateway"),
    ("app deploy failed", snap(apps=(app(status="DEPLOY_FAILED"),)), UNHEALTHY, "error", "DEPLOY_FAILED"),
    ("app deploying", snap(apps=(app(status="DEPLOYING"),)), HEALTHY, "warning", "DEPLOYING"),
    (
        "deployment unhealthy",
        snap(apps=(app(deployment="UNHEALTHY"),)),
        UNHEALTHY,
        "error",
        "Gateway: UNHEALTHY",
    ),
    ("gateway upscaling", snap(apps=(app(deployment="UPSCALING"),)), HEALTHY, "info", "UPSCALING"),
    ("no gateway running", snap(apps=(app(gateway="STARTING"),)), UNHEALTHY, "error", "no gateway replica"),
    ("a replica recovering", snap(apps=(app(inference="RECOVERING"),)), HEALTHY, "warning", "RECOVERING"),
    ("a state not in the table", snap(apps=(app(inference="ZOMBIE"),)), HEALTHY, "warning", "ZOMBIE"),
    (
        "readyz: store down",
        snap(ready=not_ready(store="no answer within 2 s", draining="ok")),
        UNHEALTHY,
        "error",
        "session node 10.0.0.11: /readyz 503: store: no answer within 2 s",
    ),
    (
        "readyz: draining only",
        snap(ready=not_ready(draining="draining: node drain", store="ok")),
        HEALTHY,
        "warning",
        "session node 10.0.0.11: draining: node drain",
    ),
    (
        "readyz: no answer",
        snap(ready=(Readiness("10.0.0.11", "u", None, error="ConnectionRefusedError"),)),
        UNHEALTHY,
        "error",
        "/readyz did not answer: ConnectionRefusedError",
    ),
    (
        "store refused the credential",
        snap(store=StoreCheck("redis://x", True, False, "WRONGPASS", refused=True)),
        UNHEALTHY,
        "error",
        "store redis://x: refused the application's credential: WRONGPASS",
    ),
    (
        "store unreachable",
        snap(store=StoreCheck("redis://x", True, False, "no answer within 5 s")),
        UNHEALTHY,
        "error",
        "store redis://x: unreachable: no answer within 5 s",
    ),
    (
        "store shard degraded",
        snap(
            store=StoreCheck(
                "redis://x",
                True,
                True,
                "ok",
                replication={
                    "shards": [{"primary": "10.0.0.5:6379", "replicas": 0, "wanted": 1, "degraded": True}]
                },
            )
        ),
        HEALTHY,
        "warning",
        "shard 10.0.0.5:6379 degraded: 0 of 1 replicas online; its writes are not replicated",
    ),
    (
        "store shard degraded, strict",
        snap(
            store=StoreCheck(
                "redis://x",
                True,
                True,
                "ok",
                replication={
                    "policy": "strict",
                    "shards": [{"primary": "10.0.0.5:6379", "replicas": 0, "wanted": 1, "degraded": True}],
                },
            )
        ),
        UNHEALTHY,
        "error",
        "shard 10.0.0.5:6379 degraded: 0 of 1 replicas online; its writes are refused",
    ),
    (
        "store shard without a primary",
        snap(
            store=StoreCheck(
                "redis://x",
                True,
                True,
                "ok",
                replication={
                    "policy": "available",
                    "shards": [{"primary": "10.0.0.5:6379", "reachable": False, "degraded": True}],
                },
            )
        ),
        UNHEALTHY,
        "error",
        "shard 10.0.0.5:6379 did not answer",
    ),
    (
        "store not checked from here",
        snap(store=StoreCheck("sqlite (data on each node)", False, False, "each node's own file")),
        HEALTHY,
        "info",
        "each node's own file",
    ),
    ("connections not exported", snap(connections={"10.0.0.11": None}), HEALTHY, "info", "not exported"),
    (
        "a dead node with a role",
        snap(nodes=(*NODES, Node("d" * 56, "10.0.0.12", False, ("session",)))),
        HEALTHY,
        "info",
        "session node 10.0.0.12: dead",
    ),
]


@pytest.mark.parametrize(("case", "snapshot", "code", "level", "words"), CASES, ids=[c[0] for c in CASES])
def test_what_a_snapshot_means(case, snapshot, code, level, words):
    found = findings(snapshot)
    assert exit_status(found) == code
    if level is None:
        assert found == []
        assert one_line(found) == "healthy"
        return
    assert found[0].level == level and words in found[0].line(), found
    verdict = one_line(found)
    assert "\n" not in verdict
    assert verdict.startswith("unhealthy: ") == (code == UNHEALTHY)


def test_errors_come_first_and_all_of_them_are_on_the_one_line():
    s = snap(
        apps=(app(inference="RECOVERING"),),
        ready=not_ready(store="no answer within 2 s"),
        store=StoreCheck("redis://x", True, False, "no answer within 5 s"),
    )
    found = findings(s)
    assert [f.level for f in found] == ["error", "error", "warning"]
    assert one_line(found) == (
        "unhealthy: session node 10.0.0.11: /readyz 503: store: no answer within 2 s; "
        "store redis://x: unreachable: no answer within 5 s"
    )


def test_the_text_and_json_show_nodes_by_role_replicas_by_node_and_connections():
    s = snap()
    found = findings(s)
    text = render(s, found)
    assert "cluster http://10.0.0.10:8265: healthy" in text
    assert "session      10.0.0.11       ALIVE" in text and "/readyz 200  connections 12" in text
    assert "InferenceDeployment (HEALTHY): 10.0.0.21 x2" in text and "Gateway (HEALTHY): 10.0.0.11" in text
    doc = as_json(s, found)
    assert doc["healthy"] and doc["verdict"] == "healthy"
    assert doc["replicas_by_node"]["responses-ws"] == {
        "Gateway": {"10.0.0.11": 1},
        "InferenceDeployment": {"10.0.0.21": 2},
    }
    assert doc["connections"] == {"10.0.0.11": 12}


# The dashboard's answers, in the shapes Ray 2.60 returns (trimmed).
NODES_DOC = {
    "result": True,
    "data": {
        "result": {
            "total": 2,
            "result": [
                {
                    "node_id": "n1",
                    "node_ip": "10.0.0.10",
                    "state": "ALIVE",
                    "resources_total": {"CPU": 2.0, "head": 1.0},
                },
                {
                    "node_id": "n2",
                    "node_ip": "10.0.0.11",
                    "state": "DEAD",
                    "resources_total": {"session": 1.0},
                },
            ],
        }
    },
}
SERVE_DOC = {
    "applications": {
        "responses-ws": {
            "status": "RUNNING",
            "message": "",
            "deployed_app_config": {
                "args": {"server": {"host": "0.0.0.0", "port": 8765}, "store": {"backend": "redis"}}
            },
            "deployments": {
                "Gateway": {
                    "status": "HEALTHY",
                    "replicas": [{"node_id": "n2", "node_ip": "10.0.0.11", "state": "RUNNING"}],
                }
            },
        }
    }
}


def test_the_dashboards_answers_are_read_into_nodes_and_applications():
    assert status_probe.nodes(NODES_DOC) == (
        Node("n1", "10.0.0.10", True, ("head",)),
        Node("n2", "10.0.0.11", False, ("session",)),
    )
    (a,) = status_probe.applications(SERVE_DOC)
    assert a.serves_responses and a.replicas == (Replica("Gateway", "RUNNING", "n2", "10.0.0.11"),)
    assert status_probe.deployed_args(SERVE_DOC, "responses-ws")["server"]["port"] == 8765
    assert status_probe.deployed_args(SERVE_DOC, "other") == {}


def test_open_sockets_sum_the_gateways_series_on_a_node():
    text = "\n".join(
        [
            "# HELP ray_responses_ws_open_sockets WebSockets open on a gateway replica",
            'ray_responses_ws_open_sockets{Component="core_worker",ReplicaId="a"} 3.0',
            'ray_responses_ws_open_sockets{Component="core_worker",ReplicaId="b"} 2.0',
            'ray_responses_ws_open_sockets_other{x="y"} 100.0',
        ]
    )
    assert status_probe.open_sockets(text) == 5


@pytest.mark.parametrize(
    ("environ", "token"),
    [
        ({"RAY_AUTH_TOKEN": " t1 \n"}, "t1"),
        ({"RAY_AUTH_TOKEN_PATH": "FILE"}, "t2"),
        ({"RAY_AUTH_TOKEN_PATH": "/nonexistent"}, None),
    ],
)
def test_the_ray_token_comes_from_the_environment_as_rays_clients_take_it(environ, token, tmp_path):
    (tmp_path / "token").write_text("t2\n")
    env = {k: v.replace("FILE", str(tmp_path / "token")) for k, v in environ.items()}
    assert status_probe.ray_token(env) == token


def test_a_dashboard_that_does_not_answer_is_exit_2_with_one_line(capsys):
    from serve.cli import main

    assert main(["status", "--address", "http://127.0.0.1:1", "--timeout", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "responses-ws status: Ray's dashboard at http://127.0.0.1:1"
    )
