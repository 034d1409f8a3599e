#!/usr/bin/env bash
# Static validation of the deployment artifacts (docker-compose.yml, deploy/):
# compose files, the Helm chart against Kubernetes schemas, the NATS config and
# its permissions (a real nats-server), the Dockerfile, Grafana and Prometheus
# config. Offline once the Go modules and one PyPI wheel are fetched.
#
#   deploy/validate/run.sh [go test flags...]      e.g. -run NATS -v
#
# Needs Go and python3 with pip (only to download the wheel of
# kubernetes-validate, whose bundled Kubernetes JSON schemas the chart is
# validated against; nothing of it is installed or run).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
start=$(date +%s)

# Kubernetes JSON schemas: the kubernetes-validate wheel, read as a zip.
kv_version=1.37.0
cache="${TOKENBUS_VALIDATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tokenbus-validate}"
wheel="$cache/kubernetes_validate-$kv_version-py3-none-any.whl"
if [ -z "${TOKENBUS_K8S_SCHEMAS:-}" ]; then
  mkdir -p "$cache"
  ( # under a lock: a second run at the same time waits for the first's download
    flock 9
    if [ ! -s "$wheel" ]; then
      echo "== downloading the kubernetes-validate $kv_version wheel (Kubernetes JSON schemas, 23 MB)"
      python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --dest "$cache" "kubernetes-validate==$kv_version"
    fi
  ) 9>"$cache/download.lock"
  export TOKENBUS_K8S_SCHEMAS="$wheel"
fi
# Under run.sh a missing schema set is an error, not a skip.
export TOKENBUS_VALIDATE_REQUIRE_SCHEMAS=1

echo "== tokenbus-probe (product module)"
(cd "$root" && go vet ./deploy/probe && go test -count=1 ./deploy/probe)

echo "== deploy/validate"
cd "$here"
go vet ./...
go test -count=1 -timeout 5m ./... "$@"
echo "== deploy validation took $(( $(date +%s) - start ))s"
