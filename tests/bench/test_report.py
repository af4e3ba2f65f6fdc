"""The report of a scaling experiment (bench/report): the schema of scaling.json, the files
write_report writes, the tables, the progress line and the live page's server — on a
hand-written example document (tests/bench/data/scaling-example.json, not a measurement)."""

from __future__ import annotations

import copy
import csv
import io
import json
import re
import urllib.request
from html import escape
from pathlib import Path

import pytest

from bench.report import LivePage, progress_line, validate, write_report
from bench.report.page import report_html
from bench.report.schema import violations

EXAMPLE = Path(__file__).parent / "data" / "scaling-example.json"


@pytest.fixture
def doc() -> dict:
    return json.loads(EXAMPLE.read_text())


def throughput_points(html: str) -> list[str]:
    """The data-step of every point of the throughput figure."""
    figure = re.search(r'<figure class="chart" id="fig-throughput">.*?</figure>', html, re.S)
    assert figure is not None
    return re.findall(r'<circle class="point[^"]*" data-step="(\d+)"', figure.group())


def test_the_example_is_valid(doc):
    validate(doc)
    assert violations(doc) == []


@pytest.mark.parametrize(
    ("breakage", "path"),
    [
        (lambda d: d.pop("steps"), "$"),
        (lambda d: d.pop("load_nodes"), "$"),
        (lambda d: d["provenance"].pop("git_commit"), "$.provenance"),
        (lambda d: d["steps"][3]["nodes"][1].pop("turns"), "$.steps[3].nodes[1]"),
        (lambda d: d["steps"][2]["nodes"][0].update(turns=-1), "$.steps[2].nodes[0].turns"),
        (lambda d: d["steps"][0].update(valid="yes"), "$.steps[0].valid"),
        (lambda d: d["steps"][5].update(transport="carrier-pigeon"), "$.steps[5].transport"),
        (lambda d: d["steps"][1].update(session_nodes=0), "$.steps[1].session_nodes"),
        (lambda d: d["steps"][1]["nonmodel_ms"].pop("p99"), "$.steps[1].nonmodel_ms"),
        (lambda d: d["load_nodes"][0].pop("node_ip"), "$.load_nodes[0]"),
        (lambda d: d["provenance"]["nodes"][0].update(cpus="two"), "$.provenance.nodes[0].cpus"),
    ],
)
def test_the_schema_rejects_a_broken_document_naming_where(doc, breakage, path):
    breakage(doc)
    with pytest.raises(ValueError, match=re.escape(f"at {path}:")):
        validate(doc)


def test_the_first_of_several_violations_is_named_and_the_rest_counted(doc):
    doc["steps"][0].update(valid="yes")
    doc["steps"][4].update(turns=-3)
    with pytest.raises(ValueError, match=r"at \$\.steps\[0\]\.valid: .* \(and 1 more\)"):
        validate(doc)


def test_the_first_violation_is_first_in_document_order(doc):
    doc["steps"][10].update(valid="no")
    doc["steps"][2].update(valid="no")
    with pytest.raises(ValueError, match=r"at \$\.steps\[2\]\.valid"):
        validate(doc)


def test_fields_the_schema_does_not_name_are_allowed(doc):
    doc["steps"][0]["gateway_replicas"] = 2
    doc["extra"] = {"anything": True}
    validate(doc)


def test_write_report_writes_every_file(doc, tmp_path):
    written = write_report(doc, tmp_path / "out")
    assert set(written) == {"scaling.json", "report.html", "scaling.csv", "scaling-nodes.csv", "scaling.md"}
    assert json.loads(written["scaling.json"].read_text()) == doc
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(written)
    from bench.report.page import DATA_FILES

    assert set(DATA_FILES) <= set(written), "the report links only files written beside it"


def test_write_report_refuses_an_invalid_document_and_writes_nothing(doc, tmp_path):
    del doc["steps"][0]["nodes"]
    with pytest.raises(ValueError, match=r"\$\.steps\[0\]"):
        write_report(doc, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_csv_has_a_row_a_step_and_a_row_a_session_node_a_step(doc, tmp_path):
    written = write_report(doc, tmp_path)
    steps = list(csv.DictReader(io.StringIO(written["scaling.csv"].read_text())))
    assert [int(r["step"]) for r in steps] == [s["index"] for s in doc["steps"]]
    assert [r["valid"] for r in steps].count("false") == 1
    last = steps[-1]
    assert last["invalid_reason"] == doc["steps"][-1]["invalid_reason"]
    assert float(last["turns_per_s"]) == pytest.approx(doc["steps"][-1]["turns_per_s"], rel=1e-3)
    nodes = list(csv.DictReader(io.StringIO(written["scaling-nodes.csv"].read_text())))
    assert len(nodes) == 3 * len(doc["steps"])  # every session node, in service or not
    for step in doc["steps"]:
        mine = [r for r in nodes if int(r["step"]) == step["index"] and r["in_service"] == "true"]
        assert len(mine) == step["session_nodes"]
        assert sum(int(r["turns"]) for r in mine) == sum(n["turns"] for n in step["nodes"])
        assert sum(float(r["turns_share"]) for r in mine) == pytest.approx(1.0, abs=1e-3)
        out = [r for r in nodes if int(r["step"]) == step["index"] and r["in_service"] == "false"]
        assert [(r["turns"], r["turns_share"]) for r in out] == [("0", "")] * (3 - step["session_nodes"])


def test_the_cpu_by_role_of_a_step_is_weighted_by_the_turns_each_node_served(doc):
    from bench.report.tables import role_ms

    step = {
        "nodes": [
            {"turns": 300, "cpu_ms_per_turn": {"gateway": 1.0}},
            {"turns": 100, "cpu_ms_per_turn": {"gateway": 3.0}},
        ]
    }
    assert role_ms(step, "gateway") == pytest.approx(1.5)
    assert role_ms({"nodes": []}, "gateway") is None


def test_the_markdown_tables_have_a_row_a_step(doc, tmp_path):
    text = write_report(doc, tmp_path)["scaling.md"].read_text()
    assert doc["provenance"]["command"] in text
    steps_table = text.split("## Steps")[1].split("## Session nodes")[0]
    rows = [line for line in steps_table.splitlines() if line.startswith("| ")]
    assert len(rows) == 2 + len(doc["steps"])  # the header and its rule
    assert all(line.count("|") == rows[0].count("|") for line in rows)


def test_the_report_draws_one_throughput_point_a_step_and_marks_the_invalid_one(doc):
    html = report_html(doc)
    assert sorted(throughput_points(html), key=int) == [str(s["index"]) for s in doc["steps"]]
    invalid = re.findall(r'<circle class="point invalid" data-step="(\d+)"', html)
    assert set(invalid) == {str(s["index"]) for s in doc["steps"] if not s["valid"]}
    assert "clients saturated, not the server" in html
    assert escape(doc["steps"][-1]["invalid_reason"]) in html


def test_the_report_is_self_contained(doc):
    html = report_html(doc)
    assert "<script" not in html
    assert "<img" not in html and '<link rel="stylesheet"' not in html and " src=" not in html
    # links: the favicon (inline) and the run's own files beside the report, nothing else
    links = set(re.findall(r'href="([^"]*)"', html))
    assert links == {"data:,", "scaling.json", "scaling.csv", "scaling-nodes.csv", "scaling.md"}
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_the_report_shows_the_provenance(doc):
    html = report_html(doc)
    prov = doc["provenance"]
    for text in (prov["git_commit"], prov["ray_version"], prov["nodes"][-1]["node_ip"], "session_node=1"):
        assert text in html
    assert "The Serve config in force" in html


def test_a_partial_run_says_so(doc):
    doc["complete"] = False
    doc["steps"] = doc["steps"][:5]
    html = report_html(doc)
    assert 'data-state="partial"' in html and "after 5 of 12 steps" in html
    assert len(throughput_points(html)) == 5


def test_a_run_with_no_model_and_a_step_without_turns_renders(doc):
    doc.pop("model")
    step = doc["steps"][0]
    step.update(
        turns=0, turns_per_s=0.0, nonmodel_ms={"p50": None, "p99": None}, ttft_ms={"p50": None, "p99": None}
    )
    for node in step["nodes"]:
        node.update(turns=0, cpu_ms_per_turn=None)
    validate(doc)
    html = report_html(doc)
    assert 'id="model"' not in html and len(throughput_points(html)) == len(doc["steps"])


def test_the_progress_line(doc):
    total = len(doc["steps"])
    first = progress_line(doc["steps"][0], total)
    assert first.startswith(f"[ 1/{total}]") and " ws " in first
    assert "1 session node " in first and "4 loops (4/node)" in first
    assert f"{doc['steps'][0]['turns_per_s']:.1f} turns/s" in first
    assert "non-model p50 4.3 p99 14.9 ms" in first and first.endswith("ok")
    failed = progress_line(doc["steps"][3], total)
    assert "2 failed" in failed
    retried = progress_line({**doc["steps"][0], "failures": {"connect:http_503": 1}}, total)
    assert "1 connect attempt failed" in retried and "1 failed" not in retried  # no failed turn
    last = progress_line(doc["steps"][-1], total)
    assert last.startswith(f"[{total}/{total}]") and "http-full" in last
    assert last.endswith(f"INVALID ({doc['steps'][-1]['invalid_reason']})")
    assert "\n" not in first + failed + last


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def test_the_live_page_serves_the_document_so_far(doc):
    partial = copy.deepcopy(doc)
    partial["steps"] = doc["steps"][:2]
    partial["provenance"]["finished_at"] = None
    with LivePage("127.0.0.1", 0) as page:
        assert page.url.startswith("http://127.0.0.1:")
        assert b'id="content"' in fetch(page.url)
        assert json.loads(fetch(page.url + "figures.json"))["revision"] == -1
        page.update(partial)
        figures = json.loads(fetch(page.url + "figures.json"))
        assert figures["revision"] == 0 and figures["steps"] == 2
        assert len(throughput_points(figures["html"])) == 2
        assert 'data-state="running"' in figures["html"]
        assert json.loads(fetch(page.url + "figures.json?since=0")) == {"revision": 0, "final": False}
        page.update(doc)
        assert json.loads(fetch(page.url + "figures.json?since=0"))["revision"] == 1
        assert json.loads(fetch(page.url + "figures.json?since=1")) == {"revision": 1, "final": True}
        assert json.loads(fetch(page.url + "scaling.json")) == doc
        url = page.url
    with pytest.raises(OSError):
        fetch(url)


@pytest.mark.parametrize("steps", [0, 1])
def test_a_run_of_no_step_or_one_step_renders(doc, steps):
    doc["steps"] = doc["steps"][:steps]
    doc["complete"] = False
    html = report_html(doc)
    assert len(throughput_points(html)) == steps
    assert f"after {steps} of 12 steps" in html
    assert ("no step yet" in html) == (steps == 0)


def test_the_live_page_refuses_a_document_that_breaks_the_schema(doc):
    page = LivePage("127.0.0.1", 0)
    del doc["steps"][0]["valid"]
    with pytest.raises(ValueError, match=r"at \$\.steps\[0\]: 'valid' is a required property"):
        page.update(doc)


def test_what_ws_changes_against_another_transport_is_over_matched_valid_steps_only():
    from bench.report.tables import versus

    def step(transport, nodes, tps, p50, valid=True):
        return {
            "transport": transport,
            "session_nodes": nodes,
            "loops_per_node": 8,
            "turns_per_s": tps,
            "nonmodel_ms": {"p50": p50, "p99": None},
            "valid": valid,
        }

    doc = {
        "steps": [
            step("ws", 1, 150.0, 2.0),
            step("http-full", 1, 100.0, 4.0),  # +50 % turns/s, -50 % non-model
            step("ws", 2, 300.0, 3.0),
            step("http-full", 2, 200.0, 4.0),  # +50 %, -25 %
            step("ws", 3, 900.0, 1.0),
            step("http-full", 3, 100.0, 9.0, valid=False),  # saturated: not compared
            step("http-chained", 4, 100.0, 9.0),  # no ws step to match
        ]
    }
    (found,) = versus(doc)
    assert found["transport"] == "http-full" and found["pairs"] == 2
    assert found["turns_per_s"] == pytest.approx(0.5)
    assert found["nonmodel_p50"] == pytest.approx(-0.375)
    assert found["nonmodel_p99"] is None


def test_the_schema_and_the_style_ship_with_the_lab_as_package_data():
    import tomllib

    root = Path(__file__).resolve().parents[2]
    lab = tomllib.loads((root / "bench" / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = set(lab["package-data"]["bench.report"])
    data = {p.name for p in (root / "bench" / "report").iterdir() if p.is_file() and p.suffix != ".py"}
    assert shipped == data


def test_a_node_whose_turns_are_not_known_renders_without_a_share(doc, tmp_path):
    step = doc["steps"][2]
    step["nodes"][1]["turns"] = None
    written = write_report(doc, tmp_path)
    nodes = list(csv.DictReader(io.StringIO(written["scaling-nodes.csv"].read_text())))
    mine = [r for r in nodes if int(r["step"]) == 2 and r["in_service"] == "true"]
    assert [r["turns_share"] for r in mine] == ["1", ""]


def test_a_partial_run_names_why_it_ended_and_the_notes_are_listed(doc):
    doc.update(
        complete=False,
        error="SetupError: session node 10.77.0.12 is not ready",
        notes=["no prefix-cache figure"],
    )
    doc["sampler_errors"] = {doc["steps"][0]["nodes"][0]["node_id"]: ["metrics endpoint refused"]}
    html = report_html(doc)
    assert "session node 10.77.0.12 is not ready" in html.split('id="status"')[1].split("</div>")[0]
    assert "no prefix-cache figure" in html and "metrics endpoint refused" in html


def test_the_capacity_model_is_drawn_from_its_fitted_lines_and_the_steps_measurements(doc):
    html = report_html(doc)
    figure = re.search(r'<figure class="chart" id="fig-model">.*?</figure>', html, re.S).group()
    valid = [s for s in doc["steps"] if s["valid"]]
    assert len(re.findall(r'<circle class="point"', figure)) == 3 * len(valid)  # three shared parts
    assert figure.count('class="series-line"') == 3  # a fitted line each
    model = html.split('id="model"')[1]
    assert "Fitted lines" in model and "slope_standard_error" in model and "Extrapolation" in model
    assert "gcs=0.155" in model  # a nested figure of a row, written out
    assert "not measured" in model


def test_a_node_out_of_service_that_served_turns_stands_out(doc):
    doc["steps"][0]["out_of_service"][0]["turns"] = 7
    html = report_html(doc)
    assert html.count('<tr class="stray">') == 1
    assert html.count('<tr class="out">') == sum(len(s["out_of_service"]) for s in doc["steps"]) - 1


LOOPBACK = Path(__file__).parent / "data" / "scaling-loopback.json"  # written by bench/experiment


def test_a_document_the_experiment_wrote_validates_and_renders():
    """scaling-loopback.json: what `responses-ws bench scaling --cluster` wrote on four `ray start`
    nodes on loopback (tests/cluster/test_scaling_experiment.py's first run, kept as it was)."""
    doc = json.loads(LOOPBACK.read_text())
    validate(doc)
    html = report_html(doc)
    assert sorted(throughput_points(html), key=int) == [str(s["index"]) for s in doc["steps"]]
    assert 'id="fig-model"' in html and 'id="fig-share"' in html
    assert "1 session node  1 loop (1/node)" in progress_line(doc["steps"][0], len(doc["steps"]))


def test_session_nodes_sharing_an_ip_are_told_apart_by_their_id():
    from bench.report.figures import node_names

    step = {
        "nodes": [
            {"node_id": "aaaaaa11", "node_ip": "10.0.0.1"},
            {"node_id": "bbbbbb22", "node_ip": "10.0.0.1"},
        ]
    }
    other = {"nodes": [{"node_id": "cccccc33", "node_ip": "10.0.0.2"}]}
    assert node_names({"steps": [step, other]}) == {
        "aaaaaa11": "10.0.0.1 (aaaaaa)",
        "bbbbbb22": "10.0.0.1 (bbbbbb)",
        "cccccc33": "10.0.0.2",
    }


@pytest.mark.parametrize(
    ("lo", "hi", "ticks"),
    [
        (0, 7.3, [0, 2, 4, 6, 8]),
        (0, 211, [0, 50, 100, 150, 200, 250]),
        (-1.8, 9.6, [-2.5, 0, 2.5, 5, 7.5, 10]),
    ],
)
def test_the_ticks_are_round_and_cover_the_values(lo, hi, ticks):
    from bench.report.svg import nice_ticks

    assert nice_ticks(lo, hi) == ticks


def test_the_report_is_written_again_from_a_scaling_json(doc, tmp_path, capsys):
    from bench.report.__main__ import main

    source = tmp_path / "copied" / "scaling.json"
    source.parent.mkdir()
    source.write_text(json.dumps(doc))
    assert main([str(source), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "report.html").is_file() and "report.html: " in capsys.readouterr().out
    del doc["steps"][1]["turns"]
    source.write_text(json.dumps(doc))
    assert main([str(source), "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "at $.steps[1]: 'turns' is a required property" in err
    assert not (tmp_path / "refused").exists()
