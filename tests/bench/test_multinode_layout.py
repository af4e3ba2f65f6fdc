"""The multi-node harness's pure logic (bench/multinode): names and addresses, what counts as
a leftover, which routes lead off the bridge, the balancer's config and runtime answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.multinode import Harness, NodeSpec, Topology
from bench.multinode.balancer import BalancerSettings, config, server_states, session_counts, session_servers
from bench.multinode.harness import CLIENT_SPEC, DEFAULT_SPECS, RAY_ENV
from bench.multinode.topology import foreign_routes, leftovers


def test_nodes_get_names_namespaces_and_addresses_on_the_bridge():
    t = Topology(DEFAULT_SPECS)
    assert [n.name for n in t.nodes] == ["head", "session1", "session2"]
    assert [n.namespace for n in t.nodes] == ["rwsmn-head", "rwsmn-session1", "rwsmn-session2"]
    assert [n.address for n in t.nodes] == ["10.213.37.10", "10.213.37.11", "10.213.37.12"]
    assert t.bridge == "rwsmn-br" and t.bridge_address == "10.213.37.1"
    assert [n.name for n in t.with_role("session")] == ["session1", "session2"]
    assert [n.name for n in t.with_role("accelerator")] == ["head"]  # by its resources
    assert all(len(n.host_veth) <= 15 and len(n.peer_veth) <= 15 for n in t.nodes)


@pytest.mark.parametrize(
    "specs, kwargs",
    [
        ((NodeSpec("session"),), {}),  # the head comes first
        (DEFAULT_SPECS, {"subnet": "8.8.8.0/24"}),  # not private
        (DEFAULT_SPECS, {"subnet": "10.0.0.0/16"}),  # not a /24
        (DEFAULT_SPECS, {"prefix": "much-too-long-prefix"}),
    ],
)
def test_a_topology_that_cannot_be_built_is_refused(specs, kwargs):
    with pytest.raises(ValueError):
        Topology(specs, **kwargs)


def test_leftovers_are_only_names_of_the_prefix():
    found = leftovers(
        ["lo", "eth0", "rwsmn-br", "rwsmn-v1", "rwsmnx"],
        ["rwsmn-head", "other-ns"],
        [Path("/tmp/rwsmn-abc"), Path("/tmp/rws-ray-x")],
    )
    assert found == [
        "interface rwsmn-br",
        "interface rwsmn-v1",
        "namespace rwsmn-head",
        "directory /tmp/rwsmn-abc",
    ]
    assert leftovers(["lo", "eth0"], [], []) == []
    assert leftovers(["rwsmn-br"], [], [], prefix="rwsmx") == []


def test_only_routes_within_the_bridge_subnet_pass():
    ok = [
        {"dst": "10.213.37.0/24", "dev": "eth0", "protocol": "kernel", "scope": "link"},
        {"type": "local", "dst": "10.213.37.11", "dev": "eth0", "table": "local"},
        {"type": "broadcast", "dst": "10.213.37.255", "dev": "eth0", "table": "local"},
        {"type": "local", "dst": "127.0.0.0/8", "dev": "lo", "table": "local"},
        {"type": "blackhole", "dst": "10.213.37.12"},  # a partition
    ]
    assert foreign_routes(ok, "10.213.37.0/24") == []
    bad = [
        {"dst": "default", "gateway": "10.213.37.1", "dev": "eth0"},
        {"dst": "192.0.2.0/24", "dev": "eth0"},
        {"dst": "10.213.0.0/16", "dev": "eth0"},
        {"dst": "10.0.0.0/8", "via": "10.213.37.1"},
    ]
    assert foreign_routes(ok + bad, "10.213.37.0/24") == bad


def test_the_balancer_checks_readyz_in_tcp_mode_with_the_given_timings(tmp_path):
    s = BalancerSettings(inter_ms=500, fall=3, rise=1, tunnel_s=600)
    cfg = config(
        s, "10.213.37.1", {"session1": "10.213.37.11", "session2": "10.213.37.12"}, tmp_path / "s.sock"
    )
    lines = [ln.strip() for ln in cfg.splitlines()]
    assert "mode tcp" in lines and "bind 10.213.37.1:8765" in lines
    assert "option httpchk GET /readyz" in lines and "http-check expect status 200" in lines
    assert "default-server inter 500ms fall 3 rise 1" in lines
    assert "timeout tunnel 600s" in lines
    assert (
        "server session1 10.213.37.11:8765 check" in lines
        and "server session2 10.213.37.12:8765 check" in lines
    )


def test_the_balancers_runtime_answers_are_read():
    stat = (
        "# pxname,svname,qcur,stot,status,check_status\n"
        "responses,FRONTEND,,9,OPEN,\n"
        "sessions,session1,0,5,UP,L7OK\n"
        "sessions,session2,0,4,DOWN,L4CON\n"
        "sessions,BACKEND,0,9,UP,\n"
    )
    assert server_states(stat) == {"session1": "UP", "session2": "DOWN"}
    assert session_counts(stat) == {"session1": 5, "session2": 4}
    sess = (
        "0x55d0: proto=tcpv4 src=10.213.37.1:40001 fe=responses be=sessions srv=session1 ts=00 age=3s\n"
        "0x55d1: proto=tcpv4 src=10.213.37.1:40002 fe=responses be=sessions srv=session2 ts=00 age=1s\n"
        "0x55d2: proto=unix_stream src=unix:1 fe=GLOBAL be=<NONE> srv=<none> ts=00 age=0s\n"
    )
    assert session_servers(sess) == {40001: "session1", 40002: "session2"}


def test_the_harness_leaves_serves_draining_settings_at_rays_defaults(monkeypatch):
    """Not set by the harness, nor passed on from the environment it was started in."""
    monkeypatch.setenv("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "1")
    env = Harness().env  # building one starts nothing
    assert not any("DRAINING" in k for k in env)
    assert {k: env[k] for k in RAY_ENV} == RAY_ENV and env["RAY_AUTH_TOKEN"]


def test_the_tiers_client_node_and_job_server():
    """The client node comes after the others (the session nodes keep their addresses), carries
    the ``client`` resource and CPUs, and nothing else asks for it; the job server's address
    is the head's, only when asked for; the nodes' PATH starts with this interpreter's scripts
    (a job's ``responses-ws``)."""
    import sys

    h = Harness((*DEFAULT_SPECS, CLIENT_SPEC), job_server=True)
    t = h.topology
    assert [(n.name, n.address) for n in t.nodes][-1] == ("client1", "10.213.37.13")
    assert [n.name for n in h.client_nodes] == ["client1"] and h.client_nodes[0].spec.num_cpus > 0
    assert [n.name for n in h.session_nodes] == ["session1", "session2"]
    assert h.job_address == "http://10.213.37.10:8265"
    assert h.env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    with pytest.raises(RuntimeError, match="job_server=True"):
        _ = Harness().job_address
