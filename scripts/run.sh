#!/usr/bin/env bash
# The main job: set up if needed, then start the whole stack on this machine — the embedded
# Kafka-protocol broker (Tansu, memory-only), redis-server (AOF on), a faust worker and the
# HTTP server, on loopback, on free ports (`privrec up --catalog lastfm`) — replay a slice of
# the LastFM logs through the live API (out/replay/), and print the page URL. The stack
# keeps running after this script returns; stop it with `.venv/bin/privrec down`.
#
# Extra arguments go to `privrec up`, e.g.  ./scripts/run.sh --workers 2 --epsilon inf
# --http-port 8080. The state directory (PID files, logs, redis data) is $PRIVREC_STATE_DIR,
# default .privrec/ in the repository. A stack that already runs there is reused.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/bootstrap.sh"
cd "$root"
venv=${PRIVREC_VENV:-$root/.venv}
privrec="$venv/bin/privrec"
state=${PRIVREC_STATE_DIR:-$root/.privrec}

# --- 1. the stack ----------------------------------------------------------------------
if "$privrec" status --state-dir "$state" >/dev/null 2>&1; then
    echo "run.sh: a stack is already running in $state (extra arguments ignored); status:"
    "$privrec" status --state-dir "$state"
else
    # exits non-zero with the reason (bad setting, half-running stack, ...) and starts nothing
    # LastFM by default (the replay below needs it); later arguments override
    "$privrec" up --state-dir "$state" --catalog lastfm "$@"
fi

# --- 2. replay a slice of LastFM through the live API -----------------------------------
# Real users' logged listens drive /recommend and /feedback; the page then shows a model that
# has learned from them. PRIVREC_REPLAY_EVENTS=0 skips it.
events=${PRIVREC_REPLAY_EVENTS:-5000}
if [ "$events" -gt 0 ]; then
    "$privrec" replay lastfm --state-dir "$state" --events "$events" --rate "${PRIVREC_REPLAY_RATE:-auto}" \
        --out "$root/out/replay"
fi

# --- 3. where to look ------------------------------------------------------------------
page=$("$privrec" status --state-dir "$state" --json |
    "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["page"])')
echo
echo "privrec is running: open $page"
echo "status: $privrec status --state-dir $state    stop: $privrec down --state-dir $state"
