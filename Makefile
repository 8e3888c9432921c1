# Castad: `make demo` runs one brief end to end, `make test` runs every test.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
PACKAGES := libs/contracts libs/runtime libs/cli libs/testkit libs/faults services/api services/relay services/lyric services/song services/video infra/local infra/docs bench
PYTHON_DIRS := libs services infra/local infra/docs tests bench
# pytest-xdist workers of make test: one runs the end-to-end tests in turn, the others the rest beside it.
TEST_WORKERS ?= 4
UV = var/tools/uv-$(shell sed -n 's/^required-version = "==\(.*\)"$$/\1/p' pyproject.toml)/bin/uv

.PHONY: setup demo up test pytest check lint docs release bench profile bench-providers bench-stats bench-song bench-wakeups bench-quota bench-fairness bench-polls bench-capacity bench-replicas bench-webhooks bench-streams bench-retention bench-footprint faults upgrade-test images lock schemas screenshots

setup:  ## venv from the lock file, PostgreSQL and RabbitMQ, databases, topology
	@bash infra/local/setup.sh

demo: setup  ## start every service, run the demo brief to a finished MP4, stop
	@$(BIN)/castad-admin demo

up: setup  ## run every service in the foreground until Ctrl-C (gateway on 127.0.0.1:8000)
	@PYTHON=$(CURDIR)/$(BIN)/python $(BIN)/honcho -f infra/local/Procfile -e var/local/castad.env -d . start

test: setup  ## lint, the docs and every test: the three at once
	@$(MAKE) --no-print-directory -j3 lint docs pytest

pytest:  ## unit, integration and end-to-end tests: the end-to-end ones in turn on two workers, the rest beside them
	@$(BIN)/pytest -n $(TEST_WORKERS) --dist loadscope

check: lint  ## the fast loop: lint, then the tests that need no server (unit, providers, charts), in parallel
	@$(BIN)/pytest -n 3 -q tests/unit tests/providers tests/deploy

lint:  ## ruff, mypy, deptry (each package declares exactly what it imports), and uv.lock matches every pyproject.toml
	@$(UV) lock --check --offline --quiet || (echo "uv.lock is stale: run make lock" && exit 1)
	@$(BIN)/hadolint --failure-threshold style services/*/Dockerfile infra/images/bases.Containerfile
	@$(BIN)/ruff check $(PYTHON_DIRS)
	@$(BIN)/ruff format --check $(PYTHON_DIRS)
	@$(BIN)/mypy
	@for package in $(PACKAGES); do out=$$(cd $$package && $(CURDIR)/$(BIN)/deptry --no-ansi . 2>&1) || { echo "$$package: $$out"; exit 1; }; done

docs:  ## the docs site into var/site, strictly: a broken link or a page left out of the navigation fails (castad-admin docs serves it)
	@NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: setup  ## Castad vs DBOS and a plain Dramatiq pipeline, a backlog drain, a 10-minute steady run, two replicas of every worker (about 23 minutes); writes docs/reports/benchmarks.md and its charts
	@$(BIN)/python -m bench.run

profile: setup  ## where each service spends its CPU under load (py-spy); stacks in var/bench/profile
	@PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m bench.profile

bench-providers: setup  ## 200 pipelines through the network providers' fakes, a 30 s music API, 2 worker threads per stage; writes docs/reports/providers.md
	@$(BIN)/python -m bench.providers

bench-stats: setup  ## /v1/stats and the listing's search on 1,000,000 pipelines in a scratch database; writes docs/reports/stats.md
	@$(BIN)/python -m bench.stats

bench-song: setup  ## CPU per ten seconds of song, sung by each voice in each language and without a voice; writes docs/reports/song.md
	@$(BIN)/python -m bench.song

bench-webhooks: setup  ## 1,000 webhook notices to a local receiver answering in 1 s, by one gateway process, before and after; writes docs/reports/webhooks.md
	@$(BIN)/python -m bench.webhooks

bench-streams: setup  ## 2,000 idle event streams on one gateway process: its CPU and memory, before and after; writes docs/reports/streams.md
	@$(BIN)/python -m bench.streams

bench-wakeups: setup  ## commits a second of 32 writers with no wake-up, a NOTIFY in each transaction, and the waker after the commit; writes docs/reports/wakeups.md
	@$(BIN)/python -m bench.wakeups

bench-quota: setup  ## claims a second of 32 claimers through a provider's quota with 10,000 jobs in flight, through its one locked row before and its shards now; writes docs/reports/quota.md
	@$(BIN)/python -m bench.quota

bench-fairness: setup  ## waits per tenant behind another's backlog of 200 at a slow music API, oldest first before and in fair turns now, and what a claim costs each way (about a minute); writes docs/reports/fairness.md
	@$(BIN)/python -m bench.fairness

bench-polls: setup  ## 100,000 jobs waiting at a provider polled as they fall due, each a claim of its own before and in batches now (about 5 minutes); writes docs/reports/polls.md
	@$(BIN)/python -m bench.polls

bench-retention: setup  ## inserts with random against time-ordered keys into 1.5 million rows, and retention's deletions a second before and now (about 4 minutes); writes docs/reports/retention.md
	@$(BIN)/python -m bench.retention

bench-footprint: setup  ## each service's seconds to ready and resident memory started alone, and after a brief in each language (about 5 minutes); writes docs/reports/footprint.md
	@$(BIN)/python -m bench.footprint

bench-capacity: setup  ## what a pipeline and a waiting job cost each part, the ceilings here, and what 5,000 pipelines/s would need (about 6 minutes); writes docs/reports/capacity.md
	@$(BIN)/python -m bench.capacity

bench-replicas: setup  ## two replicas of every stage and of the relay beside one of each: nothing lost, order kept, throughput (about 3 minutes); writes docs/reports/replicas.md
	@$(BIN)/python -m bench.replicas

upgrade-test: setup  ## a rolling upgrade from FROM (a tag or commit; default: the newest release tag) to this tree, under traffic; docs/reports/upgrade.md (SHORT=1: the short version, as a test)
	@$(if $(SHORT),$(BIN)/pytest -m upgrade tests/upgrade,$(BIN)/python -m bench.upgrade $(if $(FROM),--from $(FROM)))

faults: setup  ## the full fault run (two replicas of every service on a 3-node RabbitMQ cluster and a PostgreSQL primary with two synchronous standbys; 1,000 pipelines, every fault kind, 3-minute outages); writes docs/reports/faults.md and its chart
	@$(BIN)/python -m castad_faults

images: setup  ## build every service's image with podman and run the stack from them to a finished video (root)
	@$(BIN)/pytest -m images tests/images

screenshots: setup  ## the console's tests, writing their pictures into docs/console (a test run writes them into var/console)
	@CASTAD_SCREENSHOTS_DIR=$(CURDIR)/docs/console $(BIN)/pytest tests/e2e/test_console.py

schemas: setup  ## JSON Schema of every event into var/schemas
	@$(BIN)/castad-admin schemas var/schemas

release:  ## VERSION=x.y.z: that release in every package, chart and the CHANGELOG, the lock file, a commit and tag vx.y.z
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=x.y.z (now: $$($(BIN)/bump-my-version show current_version))"; exit 1; }
	@$(BIN)/bump-my-version bump --new-version $(VERSION)
	@$(UV) lock --quiet
	@git commit --quiet -am "Release $(VERSION): every package, chart and the CHANGELOG" && git tag -a v$(VERSION) -m "Castad $(VERSION)"
	@echo "release $(VERSION) committed and tagged v$(VERSION): push the tag with the commit"

lock: setup  ## re-resolve every package's dependencies into uv.lock (then `make setup` syncs .venv)
	@$(UV) lock
