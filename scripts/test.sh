#!/usr/bin/env bash
# Run the tests: unit tests, doctests and integration tests against a real Tansu broker and
# redis-server and a headless-Chromium test of the web page (benchmarks are excluded; see pyproject.toml).
# Extra arguments go to pytest, e.g.  ./scripts/test.sh tests/integration -x -k redis
#
# Three pytest-xdist workers by default (PRIVREC_TEST_WORKERS; 0 runs in this process): most
# integration tests wait on the broker and the release tick (a run on two workers keeps the two
# cores ~40 % busy), so a third worker on two cores fills the waits. `--dist loadscope` keeps each module (and its shared stack) on one worker.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/bootstrap.sh"
cd "$root"
exec "${PRIVREC_VENV:-$root/.venv}/bin/python" -m pytest -n "${PRIVREC_TEST_WORKERS:-3}" --dist loadscope "$@"
