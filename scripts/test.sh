#!/usr/bin/env bash
# Run the tests: unit tests, doctests and integration tests against a real Tansu broker and
# redis-server and a headless-Chromium test of the web page (benchmarks are excluded; see pyproject.toml).
# Extra arguments go to pytest, e.g.  ./scripts/test.sh tests/integration -x -k redis
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/bootstrap.sh"
cd "$root"
exec "${PRIVREC_VENV:-$root/.venv}/bin/python" -m pytest "$@"
