#!/usr/bin/env bash
# Validation of the deployment artifacts (docker-compose.yml, deploy/):
# compose files, the Helm chart against Kubernetes schemas, the NATS config and
# its permissions (a real nats-server), the Dockerfile, Grafana and Prometheus
# config, the Prometheus rules (promtool check and unit tests), and the
# autoscaling queries against a real Prometheus scraping a running tokenbus.
# Offline once the Go modules, one PyPI wheel and one Debian package are
# fetched.
#
#   deploy/validate/run.sh [go test flags...]      e.g. -run NATS -v
#
# Needs Go, python3 with pip (only to download the wheel of
# kubernetes-validate, whose bundled Kubernetes JSON schemas the chart is
# validated against; nothing of it is installed or run), and Debian's
# prometheus package (prometheus and promtool), which it installs with apt-get
# (as root or through sudo) when they are missing.
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

# Prometheus and promtool: Debian's package (2.42). Its service must not start:
# the tests run their own Prometheus on a port chosen at run time, and nothing
# of the package may be left listening on 9090.
need_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  mkdir -p "$cache"
  ( # under a lock: a second run at the same time waits for the first's install
    flock 9
    if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
      echo "== installing prometheus (Debian's package: prometheus and promtool)"
      if [ ! -e /usr/sbin/policy-rc.d ]; then
        # Debian's way to keep a package's services from starting on install.
        need_root sh -c 'printf "#!/bin/sh\nexit 101\n" >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d'
        trap 'need_root rm -f /usr/sbin/policy-rc.d' EXIT
      fi
      need_root apt-get update -qq
      need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
      if [ -d /run/systemd/system ]; then # systemd runs here: make sure, and keep it off at boot
        need_root systemctl disable --now prometheus >/dev/null 2>&1 || true
      fi
    fi
  ) 9>"$cache/install.lock"
fi
# Under run.sh missing Prometheus binaries are an error, not a skip.
export TOKENBUS_VALIDATE_REQUIRE_PROMETHEUS=1

echo "== tokenbus-probe (product module)"
(cd "$root" && go vet ./deploy/probe && go test -count=1 ./deploy/probe)

echo "== deploy/validate"
cd "$here"
go vet ./...
go test -count=1 -timeout 5m ./... "$@"
echo "== deploy validation took $(( $(date +%s) - start ))s"
