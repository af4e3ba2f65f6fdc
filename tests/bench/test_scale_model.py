"""The capacity model's arithmetic (bench/scale_model.py, docs/scaling.md "A capacity model to
1000 session nodes"): lines fitted to the harness's node counts, the store's primaries, the
session nodes one Ray cluster takes and the part that bounds it."""

from __future__ import annotations

import pytest

from bench.scale_model import (
    Deployment,
    Limits,
    Line,
    Measured,
    demands,
    fit_line,
    session_nodes_per_cluster,
    size,
    slope_error,
    store_cmds_per_s,
    store_cpu_ms_per_s,
    store_primaries,
)


def measured(**over: object) -> Measured:
    base: dict[str, object] = {
        "gcs_thread_ms_per_s": Line(10.0, 1.0),  # full (500 ms/s at headroom 0.5) at 490 nodes
        "controller_thread_ms_per_s": Line(30.0, 2.0),  # full at 235 nodes
        "head_raylet_thread_ms_per_s": Line(5.0, 0.0),  # never grows
        "store_cmds_per_turn": 10.0,
        "store_bytes_per_turn": 5000.0,
        "store_cpu_us_per_turn": 200.0,
        "store_cmds_per_connection_s": 0.5,
        "store_cpu_us_per_connection_s": 10.0,
        "actors_per_session_node": 3.0,
    }
    base.update(over)
    return Measured(**base)  # type: ignore[arg-type]


DEPLOY = Deployment(turns_per_node_s=100.0, connections_per_node=200.0)


def test_a_line_through_collinear_points_is_found_exactly():
    line = fit_line([(1, 12.0), (2, 14.0), (3, 16.0)])
    assert line.base == pytest.approx(10.0)
    assert line.per_node == pytest.approx(2.0)
    assert line.at(1000) == pytest.approx(2010.0)


def test_one_distinct_node_count_is_a_line_through_the_origin_and_the_mean():
    line = fit_line([(2, 10.0), (2, 14.0)])
    assert (line.base, line.per_node) == (0.0, pytest.approx(6.0))
    with pytest.raises(ValueError):
        fit_line([])


def test_the_least_squares_line_of_noisy_points_and_its_slopes_standard_error():
    points = [(1, 10.0), (2, 13.0), (3, 14.0)]
    line = fit_line(points)  # slope 2, through the means (2, 12.33)
    assert line.per_node == pytest.approx(2.0)
    assert line.base == pytest.approx(37 / 3 - 4)
    # residuals -1/3, 2/3, -1/3: sum of squares 2/3, one degree of freedom, Sxx 2
    assert slope_error(points, line) == pytest.approx((2 / 3 / 1 / 2) ** 0.5)
    assert slope_error([(1, 12.0), (2, 14.0), (3, 16.0)], fit_line([(1, 12.0), (2, 14.0), (3, 16.0)])) == 0.0
    assert slope_error(points[:2], line) == 0.0  # two points: no residual to judge by


def test_the_store_carries_turns_and_open_connections_and_its_primaries_are_cores_at_headroom():
    # 100 nodes × (100 turns/s × 10 + 200 connections × 0.5) = 110 000 commands/s
    assert store_cmds_per_s(measured(), DEPLOY, 100) == pytest.approx(110_000)
    # 100 × (100 × 200 µs + 200 × 10 µs) = 2200 ms of CPU a second; 500 a primary at half a core
    assert store_cpu_ms_per_s(measured(), DEPLOY, 100) == pytest.approx(2200.0)
    assert store_primaries(measured(), DEPLOY, Limits(), 100) == 5
    assert store_primaries(measured(), DEPLOY, Limits(), 0) == 1  # never none


def test_each_part_is_measured_against_its_planned_share_of_its_limit():
    parts = {d.part: d for d in demands(measured(), DEPLOY, Limits(headroom=0.5), 100)}
    assert parts["gcs_thread"].demand == pytest.approx(110.0)
    assert parts["gcs_thread"].share == pytest.approx(110.0 / 500.0)
    assert parts["ray_nodes"].demand == 101  # and the head
    assert parts["ray_nodes"].limit == 1500
    assert parts["ray_actors"].demand == pytest.approx(302.0)  # 3 a node, the controller and a replica


def test_the_part_that_fills_first_bounds_a_ray_cluster():
    assert session_nodes_per_cluster(measured(), DEPLOY, Limits()) == (235, "serve_controller_thread")
    # a controller that never grows leaves the GCS to bound it
    flat = measured(controller_thread_ms_per_s=Line(30.0, 0.0))
    assert session_nodes_per_cluster(flat, DEPLOY, Limits()) == (490, "gcs_thread")
    # nothing that grows: the published counts bound it (nodes: 1500 planned, less the head)
    none = measured(
        gcs_thread_ms_per_s=Line(1, 0), controller_thread_ms_per_s=Line(1, 0), actors_per_session_node=0.0
    )
    assert session_nodes_per_cluster(none, DEPLOY, Limits()) == (1499, "ray_nodes")


def test_a_part_already_past_its_limit_takes_no_session_node():
    over = measured(gcs_thread_ms_per_s=Line(600.0, 1.0))
    assert session_nodes_per_cluster(over, DEPLOY, Limits()) == (0, "gcs_thread")
    assert size(over, DEPLOY, Limits(), 10).ray_clusters == 10  # one node a cluster, at least


def test_past_the_bound_the_deployment_is_several_ray_clusters_sharing_one_store():
    small = size(measured(), DEPLOY, Limits(), 100)
    assert (small.ray_clusters, small.session_nodes_per_cluster) == (1, 100)
    assert small.first_bottleneck == "serve_controller_thread"  # 230/500, the highest share
    big = size(measured(), DEPLOY, Limits(), 1000)
    assert big.ray_clusters == 5  # ceil(1000 / 235)
    assert big.session_nodes_per_cluster == 200
    assert big.split_by == "serve_controller_thread"
    assert big.store_primaries == 44  # 22 000 ms of Redis CPU a second / 500 ms
    assert big.redis_cluster_nodes == 88 and big.redis_cluster_fits
    assert big.store_mb_per_s == pytest.approx(1000 * 100 * 5000 / 1e6)


def test_a_store_past_the_specs_node_count_is_flagged():
    heavy = measured(store_cpu_us_per_turn=20_000.0)  # 100 × the CPU per turn: 4400 primaries
    assert not size(heavy, DEPLOY, Limits(), 1000).redis_cluster_fits
