#!/usr/bin/env bash
# Idempotent set-up for privrec; scripts/run.sh and scripts/test.sh call it first.
#
#   1. a virtualenv at $PRIVREC_VENV (default: .venv in the repo), made with python3.11
#      or python3 (>= 3.11);
#   2. `pip install -e '.[test]'`, skipped when the stamp in the venv matches the hash of
#      pyproject.toml and this checkout's path;
#   3. redis-server from apt-get when missing (apt-get update only if the install fails
#      without it).
#
# A second run with everything in place takes well under a second.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${PRIVREC_VENV:-$root/.venv}

say() { printf 'bootstrap: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"
    else die "need root to run: $*"
    fi
}

# apt_install PKG...: install Debian packages; refresh the package lists only if needed.
apt_install() {
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install these by hand: $*"
    export DEBIAN_FRONTEND=noninteractive
    say "apt-get install $*"
    if ! as_root apt-get install -y -q --no-install-recommends "$@" >/dev/null; then
        say "apt-get update, then retry"
        as_root apt-get update -q >/dev/null
        as_root apt-get install -y -q --no-install-recommends "$@" >/dev/null
    fi
}

find_python() {
    local candidate
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
            command -v "$candidate"
            return
        fi
    done
    die "need Python >= 3.11 (python3.11 or python3 on PATH)"
}

# --- 1. virtualenv ---------------------------------------------------------------------
if [ ! -x "$venv/bin/python" ]; then
    python=$(find_python)
    say "creating $venv with $python"
    if ! "$python" -m venv "$venv" 2>/dev/null; then
        # Debian's own python3 ships venv/ensurepip separately.
        rm -rf "$venv"
        apt_install python3-venv
        "$python" -m venv "$venv"
    fi
fi

# --- 2. Python packages ----------------------------------------------------------------
stamp="$venv/.privrec-install-stamp"
want="$(sha256sum <"$root/pyproject.toml" | cut -d' ' -f1) $root"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "pip install -e '.[test]' (pyproject.toml changed or first run)"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$root[test]"
    printf '%s\n' "$want" >"$stamp"
fi

# --- 3. system packages ----------------------------------------------------------------
command -v redis-server >/dev/null 2>&1 || apt_install redis-server
# Debian's Chromium + ChromeDriver for the browser tests (tests/browser, marker `browser`): Playwright
# drives /usr/bin/chromium; `playwright install` is never run (it downloads a browser, offline here).
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
# Debian's prometheus provides promtool: the tests run `promtool check metrics` on every /metrics
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# Debian's docker-compose (Compose 1.x, no Docker engine needed): `docker-compose config` validates deploy/
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
