# amgo: Active Messages in pure Go, with MPI on top.
# Set-up is two commands: `make demo` (an amgo program over real processes)
# and `make test` (the whole suite, as CI runs it).

GO          ?= go
BIN         := bin
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# Packages with goroutines or shared memory: run again under the race detector.
RACE_PKGS   := ./am/... ./handlers/... ./flowctl/... ./internal/... ./mpiam/... ./trace/...
FUZZTIME    ?= 20s

.PHONY: all build test race demo bench bench-scale bench-cluster pgo lint fuzz clean soak cluster

all: build

build:
	$(GO) build ./...
	$(GO) build -o $(BIN)/ ./cmd/... ./examples/... ./bench/...

test: build
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 8m ./...
	$(GO) test -race -count=1 -timeout 8m $(RACE_PKGS)

race:
	$(GO) test -race -count=1 $(RACE_PKGS)

# The main job: an MPI program (the heat solver, checked against a serial
# solve) over real processes sharing memory, launched by amrun; then the MPI
# ping-pong and the AM-level token ring.
demo: build
	$(BIN)/amrun -n 4 $(BIN)/heat
	$(BIN)/amrun -n 2 $(BIN)/pingpong -max 1048576 -i 1000
	$(BIN)/amrun -n 4 --tag-output $(BIN)/am-ring -laps 1000

# OSU-style benchmarks of amgo (loop, shm, tcp) beside Open MPI and MPICH
# (installed if missing), 3 interleaved repetitions: docs/performance.md.
bench: build
	GO=$(GO) BIN=$(BIN) bench/run.sh $(BENCHFLAGS)

# bench/osu/default.pgo, the profile osu is built with (profile-guided
# optimization), from runs of its small-message tests: docs/performance.md.
pgo:
	GO=$(GO) bench/pgo.sh

# 2-node jobs on an emulated cluster (root): amgo beside MPICH and Open MPI
# across nodes, same node in a 2-node job, two-level collectives.
bench-cluster: build
	GO=$(GO) BIN=$(BIN) bench/run.sh -cluster $(BENCHFLAGS)

# Memory per rank and run time of the README's program at 16, 64 and 128
# ranks on one node beside Open MPI and MPICH, and in-process at 64 and 256.
bench-scale: build
	GO=$(GO) BIN=$(BIN) bench/scale.sh $(SCALE_SIZES)

lint:
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# Every fuzz target of the module (found with go test -list), each for
# FUZZTIME; their seed corpora also run in `make test`.
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; \
	    $(GO) test -run XXX -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

# The MPI soak over the simulated faulty network (10% loss, 30% reordering,
# 1% duplication): SOAK messages (default 10^6), each checked by content and
# order; `go test` runs 10^4. AMGO_SIM_SEED=N replays the seed a failure printed.
SOAK ?= 1e6
soak:
	AMGO_SOAK=$(SOAK) $(GO) test -count=1 -timeout 2h -parallel 8 -run '^TestSoak$$' -v ./mpiam/

# Jobs across the nodes of an emulated cluster (internal/cluster: network,
# UTS, mount, IPC and PID namespaces per node, joined by a bridge), launched
# by MPICH's Hydra through an ssh stand-in and by a real Slurm (slurmctld, a
# slurmd per node, munge), and a node lost mid-job. Needs root; skips
# otherwise (and the Slurm test without slurm-wlm and munge).
cluster:
	AMGO_CLUSTER=1 $(GO) test -count=1 -timeout 10m -run 'AcrossNodes|NodesAre' -v ./internal/cluster/ ./mpiam/

clean:
	rm -rf $(BIN)
