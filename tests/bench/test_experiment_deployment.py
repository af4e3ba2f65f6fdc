"""The deployment under test as the experiment reads and changes it (bench/experiment/
deployment.py): a sweep begins only once no gateway is starting or stopping."""

from __future__ import annotations

from typing import Any

import pytest

from bench.experiment.deployment import Deployment
from bench.experiment.errors import SetupError

pytestmark = pytest.mark.unit


def details(states: list[str], status: str = "HEALTHY") -> dict[str, Any]:
    replicas = [{"state": s, "node_id": f"n{i}", "node_ip": f"10.0.0.{i}"} for i, s in enumerate(states)]
    return {
        "applications": {
            "responses-ws": {
                "deployed_app_config": {"name": "responses-ws", "args": {"server": {"port": 8765}}},
                "deployments": {"Gateway": {"status": status, "replicas": replicas, "deployment_config": {}}},
            }
        }
    }


class Rest:
    """Serve's REST API answering a scripted sequence of states (the last one repeats)."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.answers = answers
        self.deployed: list[dict[str, Any]] = []

    def details(self) -> dict[str, Any]:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def deploy(self, body: dict[str, Any]) -> None:
        self.deployed.append(body)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def deployment(answers: list[dict[str, Any]]) -> tuple[Deployment, Clock]:
    clock = Clock()
    return Deployment(Rest(answers), clock=clock, sleep=clock.sleep), clock  # type: ignore[arg-type]


def test_the_sweep_waits_for_a_stopping_gateway_to_be_gone():
    # a previous run's restore: one gateway stopping (it refuses new connections while it drains)
    dep, clock = deployment(
        [details(["RUNNING"])]  # read at construction
        + [details(["RUNNING", "STOPPING"], "UPDATING")] * 3
        + [details(["RUNNING"])]
    )
    nodes = dep.settled(60.0)
    assert [n.node_id for n in nodes] == ["n0"] and clock.t == 1.5


def test_a_deployment_that_does_not_settle_is_a_setup_error_in_one_line():
    dep, _ = deployment([details(["RUNNING"]), details(["RUNNING", "STARTING"], "UPDATING")])
    with pytest.raises(SetupError) as err:
        dep.settled(5.0)
    assert (
        "the deployment is changing" in err.value.message
        and "1 running, 2 live, UPDATING" in err.value.message
    )
    assert "\n" not in err.value.message


def test_a_pin_waits_for_exactly_its_count_and_no_other_replica():
    dep, _ = deployment(
        [details(["RUNNING"]), details(["RUNNING", "STARTING"], "UPDATING"), details(["RUNNING", "RUNNING"])]
    )
    assert len(dep.pin(2, 60.0)) == 2 and dep.changed
    pinned = dep.rest.deployed[-1]["applications"][0]["deployments"]  # type: ignore[attr-defined]
    assert pinned == [{"name": "Gateway", "num_replicas": 2}]


def test_a_cluster_address_where_no_ray_answers_is_refused_in_one_line(tmp_path, capsys):
    import socket

    from bench.commands import main

    with socket.socket() as s:  # a port of this machine nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    assert main(["bench", "scaling", "--cluster", address, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no Ray cluster answers at {address}" in err and "HOST:6379" in err
    assert main(["bench", "scaling", "--cluster", "head-without-port", "--out", str(tmp_path)]) == 2
    assert "is not HOST:PORT" in capsys.readouterr().err
