#!/usr/bin/env bash
# Run the tests: unit tests, doctests and integration tests against a real Tansu broker and
# redis-server and a headless-Chromium test of the web page (benchmarks are excluded; see pyproject.toml).
# Extra arguments go to pytest, e.g.  ./scripts/test.sh tests/integration -x -k redis
#
# Four pytest-xdist workers by default (PRIVREC_TEST_WORKERS; 0 runs in this process): most
# integration tests wait on the broker and the release tick (a run on two workers keeps the two
# cores ~40 % busy), so more workers than cores fill the waits (on 2 cores: 15.1 min on three
# workers, 14.2 on four, the same 1,803 tests, one after the other on a quiet machine). `--dist loadscope` keeps each module (and its shared stack) on one worker.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/bootstrap.sh"
cd "$root"
exec "${PRIVREC_VENV:-$root/.venv}/bin/python" -m pytest -n "${PRIVREC_TEST_WORKERS:-4}" --dist loadscope "$@"
