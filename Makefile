# Convenience targets; each is one script a newcomer can also run directly.
.PHONY: dev test bench bench-smoke chaos build

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

chaos:
	./scripts/chaos
