#!/usr/bin/env bash
# Run the tests: unit tests, doctests and integration tests against a real Tansu broker and
# redis-server (benchmark and browser tests are excluded by default; see pyproject.toml).
# Extra arguments go to pytest, e.g.  ./scripts/test.sh tests/integration -x -k redis
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/bootstrap.sh"
cd "$root"
exec "${PRIVREC_VENV:-$root/.venv}/bin/python" -m pytest "$@"
