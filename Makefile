# Two set-up commands on a fresh machine: `make demo` and `make test` (each creates .venv
# and installs what it needs first).
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test bench serve install redis clean

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

test: $(STAMP) redis
	$(BIN)/pytest

serve: $(STAMP)
	$(BIN)/responses-ws serve

bench: $(STAMP)
	$(BIN)/responses-ws bench hotpath

clean:
	rm -rf $(VENV) results
