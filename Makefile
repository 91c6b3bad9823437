# pyctl: the commands a newcomer needs are `make demo`, `make test` and `make cluster`.
# Everything else here is what they are made of. Slow builds are cached outside the repository:
#   $(PYCTL_CACHE)/cargo-target        the Rust build (incremental; keyed by Cargo.lock through cargo itself)
#   $(PYCTL_CACHE)/control-plane/<v>/  the Go-built Kubernetes control plane (see scripts/control-plane)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON      ?= $(shell command -v python3.11 || command -v python3)
VENV        := .venv
VPY         := $(VENV)/bin/python
PYCTL_CACHE ?= $(HOME)/.cache/pyctl
CARGO_TARGET_DIR ?= $(PYCTL_CACHE)/cargo-target
export CARGO_TARGET_DIR
export PYO3_PYTHON := $(abspath $(VPY))

.PHONY: help setup system-deps venv build lint rust-test unit-test test test-fast fuzz demo cluster bench clean

help:
	@echo "make demo   install what is needed, then run pyctl's main job on its embedded default"
	@echo "make test   install what is needed, then run every check and test (what CI runs)"
	@echo "make cluster  a local Kubernetes cluster with GPU nodes and pyctl acting on it (Ctrl-C stops it)"
	@echo "make test-fast  lint, types, Rust tests and the Python unit tests (no control plane, no Redis)"
	@echo "make test-STAGE one stage of make test: $(TEST_STAGES)"
	@echo "make bench  run the benchmarks in bench/ (ratios measured in one run)"
	@echo "make fuzz   the fuzz tier with a long budget (FUZZ_EXAMPLES=20000 cases per test)"

# System packages (Debian) that the tests use; installed only when missing.
system-deps:
	@scripts/system-deps

$(VENV)/.deps: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(VPY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

venv: $(VENV)/.deps

# The Kubernetes control plane of the e2e tests (kube-apiserver, -scheduler, -controller-manager, etcd,
# kwok), built from Go modules into $(PYCTL_CACHE)/control-plane/<versions>/bin, kubectl and helm
# into $(PYCTL_CACHE)/tools/<versions>/bin, and Kueue's manager into $(PYCTL_CACHE)/kueue/<version>;
# a no-op once built.
.PHONY: control-plane
control-plane:
	PYCTL_CACHE=$(PYCTL_CACHE) scripts/control-plane build

# The Rust core, built in release mode into the venv as pyctl._core (editable install of the package).
build: venv
	VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH \
	  $(VENV)/bin/maturin develop --release --quiet >/dev/null 2>$(VENV)/maturin.log \
	  || { cat $(VENV)/maturin.log; exit 1; }
	$(VPY) -c "import pyctl._core"

setup: system-deps build

lint: venv
	$(VENV)/bin/ruff check pyctl tests bench deploy
	$(VENV)/bin/ruff format --check pyctl tests bench deploy
	$(VENV)/bin/mypy --strict pyctl tests bench
	$(VENV)/bin/lint-imports --no-cache
	@# the Rust extension is imported by the core facade only (import-linter cannot see it)
	@! grep -rnE '(from pyctl import .*\b_core\b|pyctl\._core)' pyctl --include='*.py' \
	  | grep -v '^pyctl/core/' || { echo "only pyctl/core/ may import pyctl._core"; exit 1; }
	cargo fmt --check
	cargo clippy --all-targets --quiet -- -D warnings
	cargo clippy --all-targets --features python --quiet -- -D warnings

rust-test:
	cargo test --quiet

# `make test` is a sequence of stages, each a target of its own (`make test-unit`, ...): each prints
# its result and elapsed time when it ends, the next one runs even when one failed, and the end is
# one line per stage (scripts/stage); `make test` fails when any stage failed. A pytest stage that
# collects no tests fails. docs/architecture.md ("Tests") says which stage to run for what.
#   lint         ruff, formatting, mypy --strict, the import contract, cargo fmt and clippy
#   rust         cargo test (the pure core, without Python)
#   unit         tests/unit: unit and property tests (no Redis, no control plane)
#   conformance  tests/conformance: the kubelet-derived topology corpus
#   sim          tests/sim: the demo on the simulated cluster
#   fuzz         tests/fuzz: hostile objects, records, bodies and files (Hypothesis)
#   integration  tests/integration: real redis-servers (single, Cluster, AUTH, ACL, TLS)
#   deploy       tests/deploy: the Helm chart with the real helm and kubectl
#   monitoring   tests/monitoring: alert rules with promtool, Prometheus
#   e2e          tests/e2e: the real control plane (kwok GPU nodes)
TEST_STAGES := lint rust unit conformance sim fuzz integration deploy monitoring e2e
# (not PYCTL_*: pyctl reads every PYCTL_* variable as a setting and refuses unknown ones)
export STAGE_SUMMARY_FILE := $(abspath $(VENV))/test-stages.txt
PYTEST := $(VENV)/bin/pytest -q

test: setup control-plane
	@scripts/stage reset
	@failed=0; for s in $(TEST_STAGES); do \
	  $(MAKE) --no-print-directory test-$$s || failed=1; done; \
	scripts/stage summary && ((failed == 0))

test-lint: venv
	@scripts/stage lint $(MAKE) --no-print-directory lint
test-rust:
	@scripts/stage rust cargo test --quiet
test-unit: build
	@scripts/stage unit $(PYTEST) tests/unit
test-conformance: build
	@scripts/stage conformance $(PYTEST) tests/conformance
test-sim: build
	@scripts/stage sim $(PYTEST) tests/sim
test-fuzz: build
	@scripts/stage fuzz $(PYTEST) tests/fuzz
test-integration: build
	@scripts/stage integration $(PYTEST) tests/integration
test-deploy: build control-plane
	@scripts/stage deploy $(PYTEST) tests/deploy
test-monitoring: build
	@scripts/stage monitoring $(PYTEST) tests/monitoring
test-e2e: build control-plane
	@scripts/stage e2e $(PYTEST) tests/e2e

.PHONY: $(addprefix test-,$(TEST_STAGES))

# For iterating: the stages that need neither the control plane nor a redis-server (a couple of
# minutes), with the same per-stage lines.
TEST_FAST_STAGES := lint rust unit conformance
test-fast:
	@scripts/stage reset
	@failed=0; for s in $(TEST_FAST_STAGES); do \
	  $(MAKE) --no-print-directory test-$$s || failed=1; done; \
	scripts/stage summary && ((failed == 0))

unit-test: test-unit test-conformance

# The fuzz tier with a longer budget than the one `make test` runs it with (tests/fuzz/conftest.py).
FUZZ_EXAMPLES ?= 20000
fuzz: build
	PYCTL_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(VENV)/bin/pytest -q -p no:logging tests/fuzz

demo: setup
	$(VENV)/bin/pyctl demo

# The real control plane with kwok GPU nodes, pyctl (enforce) and its scheduler extender, a fragmenting
# workload; in the foreground with a live view; Ctrl-C stops everything (pyctl/dev/cluster.py).
cluster: setup control-plane
	$(VENV)/bin/pyctl dev up

bench: build
	for b in bench/*.py; do echo "== $$b"; $(VPY) $$b; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
