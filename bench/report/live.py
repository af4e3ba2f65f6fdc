"""The live page the driver serves while a run goes on: a small HTTP server in a thread of
the driver (the standard library's), a page that polls ``/figures.json`` every second and
swaps in the figures drawn so far (drawn by the same code as ``report.html``, so the points
are the same), and ``/scaling.json``, the document so far."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from .page import body_html, head, title_block
from .schema import validate

POLL_MS = 1000
WILDCARD = ("", "0.0.0.0", "::")

SCRIPT = """
(function () {
  var shown = -1;
  var status = document.getElementById("poll");
  function tick() {
    var last = false;
    fetch("figures.json?since=" + shown, {cache: "no-store"})
      .then(function (r) { return r.json(); })
      .then(function (data) {
        if (data.revision !== shown && data.html !== undefined) {
          document.getElementById("content").innerHTML = data.html;
          shown = data.revision;
          document.body.setAttribute("data-revision", String(shown));
        }
        last = data.final === true && data.revision === shown;
        if (last) {
          document.body.setAttribute("data-final", "true");
          status.textContent = "the run has ended: these are its final figures";
        } else {
          status.textContent = "updated " + new Date().toLocaleTimeString() + " (revision " + shown + ")";
        }
      })
      .catch(function () { status.textContent = "the driver is not answering (the run may have ended)"; })
      .finally(function () { if (!last) { setTimeout(tick, POLL_MS); } });
  }
  tick();
})();
"""


def shell(poll_ms: int = POLL_MS) -> bytes:
    waiting = '<div class="banner live" id="status" data-state="waiting">Waiting for the first step…</div>'
    return (
        head("Scaling experiment — live")
        + f'<body data-revision="-1"><main>{title_block(None)}'
        + '<p class="sub">Live: this page redraws as each step finishes. <span id="poll"></span></p>'
        + f'<div id="content">{waiting}</div></main><script>{SCRIPT.replace("POLL_MS", str(poll_ms))}</script></body></html>'
    ).encode()


class LivePage:
    """``LivePage(host, port)``: ``start()`` serves the page and returns its URL; ``update(doc)``
    swaps in the document so far; ``stop()`` ends the server.  Port 0 takes a free one; the
    page asks for news every ``poll_ms`` until it has the figures of a finished run
    (``provenance.finished_at`` set)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, poll_ms: int = POLL_MS):
        self.host, self.port, self.poll_ms = host, port, poll_ms
        self._lock = threading.Lock()
        self._revision = -1
        self._figures = json.dumps({"revision": -1, "html": ""}).encode()
        self._doc = b"null"
        self._final = False
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        page = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                if path in ("/", "/index.html"):
                    self.reply(shell(page.poll_ms), "text/html; charset=utf-8")
                elif path == "/figures.json":
                    since = parse_qs(query).get("since", [""])[0]
                    self.reply(page.figures(since), "application/json")
                elif path == "/scaling.json":
                    self.reply(page.document(), "application/json")
                else:
                    self.send_error(404)

            def reply(self, body: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the driver's terminal is for its progress lines

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="live-page", daemon=True)
        self._thread.start()
        return self.url

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the live page is not started")
        port = self._server.server_address[1]
        host = self.host
        if host in WILDCARD:
            host = socket.gethostbyname(socket.gethostname())
        return f"http://{host}:{port}/"

    def update(self, doc: Mapping[str, Any]) -> None:
        """Draw ``doc`` (the run so far) and serve it from the next poll on; ``ValueError``
        naming the first violation if ``doc`` does not match the schema of scaling.json."""
        validate(doc)
        html = body_html(doc, live=True)
        final = doc["provenance"].get("finished_at") is not None  # the page stops asking
        with self._lock:
            self._revision += 1
            self._figures = json.dumps(
                {"revision": self._revision, "steps": len(doc["steps"]), "final": final, "html": html}
            ).encode()
            self._doc = json.dumps(doc).encode()
            self._final = final

    def figures(self, since: str = "") -> bytes:
        """The figures drawn last; only their revision when the page shows it already."""
        with self._lock:
            if since == str(self._revision):
                return json.dumps({"revision": self._revision, "final": self._final}).encode()
            return self._figures

    def document(self) -> bytes:
        with self._lock:
            return self._doc

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> LivePage:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
