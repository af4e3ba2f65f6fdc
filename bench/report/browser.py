"""A headless-Chromium checker of the pages the lab serves and writes (``report.html``, the
live page): Debian's ``chromium`` started with a temporary profile and the DevTools protocol
on a free port; a tab opens the page and collects every console error, failed load and
uncaught exception; :meth:`Tab.evaluate` runs a DOM query (how many points are drawn).  The
browser is ended by its process group and its profile removed, also on failure.

    python -m bench.report.browser file:///tmp/run/report.html --expect 12

prints the page's errors and its point count, and exits 1 on an error or another count."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

BINARIES = ("chromium", "chromium-browser", "google-chrome")  # Debian's package first
STEP_POINTS = (
    "#fig-throughput .point"  # one a step, in the report and the live page (bench/report/figures.py)
)
FLAGS = (
    "--headless=new",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",  # nothing fetched but the page
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--mute-audio",
    "--remote-debugging-port=0",  # a free port, written to the profile's DevToolsActivePort
)


class BrowserError(RuntimeError):
    """Chromium is missing, did not start, or a page did not load."""


def find_binary() -> str:
    for name in BINARIES:
        path = shutil.which(name)
        if path is not None:
            return path
    raise BrowserError("no chromium on PATH: install Debian's package (`apt-get install -y chromium`)")


@dataclass
class Tab:
    """One page, attached over the browser's DevTools connection."""

    browser: Chromium
    session_id: str
    errors: list[str] = field(default_factory=list)  # console errors, failed loads, exceptions
    events: list[str] = field(default_factory=list)  # the methods of the events seen

    def call(
        self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        return self.browser.call(method, params, self.session_id, timeout)

    def on_event(self, message: dict[str, Any]) -> None:
        method, params = message["method"], message.get("params", {})
        self.events.append(method)
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            described = (details.get("exception") or {}).get("description") or details.get("text", "")
            self.errors.append(f"uncaught exception: {described}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", ()))
            self.errors.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            self.errors.append(
                f"{entry.get('source', 'log')}: {entry.get('text', '')} {entry.get('url', '')}".strip()
            )

    def navigate(self, url: str, timeout: float = 30.0) -> None:
        """Open ``url`` and wait for its load event."""
        seen = len(self.events)
        result = self.call("Page.navigate", {"url": url}, timeout)
        if result.get("errorText"):
            raise BrowserError(f"{url} did not load: {result['errorText']}")
        self.browser.wait_until(
            lambda: "Page.loadEventFired" in self.events[seen:], timeout, f"{url} to load"
        )

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def count(self, selector: str = STEP_POINTS) -> int:
        """How many elements match ``selector``."""
        return int(self.evaluate(f"document.querySelectorAll({json.dumps(selector)}).length"))

    def wait_for(self, expression: str, timeout: float = 20.0, poll_s: float = 0.1) -> Any:
        """Poll ``expression`` until it is truthy (its value), or raise ``TimeoutError``."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still {value!r} after {timeout:g} s")
            time.sleep(poll_s)

    def screenshot(self, path: Path, width: int = 1200) -> Path:
        """The whole page as a PNG, ``width`` pixels wide."""
        import base64

        def size(height: int) -> None:
            metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
            self.call("Emulation.setDeviceMetricsOverride", metrics)

        size(800)  # laid out at that width first: its height follows
        size(int(self.evaluate("document.documentElement.scrollHeight")))
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with suppress(BrowserError, ConnectionClosed, TimeoutError):
            self.browser.call("Target.closeTarget", {"targetId": self.browser.target_of[self.session_id]})


class Chromium:
    """``with Chromium() as browser: tab = browser.open(url)``: one headless browser."""

    def __init__(self, binary: str | None = None, *, start_timeout: float = 30.0):
        self.binary = binary or find_binary()
        self.start_timeout = start_timeout
        self.profile: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.ws: ClientConnection | None = None
        self.ids = itertools.count(1)
        self.tabs: dict[str, Tab] = {}
        self.target_of: dict[str, str] = {}

    def start(self) -> Chromium:
        self.profile = Path(tempfile.mkdtemp(prefix="rws-chromium-"))
        args = [self.binary, *FLAGS, f"--user-data-dir={self.profile}"]
        if os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
        log = (self.profile / "chromium.log").open("wb")
        try:
            self.process = subprocess.Popen(
                [*args, "about:blank"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        port_file = self.profile / "DevToolsActivePort"
        self.wait_until(
            lambda: self.exited() or (port_file.exists() and port_file.read_text().count("\n") >= 1),
            self.start_timeout,
            "chromium's DevTools port",
        )
        if self.exited():
            raise BrowserError(f"chromium exited at start: {self.log_tail()}")
        port, path = port_file.read_text().split("\n")[:2]
        self.ws = connect(
            f"ws://127.0.0.1:{port}{path}", proxy=None, max_size=None, open_timeout=self.start_timeout
        )
        return self

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def log_tail(self) -> str:
        assert self.profile is not None
        with suppress(OSError):
            return (self.profile / "chromium.log").read_text(errors="replace")[-800:]
        return ""

    def wait_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Pump the DevTools connection's events until ``condition()``; ``TimeoutError`` after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not condition():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {what} after {timeout:g} s")
            if self.ws is None:
                time.sleep(min(0.05, left))
            else:
                self.receive(min(0.2, left))

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """One message (an event goes to its tab), or None after ``timeout``."""
        assert self.ws is not None
        try:
            message: dict[str, Any] = json.loads(self.ws.recv(timeout=timeout))
        except TimeoutError:
            return None
        if "method" in message and message.get("sessionId") in self.tabs:
            self.tabs[message["sessionId"]].on_event(message)
        return message

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Send a DevTools command and return its result (events meanwhile go to their tabs)."""
        if self.ws is None:
            raise BrowserError("chromium is not started")
        ident = next(self.ids)
        request: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session_id is not None:
            request["sessionId"] = session_id
        self.ws.send(json.dumps(request))
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer to {method}")
            message = self.receive(left)
            if message is not None and message.get("id") == ident:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error'].get('message')}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def open(self, url: str, timeout: float = 30.0) -> Tab:
        """A new tab with its console and exceptions watched from before ``url`` loads."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        tab = Tab(self, session)
        self.tabs[session] = tab
        self.target_of[session] = target
        for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
            tab.call(domain)
        tab.navigate(url, timeout)
        return tab

    def close(self) -> None:
        """End the browser (asked, then its process group killed) and remove its profile."""
        if self.ws is not None:
            with suppress(BrowserError, ConnectionClosed, TimeoutError, OSError):
                self.ws.send(json.dumps({"id": next(self.ids), "method": "Browser.close"}))
            with suppress(OSError):
                self.ws.close()
            self.ws = None
        if self.process is not None:
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)  # its renderers and helpers: one group
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
            self.process = None
        if self.profile is not None:
            shutil.rmtree(self.profile, ignore_errors=True)
            self.profile = None

    def __enter__(self) -> Chromium:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class PageCheck:
    url: str
    errors: list[str]
    points: int


@contextmanager
def opened(url: str, timeout: float = 30.0) -> Iterator[Tab]:
    """A tab of a browser of its own on ``url``; both closed at the end."""
    with Chromium() as browser:
        yield browser.open(url, timeout)


def check_page(
    url: str, selector: str = STEP_POINTS, timeout: float = 30.0, expect: int | None = None
) -> PageCheck:
    """Load ``url``; its errors and the elements matching ``selector`` — with ``expect``, once
    that many are drawn or ``timeout`` has passed (the live page draws after its first poll)."""
    with opened(url, timeout) as tab:
        if expect is not None:
            with suppress(TimeoutError):
                tab.wait_for(
                    f"document.querySelectorAll({json.dumps(selector)}).length === {expect}", timeout
                )
        points = tab.count(selector)
        tab.evaluate("1")  # the events sent before this answer are in
        return PageCheck(url, list(tab.errors), points)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.report.browser", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("url", help="http://… or file:///… (a path is taken as a file)")
    parser.add_argument(
        "--selector",
        default=STEP_POINTS,
        help="what to count (default: the points of the throughput figure, one a step)",
    )
    parser.add_argument("--expect", type=int, help="the count the page must show")
    args = parser.parse_args(argv)
    url = args.url if "://" in args.url else Path(args.url).resolve().as_uri()
    try:
        result = check_page(url, args.selector, expect=args.expect)
    except (BrowserError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"url": result.url, "errors": result.errors, "points": result.points}, indent=2))
    return int(bool(result.errors) or (args.expect is not None and result.points != args.expect))


if __name__ == "__main__":
    sys.exit(main())
