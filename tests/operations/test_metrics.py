"""Metrics: every series configs/grafana-dashboard.json charts is exported by Ray's metrics
endpoint of the suite's cluster once the app has served some traffic, but for the counters of
events the traffic does not cause (a failed handoff), which Ray exports from their first
increment and the dashboard reads as 0 until then; names are prefixed and durations are in
seconds."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import websockets
from prometheus_client.parser import text_string_to_metric_families

from bench.client import ws_url
from serve.embedded import metrics_urls
from tests.support.wire import raw_collect

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "configs" / "grafana-dashboard.json"
TEXT = {"emulator.tool_rounds": "0", "emulator.text_tokens": "8"}
METRIC_CLASSES = {"Counter", "Gauge", "Histogram"}


ZERO_UNTIL_EXPORTED = " or vector(0)"  # PromQL: a sum over no series reads as 0


def dashboard_series(*, zero_until_exported: bool = False) -> dict[str, dict[str, str]]:
    """Every ``ray_responses_ws_*`` series the dashboard queries, with the exact label
    values its selector requires (``{phase="api_overhead"}``): those it must find, or with
    ``zero_until_exported`` those whose query reads their absence as 0."""
    series: dict[str, dict[str, str]] = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            if target["expr"].endswith(ZERO_UNTIL_EXPORTED) != zero_until_exported:
                continue
            for name, selector in re.findall(r"(ray_responses_ws_\w+)(\{[^}]*\})?", target["expr"]):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', selector))
                series.setdefault(name + json.dumps(labels, sort_keys=True), labels | {"__name__": name})
    return dict(series.items())


def scrape() -> list[tuple[str, dict[str, str]]]:
    samples = []
    for url in metrics_urls():
        text = httpx.get(url, timeout=10).text
        samples += [(s.name, s.labels) for fam in text_string_to_metric_families(text) for s in fam.samples]
    return samples


def missing(wanted: dict[str, dict[str, str]], samples: list[tuple[str, dict[str, str]]]) -> list[str]:
    out = []
    for key, labels in wanted.items():
        name = labels["__name__"]
        need = {k: v for k, v in labels.items() if k != "__name__"}
        if not any(n == name and all(lab.get(k) == v for k, v in need.items()) for n, lab in samples):
            out.append(key)
    return sorted(out)


async def traffic(url: str) -> None:
    """WebSocket turns (the second reuses the first's prefix), an HTTP response, and an
    upgrade refused with 400 (a resume token that resumes nothing)."""
    long_input = "Please review this file. " + "def handler(event):\n    return process(event)\n" * 150
    async with websockets.connect(ws_url(url)) as ws:
        previous = None
        for text in (long_input, "And now the tests?"):
            create = {
                "type": "response.create",
                "model": "emu-fast",
                "store": False,
                "input": text,
                "metadata": TEXT,
                **({"previous_response_id": previous} if previous else {}),
            }
            await ws.send(json.dumps(create))
            event = (await raw_collect(ws))[-1]
            assert event["type"] == "response.completed", event
            previous = event["response"]["id"]
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        assert (
            await http.post(
                "/v1/responses", json={"model": "emu-fast", "input": "Hi", "store": False, "metadata": TEXT}
            )
        ).status_code == 200
    try:
        async with websockets.connect(
            ws_url(url), additional_headers={"x-responses-ws-resume-token": "not-a-token"}
        ):
            raise AssertionError("the upgrade was accepted")
    except websockets.InvalidStatus as exc:
        assert exc.response.status_code == 400


def declared_metrics() -> list[str]:
    """The names of the metrics the product's code declares (``metrics.Counter("…")``)."""
    names = []
    for path in [*ROOT.glob("actors/**/*.py"), *ROOT.glob("serve/*.py"), *ROOT.glob("inference/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in METRIC_CLASSES
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.append(node.args[0].value)
    return names


def test_what_the_dashboard_reads_as_zero_until_exported_is_a_declared_counter():
    later = {lab["__name__"] for lab in dashboard_series(zero_until_exported=True).values()}
    assert later == {
        "ray_responses_ws_pool_host_stops_total",
        "ray_responses_ws_handoff_failures_total",
        "ray_responses_ws_store_write_failures_total",
    }
    declared = {"ray_" + name + "_total" for name in declared_metrics()}
    assert later <= declared


def test_every_metric_the_dashboard_charts_is_exported(ray_cluster, server_url):
    wanted = dashboard_series()
    assert len({lab["__name__"] for lab in wanted.values()}) >= 15
    asyncio.run(traffic(server_url))
    deadline = time.monotonic() + 60  # Ray's metrics agent exports every few seconds
    while (gone := missing(wanted, samples := scrape())) and time.monotonic() < deadline:
        time.sleep(1)
    assert not gone, f"charted but not exported: {gone}"
    refused_400 = [
        lab for n, lab in samples if n == "ray_responses_ws_refusals_total" and lab.get("status") == "400"
    ]
    assert refused_400
    hosts = {lab["host"] for n, lab in samples if n == "ray_responses_ws_host_connections"}
    assert hosts and all(h.startswith("rws-") for h in hosts)  # the session hosts' actor names


def test_the_dashboard_is_grafana_json_with_a_prometheus_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "responses-ws" and dashboard["panels"]
    assert [v["type"] for v in dashboard["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]


def test_metric_names_are_prefixed_and_durations_are_in_seconds():
    names = declared_metrics()
    assert len(names) >= 20
    assert all(n.startswith("responses_ws_") for n in names), names
    assert not [n for n in names if re.search(r"_(ms|millis|us)(_|$)", n)], names
    assert not [n for n in names if n.endswith("_total")], "Ray adds _total to counters"
