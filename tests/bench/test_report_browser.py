"""The report and the live page in a real browser (Debian's headless Chromium, driven over the
DevTools protocol by bench/report/browser.py): they load with no console error, draw one point
a step, and the live page redraws as the run goes on.  No Ray: a few seconds in all."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from bench.report import LivePage, write_report
from bench.report.browser import STEP_POINTS, BrowserError, Chromium, check_page

pytestmark = pytest.mark.integration  # a real browser: not the pure-logic tier

EXAMPLE = Path(__file__).parent / "data" / "scaling-example.json"


@pytest.fixture(scope="module")
def browser():
    if not any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")):
        pytest.fail(
            "chromium is not on PATH: install Debian's package (`apt-get install -y chromium`)", pytrace=False
        )
    with Chromium() as chromium:
        yield chromium


@pytest.fixture
def doc() -> dict:
    return json.loads(EXAMPLE.read_text())


def so_far(doc: dict, steps: int) -> dict:
    """The document as the driver has it after ``steps`` steps."""
    partial = copy.deepcopy(doc)
    partial["steps"] = doc["steps"][:steps]
    partial["provenance"]["finished_at"] = None
    partial.pop("model")
    return partial


def test_the_report_loads_with_no_error_and_shows_one_point_a_step(browser, doc, tmp_path):
    report = write_report(doc, tmp_path)["report.html"]
    tab = browser.open(report.as_uri())
    assert tab.count() == len(doc["steps"])
    steps = tab.evaluate(f"Array.from(document.querySelectorAll('{STEP_POINTS}')).map(p => +p.dataset.step)")
    assert sorted(steps) == [s["index"] for s in doc["steps"]]
    invalid = [s["index"] for s in doc["steps"] if not s["valid"]]
    assert (
        tab.evaluate(
            f"Array.from(document.querySelectorAll('{STEP_POINTS}.invalid')).map(p => +p.dataset.step)"
        )
        == invalid
    )
    assert tab.evaluate("document.getElementById('status').dataset.state") == "complete"
    width = tab.evaluate("document.querySelector('#fig-throughput svg').getBoundingClientRect().width")
    assert width > 300, "the chart is drawn at a readable size"
    tab.evaluate("1")  # every event sent before this answer is in
    assert tab.errors == []
    tab.close()


def test_the_checker_reports_console_errors_exceptions_and_failed_loads(browser, tmp_path):
    page = tmp_path / "broken.html"
    page.write_text(
        '<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
        '<img src="missing.png"><script>console.error("drawn wrong");'
        "setTimeout(function () { undefinedFunction(); }, 0);</script></body></html>"
    )
    tab = browser.open(page.as_uri())
    tab.wait_for("new Promise(r => setTimeout(() => r(true), 50))")  # after the timer's throw
    tab.evaluate("1")
    text = "\n".join(tab.errors)
    assert "console.error: drawn wrong" in text
    assert "uncaught exception: ReferenceError: undefinedFunction is not defined" in text
    assert "missing.png" in text
    tab.close()


def test_a_page_that_does_not_load_is_an_error(browser):
    with pytest.raises(BrowserError, match="did not load"):
        browser.open("http://127.0.0.1:9/")  # the discard port: nothing listens


def test_the_live_page_redraws_as_steps_arrive(browser, doc):
    with LivePage("127.0.0.1", 0, poll_ms=200) as live:
        tab = browser.open(live.url)
        assert tab.evaluate("document.getElementById('status').dataset.state") == "waiting"
        assert tab.count() == 0
        for steps in (1, 3, 7):
            live.update(so_far(doc, steps))
            tab.wait_for(f"document.querySelectorAll('{STEP_POINTS}').length === {steps}", timeout=15)
            assert tab.evaluate("document.getElementById('status').dataset.state") == "running"
        live.update(doc)
        tab.wait_for(f"document.querySelectorAll('{STEP_POINTS}').length === {len(doc['steps'])}", timeout=15)
        assert tab.evaluate("document.getElementById('status').dataset.state") == "complete"
        assert tab.evaluate("+document.body.dataset.revision") == 3
        tab.wait_for("document.body.dataset.final === 'true'", timeout=15)  # a finished run: polling stops
    tab.evaluate("new Promise(r => setTimeout(() => r(1), 600))")  # three polls' time after the server ended
    assert tab.errors == []
    tab.close()


def test_check_page_waits_for_the_live_pages_first_poll_and_leaves_nothing(doc):
    """check_page runs a browser of its own; its profile directory is removed at the end."""
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("rws-chromium-*"))
    with LivePage("127.0.0.1", 0, poll_ms=200) as live:
        live.update(so_far(doc, 4))
        result = check_page(live.url, expect=4)
    assert result.errors == [] and result.points == 4
    assert set(Path(tempfile.gettempdir()).glob("rws-chromium-*")) == before
