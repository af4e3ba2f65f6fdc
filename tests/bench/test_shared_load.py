"""The capacity model's measurement, its pure parts (bench/multinode/shared_load.py and the
``--model`` figures of bench/multinode/scaling.py): Ray's Prometheus text read for the GCS's
RPCs, Redis's ``INFO`` flattened, a window's rates less the sampler's own commands, and the
store's figures per turn net of the idle window."""

from __future__ import annotations

import pytest

from bench.multinode.scaling import actors_per_node, measured_inputs, net_store
from bench.multinode.shared_load import (
    INFO_REQUEST_BYTES,
    busiest_thread,
    gcs_rpcs,
    own_share_removed,
    redis_counters,
    window,
)

PROMETHEUS = """# HELP ray_grpc_server_req_finished_total Finished requests
# TYPE ray_grpc_server_req_finished_total counter
ray_grpc_server_req_finished_total{Component="gcs_server",Method="NodeResourceInfoGcsService.grpc_server.GetDrainingNodes",NodeAddress="10.0.0.10"} 42.0
ray_grpc_server_req_finished_total{Component="gcs_server",Method="NodeInfoGcsService.grpc_server.GetAllNodeInfo",NodeAddress="10.0.0.10"} 7.0
ray_grpc_server_req_finished_total{Component="raylet",Method="NodeManagerService.grpc_server.GetResourceLoad",NodeAddress="10.0.0.10"} 99.0
ray_grpc_server_req_new_total{Component="gcs_server",Method="NodeInfoGcsService.grpc_server.GetAllNodeInfo"} 8.0
"""


def test_the_gcss_finished_rpcs_are_read_by_method_and_other_components_left_out():
    assert gcs_rpcs(PROMETHEUS) == {
        "NodeResourceInfoGcsService.GetDrainingNodes": 42.0,
        "NodeInfoGcsService.GetAllNodeInfo": 7.0,
    }
    assert gcs_rpcs(PROMETHEUS, "raylet") == {"NodeManagerService.GetResourceLoad": 99.0}


def test_redis_info_is_flattened_to_counters():
    info = {
        "total_commands_processed": 120,
        "total_net_input_bytes": 5000,
        "total_net_output_bytes": 800,
        "used_cpu_user": 1.5,
        "used_cpu_sys": 0.25,
        "used_memory": 1 << 20,
        "cmdstat_evalsha": {"calls": 10, "usec": 300},
        "cmdstat_info": {"calls": 4},
        "redis_version": "7.0.15",
    }
    out = redis_counters(info)
    assert out["redis/commands"] == 120 and out["redis/cpu_s"] == pytest.approx(1.75)
    assert out["redis/cmd/evalsha"] == 10 and out["redis/cmd/info"] == 4
    assert "redis/redis_version" not in out


def test_the_samplers_own_info_commands_are_taken_off():
    delta = {
        "redis/commands": 30.0,
        "redis/net_input_bytes": 1000.0,
        "redis/cmd/info": 5.0,
        "redis/cmd/set": 2.0,
    }
    out = own_share_removed(delta)
    assert out == {
        "redis/commands": 25.0,
        "redis/net_input_bytes": 1000.0 - 5 * INFO_REQUEST_BYTES,
        "redis/cmd/set": 2.0,
    }


def test_a_window_is_rates_between_its_first_and_last_sample_inside():
    samples = [
        (9.0, {"redis/commands": 0.0}),  # before the window
        (10.0, {"redis/commands": 100.0, "cpu/head/gcs_server": 1.0, "redis/used_memory_bytes": 5.0}),
        (12.0, {"redis/commands": 160.0, "cpu/head/gcs_server": 1.05, "gcs_rpc/X": 4.0}),
        (14.0, {"redis/commands": 200.0, "cpu/head/gcs_server": 1.1, "gcs_rpc/X": 10.0}),
        (20.0, {"redis/commands": 999.0}),  # after it
    ]
    rates, span = window(samples, 9.5, 15.0)
    assert span == 4.0
    assert rates["redis/commands"] == pytest.approx(25.0)
    assert rates["cpu/head/gcs_server"] == pytest.approx(25.0)  # CPU seconds → ms per second
    assert rates["gcs_rpc/X"] == pytest.approx(2.5)  # missing from the first sample: counted from 0
    assert "redis/used_memory_bytes" not in rates  # a level, not a counter
    assert window(samples, 10.5, 11.5) == ({}, 0.0)


def test_the_busiest_thread_of_a_process():
    rates = {"thread/head/gcs_server/1": 3.0, "thread/head/gcs_server/2": 8.0, "thread/head/raylet/3": 20.0}
    assert busiest_thread(rates, "head/gcs_server") == 8.0
    assert busiest_thread(rates, "head/ray::ServeController") == 0.0


def window_figures(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "redis_cmds_per_s": 1.0,
        "redis_net_input_bytes_per_s": 70.0,
        "redis_cpu_ms_per_s": 2.0,
        "gcs_cpu_ms_per_s": 20.0,
        "serve_controller_cpu_ms_per_s": 40.0,
        "head_raylet_cpu_ms_per_s": 7.0,
        "session_node_cpu_ms_per_s": {"session1": 50.0},
    }
    base.update(over)
    return base


def level(k: int) -> dict[str, object]:
    """A node count's windows: the GCS 2 ms/s a node above 18, the controller flat."""
    gcs = 18.0 + 2.0 * k
    load = window_figures(
        gcs_cpu_ms_per_s=gcs,
        redis_cmds_per_s=1.0 + 10.0 * k,  # 10 commands a turn at 1 turn/s a node, over the idle 1
        redis_net_input_bytes_per_s=70.0 + 500.0 * k,
        redis_cpu_ms_per_s=2.0 + 0.4 * k,  # 400 µs a turn
        session_node_cpu_ms_per_s={f"session{i}": 25.0 for i in range(1, k + 1)},  # 25 ms a turn
        turns_per_s=float(k),
        loops=4 * k,
    )
    held = window_figures(gcs_cpu_ms_per_s=gcs, redis_cmds_per_s=1.0 + 0.8 * k * 10, connections=10 * k)
    return {
        "session_nodes": k,
        "idle": window_figures(gcs_cpu_ms_per_s=gcs),
        "store_false": load,
        "resume_store_false": load,
        "resume_held": held,
        "actors_by_node": {
            "head": {"ray::ServeController": 1},
            **{
                f"session{i}": {"ray::ServeReplica:x:Gateway": 1, "ray::DashboardAgent": 1}
                for i in range(1, k + 1)
            },
        },
    }


def test_the_stores_figures_per_turn_and_per_held_connection_are_net_of_the_idle_window():
    lv = level(2)
    assert net_store(lv, "store_false") == pytest.approx({"cmds": 10.0, "bytes": 500.0, "cpu_us": 400.0})
    assert net_store(lv, "resume_held")["cmds"] == pytest.approx(0.8)


def test_the_models_inputs_from_a_results_file():
    m, node = measured_inputs({"levels": [level(1), level(2), level(3)]})
    assert m.gcs_thread_ms_per_s.per_node == pytest.approx(2.0)
    assert m.gcs_thread_ms_per_s.base == pytest.approx(18.0)
    assert m.controller_thread_ms_per_s.per_node == pytest.approx(0.0)
    assert m.store_cmds_per_turn == pytest.approx(10.0) and m.store_cpu_us_per_turn == pytest.approx(400.0)
    assert m.store_cmds_per_connection_s == pytest.approx(0.8)
    assert m.actors_per_session_node == 1  # Ray's agents are not actors
    assert node == {
        "session_node_cpu_ms_per_turn": pytest.approx(25.0),
        "s_between_a_loops_turns": pytest.approx(4.0),
    }
    assert actors_per_node({"actors_by_node": {"head": {}}}) is None
