# beamdiag: the two commands a new user needs are `make demo` and `make test`.
REBAR ?= rebar3
BIN := _build/default/bin/beamdiag
DEMO ?= busy_wait

.PHONY: all build demo test unit ct check docs bench setup-build setup-test clean

all: build

setup-build:
	@scripts/setup.sh build

setup-test:
	@scripts/setup.sh test

build: setup-build
	$(REBAR) escriptize

# Start a lab node that busy-waits and diagnose it, as a user would a live node.
demo: build
	$(BIN) lab $(DEMO) --diagnose --window 5

# The lock-counting emulators and OTP roots build in the background while
# EUnit and the suites that need neither run (scripts/test-run.sh).
test: setup-test build
	REBAR=$(REBAR) scripts/test-run.sh
	$(MAKE) check

unit: build
	$(REBAR) eunit

ct: build
	$(REBAR) ct

# Static checks: xref, the target boundary, the layers (every call and
# remote type between folders allowed by scripts/layers.eterm, read from
# the beams), the report's assets linted, dialyzer, and the generated
# docs in step.
check:
	$(REBAR) xref
	scripts/target-boundary.escript
	scripts/layer-check.escript
	scripts/lint-assets.sh
	$(REBAR) dialyzer
	$(BIN) catalogue | diff -u docs/FINDINGS.md - || (echo "docs/FINDINGS.md is stale: make docs" >&2; exit 1)

docs: build
	$(BIN) catalogue > docs/FINDINGS.md

bench: build
	bench/run.sh

clean:
	$(REBAR) clean
	rm -rf _build/test/logs
