"""The Python client examples of docs/clients.md, run as a user runs them, against the test
server (the emulated model calls the offered tool 20 times, then answers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "clients" / "python"


@pytest.mark.parametrize("script", ["openai_websocket.py", "openai_http.py", "agents_websocket.py"])
def test_the_example_runs_its_tool_loop_to_an_answer(server_url, script):
    env = {**os.environ, "RESPONSES_WS_BASE_URL": server_url + "/v1"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    per_run = 2 if script == "agents_websocket.py" else 1  # the agents example runs the agent twice
    assert out["tool_calls"] == 20 * per_run
    assert isinstance(out["answer"], str) and out["answer"].strip()
