"""Hostile HTTP requests (issue 8): bodies, content types, response ids and query strings.

Every one is answered with a 4xx OpenAI error body (or, when the input happens to be valid,
with what the endpoint returns), never a 5xx.  Strategies :mod:`bench.fuzz_cases`, oracle
:mod:`bench.fuzz_oracle`; the server is the main test server.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given

from bench.fuzz_cases import HTTP_KINDS, http_cases, nested
from bench.fuzz_oracle import MODEL, HttpCase, HttpFuzzer
from tests.support.fuzz import fuzz_settings

EXAMPLES = 1200
FUZZ = fuzz_settings(EXAMPLES)

# Long strings make long reprs; hypothesis warns about each.
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")


@pytest.fixture(scope="module")
def fuzzer(server_url):
    f = HttpFuzzer(server_url)
    yield f
    f.close()


def test_hostile_requests_get_4xx_openai_errors_never_5xx(fuzzer):
    @FUZZ
    @given(case=http_cases())
    def one(case: HttpCase) -> None:
        outcome = fuzzer.run(case)
        assert outcome.problems == [], (case, outcome)

    one()
    assert sum(fuzzer.kinds.values()) >= 1000
    assert set(fuzzer.kinds) == set(HTTP_KINDS), "every kind of hostile request was tried"
    codes = {s.split()[0] for s in fuzzer.statuses}
    assert {"400", "404", "405", "200"} <= codes and not any(c.startswith("5") for c in codes)
    assert fuzzer.http.get(f"/v1/responses/{fuzzer.stored}").status_code == 200, (
        "the stored response survived"
    )


def body(**fields) -> bytes:
    return json.dumps({"model": MODEL, "input": "hi", "store": False, **fields}).encode()


# Requests that got a 500, Starlette's {"detail": ...} or a redirect before the fixes.
REGRESSIONS = [
    (HttpCase("r", "POST", "/v1/responses", body(temperature=10**400)), 400, "invalid_type"),
    (HttpCase("r", "POST", "/v1/responses", body(metadata={"k": "\ud800"})), 400, "invalid_json"),
    (HttpCase("r", "POST", "/v1/responses", b"[" * 10_000 + b"]" * 10_000), 400, "invalid_json"),
    (HttpCase("r", "POST", "/v1/responses", body(input=json.loads(nested(300)))), 400, "invalid_json"),
    (HttpCase("r", "POST", "/v1/responses", body(tool_choice="bogus")), 400, "invalid_value"),
    (
        HttpCase(
            "r",
            "POST",
            "/v1/responses/compact",
            json.dumps({"model": MODEL, "input": [{"type": [1]}]}).encode(),
        ),
        400,
        "invalid_value",
    ),
    (HttpCase("r", "GET", "/v1/nothing", None, None), 404, None),
    (HttpCase("r", "GET", "/v1/responses/", None, None), 404, None),
    (HttpCase("r", "PUT", "/v1/responses", b"{}"), 405, None),
]


@pytest.mark.parametrize("case, status, code", REGRESSIONS)
def test_regression_requests_get_their_4xx(fuzzer, case, status, code):
    outcome = fuzzer.run(case)
    assert outcome.problems == []
    assert outcome.replies == [f"{status} {code}"]


def test_a_request_head_over_64_kib_gets_a_431_openai_error_body(server_url):
    import socket

    host, port = server_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"GET /v1/responses/{'x' * 70_000} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431")
    error = json.loads(payload)["error"]
    assert error["code"] == "request_header_fields_too_large" and error["type"] == "invalid_request_error"
