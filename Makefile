# Convenience targets; each is one script a newcomer can also run directly.
.PHONY: dev test bench bench-smoke bench-peers chaos build

build:
	go build -o tokenbus ./cmd/tokenbus

dev:
	go run ./cmd/tokenbus dev

test:
	./scripts/test

bench:
	./scripts/bench all

bench-smoke:
	./scripts/bench smoke

# tokenbus against vllm-router and sglang-router (installed from PyPI into .cache/); docs/performance.md
bench-peers:
	./scripts/bench peers

chaos:
	./scripts/chaos
