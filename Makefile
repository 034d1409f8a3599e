# Convenience targets; each is one script a newcomer can also run directly.
.PHONY: dev test test-short test-held-ports bench bench-smoke bench-peers flowbench chaos build install

# bin/tokenbus, counting the packages it compiles (a first build: minutes; README "Two commands").
build:
	./scripts/build

# tokenbus into $(go env GOBIN), else $(go env GOPATH)/bin (~/go/bin): put that on your PATH.
install:
	go install ./cmd/tokenbus

dev: build
	bin/tokenbus dev

test:
	./scripts/test

# the inner loop: go vet and the tests in -short mode (no deployment checks, no benchmark smoke)
test-short:
	./scripts/test -short

# the suite beside listeners that hold tokenbus's default ports and never answer (scripts/test-held-ports all: also
# beside listeners that answer garbage, and ones that reset)
test-held-ports:
	./scripts/test-held-ports

bench:
	./scripts/bench all

bench-smoke:
	./scripts/bench smoke

# tokenbus against vllm-router and sglang-router (installed from PyPI into .cache/); docs/performance.md
bench-peers:
	./scripts/bench peers

chaos:
	./scripts/chaos

# flow control's figures against issue 34's targets (docs/scheduling.md): ~8 minutes; -short for a ~40 s smoke
flowbench:
	./scripts/flowbench
