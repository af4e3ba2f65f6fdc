# Two set-up commands on a fresh machine: `make demo` and `make test` (each creates .venv
# and installs what it needs first).
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench serve install clean

$(BIN)/python:
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/responses-ws demo

test: $(STAMP)
	$(BIN)/pytest

serve: $(STAMP)
	$(BIN)/responses-ws serve

bench: $(STAMP)
	$(BIN)/python -m bench.hotpath

clean:
	rm -rf $(VENV) results
