# Castad: `make demo` runs one brief end to end, `make test` runs every test.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo up test lint bench lock schemas

setup:  ## venv from the lock file, PostgreSQL and RabbitMQ, databases, topology
	@bash infra/local/setup.sh

demo: setup  ## start every service, run the demo brief to a finished MP4, stop
	@$(BIN)/castad-admin demo

up: setup  ## run every service in the foreground until Ctrl-C (gateway on 127.0.0.1:8000)
	@PYTHON=$(CURDIR)/$(BIN)/python $(BIN)/honcho -f infra/local/Procfile -d . start

test: setup lint  ## unit, integration and end-to-end tests
	@$(BIN)/pytest

lint:
	@$(BIN)/ruff check libs services tests bench
	@$(BIN)/ruff format --check libs services tests bench
	@$(BIN)/mypy

bench: setup  ## Castad vs a plain Dramatiq pipeline; writes BENCHMARKS.md
	@$(BIN)/python -m bench.run

schemas: setup  ## JSON Schema of every event into var/schemas
	@$(BIN)/castad-admin schemas var/schemas

lock:  ## re-resolve dependencies from pyproject.toml into requirements.lock
	@rm -rf var/lock-venv && python3.11 -m venv var/lock-venv
	@var/lock-venv/bin/pip install -q --upgrade pip && var/lock-venv/bin/pip install -q -e '.[dev]'
	@(echo "# Exact versions of every dependency (direct ones are listed in pyproject.toml)."; \
	  echo "# Regenerate: make lock"; \
	  var/lock-venv/bin/pip freeze --exclude-editable | grep -v '^castad') > requirements.lock
	@rm -rf var/lock-venv
