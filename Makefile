# Two set-up commands on a fresh machine: `make demo` and `make test` (each creates .venv
# and installs what it needs first).
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test test-unit lint bench serve install redis clients clean wheel smoke-wheel

$(BIN)/python:
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[test]"
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

test: $(STAMP) redis $(CLIENTS)
	$(BIN)/pytest

# The fast tier: pure logic, no Ray, no store server, no JS clients (tests/conftest.py marks).
test-unit: $(STAMP)
	$(BIN)/pytest -m unit

lint: $(STAMP)
	$(BIN)/ruff check .

serve: $(STAMP)
	$(BIN)/responses-ws serve

bench: $(STAMP)
	$(BIN)/responses-ws bench hotpath

# The wheel, installed into a fresh virtualenv of interpreter $(PY) under /tmp and
# smoke-tested from outside the checkout (tests/install/smoke.py):
#   make smoke-wheel PY=python3.12
PY ?= python3
wheel: | $(BIN)/python
	rm -rf dist
	$(BIN)/pip wheel --quiet --no-deps --wheel-dir dist .

smoke-wheel: wheel
	rm -rf /tmp/responses-ws-smoke-venv
	$(PY) -m venv /tmp/responses-ws-smoke-venv
	/tmp/responses-ws-smoke-venv/bin/pip install --quiet dist/*.whl
	cd /tmp && /tmp/responses-ws-smoke-venv/bin/python $(CURDIR)/tests/install/smoke.py

clean:
	rm -rf $(VENV) results dist
