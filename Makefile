# memcgate: make run (local cluster + gateway), make test (what CI runs).
GO      ?= go
BIN     := bin/memcgate
PKGS    := ./...
FUZZTIME ?= 20000x
# What memcgate -version and memcgate_build_info report: the release tag
# (vMAJOR.MINOR.PATCH), or tag-N-gHASH after it, -dirty with uncommitted
# changes; the image is tagged the same (make image). Empty outside git.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS  := -s -w -X main.version=$(VERSION) -X main.revision=$(REVISION)
IMAGE    ?= memcgate

.PHONY: all build image run test vet lint fmt-check fuzz bench bench-php seed pools chaos clean deps-run deps-test

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='$(LDFLAGS)' -o $(BIN) ./cmd/memcgate

# The container image, tagged with VERSION (deploy/kubernetes pins a tag,
# never latest); the build context has no .git, so both are passed in.
image:
	docker build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $(IMAGE):$(VERSION) .

deps-run:
	@bash test/scripts/deps.sh run

deps-test:
	@bash test/scripts/deps.sh test

run: deps-run build
	@bash deploy/local/run.sh $(BIN)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# vet also for a 32-bit platform (int is 32 bits there) and for macOS,
# where developers run it and its tests: every package, tests included,
# must compile there. Windows is not supported.
vet:
	$(GO) vet $(PKGS)
	GOOS=linux GOARCH=386 $(GO) vet $(PKGS)
	GOOS=darwin GOARCH=arm64 $(GO) vet $(PKGS)

# staticcheck, pinned; a tool run from the module proxy, not a dependency
# of the binary. Not in make test: it fetches and builds the tool first.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	$(GO) run $(STATICCHECK) $(PKGS)

# Short, fixed-time runs of every fuzz target (a regression net, not a hunt).
# make test runs the same command, not a sub-make: make -n runs every
# line that names $(MAKE), and make -n test would have run the tests
# written on that line instead of printing them.
FUZZ = bash test/scripts/fuzz.sh $(FUZZTIME)
fuzz:
	@$(FUZZ)

# The packages whose fuzz targets make test runs beside the tests, at
# nice 19: those whose targets open no socket and assert no duration, so
# that the seconds a target can wait for a core while the tests take
# both fail none of them (the fuzzing engine's own bound, 10 s for one
# execution, is far above theirs, of milliseconds). The other packages'
# targets measure calls against deadlines of 1 to 3 s (upstream/mcpipe,
# upstream) or serve sockets with timeouts (gateway/h1, liveconfig's
# DNS): they run after test/abuse, at the usual priority.
FUZZ_BESIDE := ./config ./gateway ./gateway/chunk ./gateway/memc ./gateway/phpvalue ./upstream/hashring

# Test binaries make test runs at once. Most of them wait (on timeouts, on
# the memcached and gateway processes they start) more than they compute:
# go test's default, one per core, leaves the 2 cores of CI half idle. 3,
# not 4: with 4 the cores are full while test/e2e, upstream/hashring and
# gateway run, and the tests with 100 ms timeouts beside them
# (upstream/mcpipe, upstream/route) are starved past those timeouts when
# other work loads the machine too.
TESTP ?= 3

# make test runs without the MEMCGATE_ variables of the caller's
# environment: tests pass theirs on to what they start (deploy/local/run.sh
# takes every MEMCGATE_ variable over its own choices, memcgate healthcheck
# reads ADMIN_ADDR, ADMIN_TLS_CERT_FILE and CONFIG_FILE, the PHP example
# MEMCGATE_URL and MEMCGATE_UNIX_SOCKET), so that one exported while
# trying a deployment would fail them, and a MEMCGATE_TEST_ switch left
# from make chaos or make pools would change what runs. Variables given on
# make's command line are kept.
TESTENV := env $(foreach v,$(filter MEMCGATE_%,$(.VARIABLES)),$(if $(filter environment%,$(origin $(v))),-u $(v))) CI=$${CI:-} MEMCGATE_TEST_REQUIRE_MEMCACHED=1

# make test's builds (vet's, the tests', the gateway binaries they build,
# the fuzz targets') take -trimpath: without it the go command's cache
# keys hold the checkout's directory, and a clone in a new directory, as
# a clean-clone CI run makes, compiles every package of the module again
# (for the race detector, for vet's three platforms, for the fuzz
# targets) although the same source was built before; with it, what was
# built from the same source in any directory is reused. File names in
# what a failure prints are the module's (github.com/memcgate/memcgate/...)
# instead of the checkout's.
test vet fuzz: export GOFLAGS := -trimpath $(filter-out -trimpath,$(GOFLAGS))

test: deps-test fmt-check vet
	# Every package's tests but test/abuse's, -p $(TESTP) at a time; go
	# test's own vet is off, as make vet ran every analyzer on the same
	# packages. Then the abuse suite with no other test beside it: its
	# canary measures the gateway's latency, which other packages' tests
	# running on the same cores would decide. Then upstream again on
	# gomemcache's pool (MEMCGATE_PIPELINE_CONNS=0) beside the fuzz
	# targets of the other packages: its tests mostly wait, the fuzzers
	# compute. The fuzz targets of FUZZ_BESIDE run from the start at nice
	# 19, on the CPU the tests leave (they wait more than they compute),
	# their output kept until they end. Every part runs; the first that
	# failed gives the status.
	log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
	FUZZ_TARGET_TIMEOUT=30m nice -n 19 $(FUZZ) $(FUZZ_BESIDE) > "$$log" 2>&1 & beside=$$!; \
	tests=0; $(TESTENV) $(GO) test -race -count=1 -vet=off -p $(TESTP) -timeout 15m $$(bash test/scripts/testpkgs.sh $(PKGS)) || tests=$$?; \
	abuse=0; $(TESTENV) $(GO) test -race -count=1 -vet=off -timeout 5m ./test/abuse || abuse=$$?; \
	$(TESTENV) $(GO) test -race -count=1 -vet=off ./upstream -args -pipeline-conns=0 & up=$$!; \
	nice=0; wait $$beside || nice=$$?; cat "$$log"; \
	fuzz=0; $(FUZZ) --not $(FUZZ_BESIDE) || fuzz=$$?; \
	upstream=0; wait $$up || upstream=$$?; \
	for rc in $$tests $$abuse $$nice $$fuzz $$upstream; do [ $$rc = 0 ] || exit $$rc; done

# Seed 000 reproduced: 101 keys through a 100 ms-per-direction delay relay,
# serial vs batch vs async vs UDP; prints the table.
seed: deps-run
	MEMCGATE_TEST_SEED_DELAY=$${MEMCGATE_TEST_SEED_DELAY:-100ms} bash test/scripts/filtered.sh '\||delay|PASS|FAIL|ok' $(GO) test -count=1 -run '^TestSeedLatency$$' -v ./test/e2e

# Issue #19's figures: a replicated pool losing a node under load, and
# hedged reads against a slowed node, 20 s per phase (make test runs the
# same tests at 2 s); prints the tables of docs/benchmarks.md.
pools: deps-test
	MEMCGATE_TEST_POOLS_PHASE=$${MEMCGATE_TEST_POOLS_PHASE:-20s} bash test/scripts/filtered.sh '\||one of|GETs|written|slowed|PASS|FAIL|ok' $(GO) test -count=1 -timeout 30m -run '^(TestReplicaDeathUnderLoad|TestHedgedReads)$$' -v ./test/pools

# The chaos run: stale reads and keys kept while nodes are killed, paused,
# restarted and reloaded away, per configuration; prints the table of
# docs/benchmarks.md. Timing-dependent, so not in make test.
chaos: deps-test
	MEMCGATE_TEST_CHAOS=1 bash test/scripts/filtered.sh '\||stale reads|PASS|FAIL|ok' $(GO) test -count=1 -timeout 30m -run '^TestChaos$$' -v ./test/chaos

# memcgate against nginx + HttpMemcModule on one memcached, on loopback
# (test/bench/bench.sh, results in docs/benchmarks.md); about 9 minutes,
# BENCH_QUICK=1 for a 1-minute smoke run.
bench: build
	@bash test/bench/bench.sh

# The seed's workload: PHP pages (nginx + php-fpm) reading a key through
# memcgate (TCP and Unix socket), through nginx + HttpMemcModule and
# directly with php-memcached, a new connection per page (test/bench/php.sh,
# results in docs/benchmarks.md); about 10 minutes, BENCH_QUICK=1 for a
# smoke run.
bench-php: build
	@bash test/bench/php.sh

clean:
	rm -rf bin
