#!/usr/bin/env bash
# The main job: set up if needed, then reproduce the papers' Table 1 (quick settings) into
# out/table1/ (JSON + Markdown + PNG). Extra arguments go to `privrec experiment table1`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/bootstrap.sh"
cd "$root"
exec "${PRIVREC_VENV:-$root/.venv}/bin/privrec" experiment table1 --quick --out out/table1 "$@"
