# gpulens developer and demo targets. Everything runs from a virtual environment in .venv
# created with the system Python (>= 3.11); Prometheus and Alertmanager come from Debian.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: help venv system-deps tools migcheck celcheck thanos prometheus3 native render test test-fast lint typecheck format demo demo-stop bench dashboards rules clean

help:
	@echo "make demo       run the demo on the simulated node (no GPU needed)"
	@echo "make test       install what the tests need and run the whole suite"
	@echo "make tools      build helm (for the chart tests) into $(TOOLS_BIN)"
	@echo "make thanos     build thanos (for the analyzer's distributed-TSDB test and bench) into $(TOOLS_BIN)"
	@echo "make prometheus3  build Prometheus 3 (the PromQL tests run on it and on Debian's 2.x) into $(TOOLS_BIN)"
	@echo "make lint       ruff check + format check + mypy"
	@echo "make bench      benchmarks (writes docs/benchmarks.md)"
	@echo "make native     build the native simulated NVML library (libnvidia-ml.so.1) with the system cc"

$(BIN)/.installed: pyproject.toml setup.py
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "gpulens needs Python >= 3.11"'
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV) || { \
	  echo "python venv module missing: installing python3-venv"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

venv: $(BIN)/.installed

# Prometheus, promtool, Alertmanager and amtool from Debian's packages (no other downloads), and
# slurmd, whose `slurmd -G` reads the gres.conf the analyzer emits in its tests.
# VictoriaMetrics is optional: the analyzer's compatibility test skips without it.
APT_INSTALL := DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends
system-deps:
	@missing=""; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v amtool >/dev/null || missing="$$missing prometheus-alertmanager"; \
	command -v slurmd >/dev/null || [ -x /usr/sbin/slurmd ] || missing="$$missing slurmd"; \
	command -v shellcheck >/dev/null || missing="$$missing shellcheck"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	optional=""; command -v victoria-metrics >/dev/null || optional="victoria-metrics"; \
	if [ -n "$$missing$$optional" ]; then $(SUDO) apt-get update -qq; fi; \
	if [ -n "$$missing" ]; then echo "installing from Debian:$$missing"; $(APT_INSTALL) $$missing; fi; \
	if [ -n "$$optional" ]; then $(APT_INSTALL) $$optional || echo "$$optional not installable: its test skips"; fi

# Real helm for the chart tests (tests/stack/test_helm.py), built from its Go module (the machine has
# Go and the module proxy, no release downloads) into a cache outside the tree, once: `make tools`
# skips the build when that version is already there. The -X flags are the ones helm's own release
# build sets: its version, and the Kubernetes version it assumes without a cluster (that of the
# client-go it is built with, v0.37 for helm v3.22.0), without which `helm template` would assume
# Kubernetes 1.20.
HELM_VERSION := v3.22.0
HELM_K8S_MINOR := 37
TOOLS_BIN ?= $(HOME)/.cache/gpulens-tools/bin
HELM := $(TOOLS_BIN)/helm
HELM_LDFLAGS := -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
  -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$(HELM_K8S_MINOR) \
  -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$(HELM_K8S_MINOR)
tools: migcheck celcheck
	@if [ "$$($(HELM) version --template '{{.Version}}' 2>/dev/null)" = "$(HELM_VERSION)" ]; then exit 0; fi; \
	command -v go >/dev/null || { echo "make tools: go is needed to build helm $(HELM_VERSION)" >&2; exit 1; }; \
	echo "building helm $(HELM_VERSION) from its Go module into $(TOOLS_BIN) (a few minutes, once)"; \
	mkdir -p $(TOOLS_BIN) && GOBIN=$(TOOLS_BIN) nice -n 10 go install -ldflags "$(HELM_LDFLAGS)" helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

# Thanos (querier + sidecar: one binary) for the analyzer's distributed-TSDB test and bench
# (tests/analyzer/test_thanos.py), built from its Go module into the same cache, once: skipped when
# that version is there. Thanos' go.mod has replace directives, which `go install module@version`
# refuses, so the module is fetched from the module proxy (`go mod download`) and built inside its
# own directory, with its own go.mod and go.sum, and with the `slicelabels` build tag of its release
# build (.promu.yml; its other tag, netgo, only picks the pure-Go DNS resolver): Thanos casts
# Prometheus label slices in place, and without the tag the sidecar marshals garbage (a panic in
# gRPC's buffer pool on the querier's first call). About 10 minutes of two cores the first time.
THANOS_VERSION := v0.42.3
THANOS := $(TOOLS_BIN)/thanos-$(THANOS_VERSION)
THANOS_LDFLAGS := -X github.com/prometheus/common/version.Version=$(THANOS_VERSION:v%=%)
thanos:
	@[ -x $(THANOS) ] && exit 0; \
	command -v go >/dev/null || { echo "make thanos: go is needed to build thanos $(THANOS_VERSION)" >&2; exit 1; }; \
	echo "building thanos $(THANOS_VERSION) from its Go module into $(TOOLS_BIN) (about 10 minutes, once)"; \
	dir=$$(go mod download -json github.com/thanos-io/thanos@$(THANOS_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
	[ -d "$$dir" ] || { echo "make thanos: go mod download github.com/thanos-io/thanos@$(THANOS_VERSION) failed" >&2; exit 1; }; \
	mkdir -p $(TOOLS_BIN) && cd "$$dir" && nice -n 10 go build -trimpath -tags slicelabels -ldflags "$(THANOS_LDFLAGS)" -o $(THANOS).tmp ./cmd/thanos && mv $(THANOS).tmp $(THANOS)

# Prometheus 3 (prometheus + promtool) beside Debian's 2.x: the analyzer's PromQL tests and the rule
# unit tests run on both, because Prometheus 3's left-open ranges change every windowed function at
# the window's edge (tests/support/procs.py: PROMETHEUS_ENGINES). Built from its Go module (tagged
# v0.3xx.y for Prometheus 3.xx.y; no replace directives, so `go install module@version` works) with
# the `netgo` tag of its release build and without `builtinassets`: the web UI is not needed, the
# HTTP API is. With `remove_all_sd` (Prometheus' own build tag, plugins/plugin_*.go): no service
# discovery but static, file and HTTP (plugins/minimum.go), which is all the tests configure; the
# cloud and Kubernetes SDKs behind the others are most of what a cold build compiles. The directory
# name says so, so a cache holding a full build is not taken for it. About 5 minutes of two cores
# the first time (less without the SDKs), then skipped.
PROMETHEUS3_VERSION := 3.16.0
PROMETHEUS3 := $(TOOLS_BIN)/prometheus-$(PROMETHEUS3_VERSION)-nosd
PROMETHEUS3_MODULE := github.com/prometheus/prometheus
prometheus3:
	@[ -x $(PROMETHEUS3)/prometheus ] && [ -x $(PROMETHEUS3)/promtool ] && exit 0; \
	command -v go >/dev/null || { echo "make prometheus3: go is needed to build prometheus $(PROMETHEUS3_VERSION)" >&2; exit 1; }; \
	echo "building prometheus and promtool $(PROMETHEUS3_VERSION) from their Go module into $(PROMETHEUS3) (about 5 minutes, once)"; \
	version=v0.$$(echo $(PROMETHEUS3_VERSION) | awk -F. '{printf "%d%02d.%d", $$1, $$2, $$3}'); \
	rm -rf $(PROMETHEUS3).tmp && mkdir -p $(PROMETHEUS3).tmp && \
	GOBIN=$(PROMETHEUS3).tmp nice -n 10 go install -tags netgo,remove_all_sd \
	  -ldflags "-X github.com/prometheus/common/version.Version=$(PROMETHEUS3_VERSION)" \
	  $(PROMETHEUS3_MODULE)/cmd/prometheus@$$version $(PROMETHEUS3_MODULE)/cmd/promtool@$$version && \
	rm -rf $(PROMETHEUS3) && mv $(PROMETHEUS3).tmp $(PROMETHEUS3)

# The simulated libnvidia-ml.so.1 (sim/native/simnvml.c), built with the system C compiler
# into the cache directory it prints; the package also builds it on first use.
native: venv
	@command -v $${CC:-cc} >/dev/null || command -v gcc >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq gcc libc6-dev; }
	$(BIN)/python -m gpulens.sim.native.build

# tools/migcheck (ours): a mig-parted config checked by NVIDIA's go-nvlib profile parser and go-nvml's
# NVML mocks (from the Go module proxy); the emit tests run it. Rebuilt when its source changes.
MIGCHECK := $(TOOLS_BIN)/migcheck
migcheck: $(MIGCHECK)
$(MIGCHECK): tools/migcheck/main.go tools/migcheck/go.mod tools/migcheck/go.sum
	@command -v go >/dev/null || { echo "make migcheck: go is needed to build tools/migcheck" >&2; exit 1; }
	mkdir -p $(TOOLS_BIN) && cd tools/migcheck && CGO_CFLAGS=-w nice -n 10 go build -o $(MIGCHECK) .

# tools/celcheck (ours): the receiver's ValidatingAdmissionPolicy evaluated by cel-go, the CEL
# implementation the API server uses, against the recovery Jobs the receiver builds
# (tests/stack/test_chart_privileges.py). Rebuilt when its source changes (about 20 s).
CELCHECK := $(TOOLS_BIN)/celcheck
celcheck: $(CELCHECK)
$(CELCHECK): tools/celcheck/main.go tools/celcheck/go.mod tools/celcheck/go.sum
	@command -v go >/dev/null || { echo "make celcheck: go is needed to build tools/celcheck" >&2; exit 1; }
	mkdir -p $(TOOLS_BIN) && cd tools/celcheck && nice -n 10 go build -o $(CELCHECK) .

# The dashboard render app (tools/dashboard-render: Perses' React packages, bundled with esbuild) that
# tests/dashboards/test_render.py opens in Chromium, and @grafana/data for the unit check: `npm ci`
# from the committed package-lock.json (no install scripts), again only when the lock file changes
# (about 1 minute and 560 MB), then the bundle (about 10 s).
RENDER := tools/dashboard-render
render: system-deps
	@[ $(RENDER)/node_modules/.package-lock.json -nt $(RENDER)/package-lock.json ] || \
	  (cd $(RENDER) && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
	cd $(RENDER) && node build.mjs

test: venv system-deps tools native thanos prometheus3 render
	GPULENS_HELM=$(HELM) GPULENS_MIGCHECK=$(MIGCHECK) GPULENS_CELCHECK=$(CELCHECK) GPULENS_THANOS=$(THANOS) GPULENS_PROMETHEUS3=$(PROMETHEUS3) $(BIN)/python -m pytest -q --durations=25

test-fast: venv native
	$(BIN)/python -m pytest -q -m "not slow"

lint: venv typecheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy over the installed package names and the tests: a tree of links maps exporter/ ->
# gpulens/exporter etc., and tests/ beside it (the tests import gpulens.* and tests.*)
TYPECHECK_TREE := build/typecheck/gpulens
typecheck: venv
	@rm -rf $(dir $(TYPECHECK_TREE)) && mkdir -p $(TYPECHECK_TREE)
	@for p in src/gpulens/*; do ln -s "$(CURDIR)/$$p" $(TYPECHECK_TREE)/; done
	@for p in exporter analyzer dashboards sim remediate mixin devtools; do ln -s "$(CURDIR)/$$p" $(TYPECHECK_TREE)/$$p; done
	@ln -s "$(CURDIR)/tests" $(dir $(TYPECHECK_TREE))tests
	cd $(dir $(TYPECHECK_TREE)) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml gpulens tests

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# DEMO_ARGS passes options through, e.g. make demo DEMO_ARGS="--history 1d --live-scenario dgx-h100"
demo: venv system-deps
	$(BIN)/python -m gpulens.devtools.demo $(DEMO_ARGS)

demo-stop: venv
	$(BIN)/python -m gpulens.devtools.demo --stop

# wrk (Debian) drives the scrape load from outside Python; nvitop-exporter is the peer.
# BENCH_ARGS passes options through, e.g. make bench BENCH_ARGS=--no-analyzer, or only the analyzer's
# recording-rule run: BENCH_ARGS="--no-exporter --analyzer-runs rules"
bench: venv native thanos
	@command -v wrk >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq wrk; }
	GPULENS_THANOS=$(THANOS) $(BIN)/gpulens bench $(BENCH_ARGS)

dashboards: venv
	$(BIN)/gpulens dashboards build
	$(BIN)/python deploy/helm/generate.py

# alerts/{gpu_alerts,recording_rules}.yml and the runbooks' quoted rules from mixin/rules,
# then the PrometheusRule and the Helm chart's copies
rules: venv
	$(BIN)/gpulens mixin build
	$(BIN)/python deploy/kubernetes/generate.py

clean:
	rm -rf $(VENV) .demo build *.egg-info .pytest_cache .ruff_cache
