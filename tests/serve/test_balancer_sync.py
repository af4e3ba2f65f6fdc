"""The balancer sync's decisions (serve/balancer_sync.py): Serve's gateway replicas → HAProxy's
slots, as runtime-API commands.  The multi-node tier runs it against HAProxy and ``ray up``
(tests/multinode/test_ray_up.py)."""

from __future__ import annotations

import pytest

from serve.balancer_sync import Slot, SyncError, Want, parse_servers_state, plan, wanted_nodes

# `show servers state sessions` of HAProxy 2.6 with `server-template s 1-4 0.0.0.0:8765 check
# disabled`, after s2 was given an address and `state ready` (admin state 4: the template's
# `disabled` flag stays, the server is out of maintenance) and s3 `state drain` (12).
STATE = """1
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port
3 sessions 1 s1 0.0.0.0 0 5 1 1 2 1 0 0 14 0 0 0 - 8765 - 0 0 - - 0
3 sessions 2 s2 10.0.0.11 2 4 1 1 4 6 3 4 6 0 0 0 - 8765 - 0 0 - - 0
3 sessions 3 s3 10.0.0.12 2 12 1 1 4 6 3 4 6 0 0 0 - 8765 - 0 0 - - 0
3 sessions 4 s4 0.0.0.0 0 5 1 1 2 1 0 0 14 0 0 0 - 8765 - 0 0 - - 0
"""


def slots(*rows: tuple[str, str, str]) -> list[Slot]:
    return [Slot(name, addr, 8765, admin) for name, addr, admin in rows]


def test_haproxys_servers_state_is_read_as_slots():
    assert parse_servers_state(STATE, "sessions") == slots(
        ("s1", "0.0.0.0", "maint"),
        ("s2", "10.0.0.11", "ready"),
        ("s3", "10.0.0.12", "drain"),
        ("s4", "0.0.0.0", "maint"),
    )


def test_a_backend_without_servers_is_an_error():
    with pytest.raises(SyncError, match="no servers"):
        parse_servers_state(STATE, "other")


def test_a_nodes_slot_follows_its_replicas_running_first():
    replicas = [
        {"node_ip": "10.0.0.11", "state": "RUNNING"},
        {"node_ip": "10.0.0.12", "state": "STOPPING"},
        {"node_ip": "10.0.0.13", "state": "STARTING"},  # not yet
        {"node_ip": "10.0.0.14", "state": "STOPPING"},
        {"node_ip": "10.0.0.14", "state": "RUNNING"},  # a replacement runs there: ready
        {"node_ip": None, "state": "RUNNING"},
    ]
    assert wanted_nodes(replicas) == {
        "10.0.0.11": Want.READY,
        "10.0.0.12": Want.DRAIN,
        "10.0.0.14": Want.READY,
    }


@pytest.mark.parametrize(
    ("current", "wanted", "commands", "unplaced"),
    [
        # a new node takes the first free slot
        (
            [("s1", "10.0.0.11", "ready"), ("s2", "0.0.0.0", "maint")],
            {"10.0.0.11": Want.READY, "10.0.0.12": Want.READY},
            [
                "set server sessions/s2 addr 10.0.0.12 port 8765",
                "set server sessions/s2 state drain",
                "set server sessions/s2 health down",
                "set server sessions/s2 state ready",
            ],
            [],
        ),
        # nothing changed: nothing sent
        ([("s1", "10.0.0.11", "ready")], {"10.0.0.11": Want.READY}, [], []),
        # a node whose replica stops: drain; then gone: maint
        (
            [("s1", "10.0.0.11", "ready")],
            {"10.0.0.11": Want.DRAIN},
            ["set server sessions/s1 state drain"],
            [],
        ),
        ([("s1", "10.0.0.11", "drain")], {}, ["set server sessions/s1 state maint"], []),
        # a slot freed in this round is reused at once
        (
            [("s1", "10.0.0.11", "ready")],
            {"10.0.0.12": Want.READY},
            [
                "set server sessions/s1 state maint",
                "set server sessions/s1 addr 10.0.0.12 port 8765",
                "set server sessions/s1 state drain",
                "set server sessions/s1 health down",
                "set server sessions/s1 state ready",
            ],
            [],
        ),
        # a node that comes back to a slot left in maint
        (
            [("s1", "10.0.0.11", "maint")],
            {"10.0.0.11": Want.READY},
            [
                "set server sessions/s1 addr 10.0.0.11 port 8765",
                "set server sessions/s1 state drain",
                "set server sessions/s1 health down",
                "set server sessions/s1 state ready",
            ],
            [],
        ),
        # a node drained before it had a slot gets none; more nodes than slots: said
        (
            [("s1", "10.0.0.11", "ready")],
            {"10.0.0.11": Want.READY, "10.0.0.12": Want.DRAIN, "10.0.0.13": Want.READY},
            [],
            ["10.0.0.13"],
        ),
    ],
)
def test_the_plan_makes_the_slots_match_the_replicas(current, wanted, commands, unplaced):
    assert plan("sessions", slots(*current), wanted, 8765) == (commands, unplaced)
