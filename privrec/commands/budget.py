"""``privrec budget``: the privacy guarantee of a running stack, and what one user has spent.

``--user U`` is a per-user view: the command sends the operator token (``$PRIVREC_OPERATOR_TOKEN``, else the
stack's ``tokens.json`` in the state directory, :func:`privrec.ops.stackfile.stack_tokens`).
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("budget", help="show the privacy guarantee of the released statistics (and of one user)",
                       description="Ask the running stack's /budget: the event-level guarantee of every release, "
                                   "releases so far, and with --user the group-privacy guarantee covering all of "
                                   "that user's interactions (a per-user view: sent with the operator token, "
                                   "$PRIVREC_OPERATOR_TOKEN or the stack's tokens.json).")
    p.add_argument("--user", default=None, help="a user id")
    p.add_argument("--http", default=None, help="API base URL (default: $PRIVREC_HTTP_URL or the running stack)")
    p.add_argument("--state-dir", type=Path, default=None, help="state directory of `privrec up`")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.set_defaults(func=_budget)


def operator_token(state_dir: Path | None, why: str = "a per-user view") -> str:
    """``$PRIVREC_OPERATOR_TOKEN``, else the operator token of the stack's ``tokens.json`` (``--state-dir``,
    ``$PRIVREC_STATE_DIR`` or ``.privrec``); ``why`` names what needs it in the error."""
    from pipeline.serve.auth import OPERATOR_ENV
    from privrec.ops.stackfile import TOKENS_FILE, default_state_dir, read_tokens

    if os.environ.get(OPERATOR_ENV):
        return os.environ[OPERATOR_ENV]
    sd = state_dir or default_state_dir()
    tokens = read_tokens(sd)
    if tokens is None or tokens.operator is None:
        raise ValueError(f"{why} needs the operator token: set {OPERATOR_ENV}, or pass the --state-dir "
                         f"of the `privrec up` that started the stack (no {sd / TOKENS_FILE})")
    return tokens.operator


def _budget(args: argparse.Namespace) -> int:
    from privrec.commands.replay import resolve_http

    base = resolve_http(args.http, args.state_dir)
    url = f"{base}/budget" + (f"?{urllib.parse.urlencode({'user': args.user})}" if args.user else "")
    if args.user is not None:
        headers = {"Authorization": f"Bearer {operator_token(args.state_dir)}"}
    else:  # the operator's figures where there is a token (add/remove: the ledger is answered to it only)
        try:
            headers = {"Authorization": f"Bearer {operator_token(args.state_dir)}"}
        except ValueError:
            headers = {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read() or b"{}")
        raise ValueError(body.get("error", {}).get("message", f"HTTP {exc.code}")) from None
    except urllib.error.URLError as exc:
        raise ValueError(f"cannot reach {base}: {exc.reason}") from None
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    p = doc["privacy"]
    if p.get("mode") == "local":  # the devices add the noise: their guarantee, in their words
        print(f"local mode ({p['algorithm']}): {p['statement']}")
        print(f"trusted: {p['trusted']}")
    elif not p.get("private"):
        print(f"no privacy: {p.get('guarantee')}")
    else:
        unit = "per user and epoch (a capped user's whole history)" if p.get("unit") == "user" else "per interaction"
        print(f"every release: ({p['epsilon']:.4g}, {p['delta']:.2g})-DP {unit} "
              f"[{p['mechanism']}: {p['mechanism_about']}]" + ("" if p.get("valid") else " — NOT a valid DP proof"))
        print(f"neighbours: {p['neighbours']}")
        if p.get("relation"):
            print(f"relation: {p['relation']}; public: {'; '.join(p.get('public', []))}")
        for st in p.get("statistics", []):
            if "sensitivity_per_tick" in st:
                print(f"  {st['name']}: {st['released']}; clip {st['clip']:.4g} ({st['clip_of']}), per-tick "
                      f"sensitivity {st['sensitivity_per_tick']:.4g} ({st['sensitivity_rule']})")
            else:
                print(f"  {st['name']}: {st['released']}")
    if p.get("protected"):
        print("protected: " + "; ".join(p["protected"]))
        print("public: " + "; ".join(p["public"]))
    print(f"releases: {doc['releases']}  events released: {doc['events_released']}  "
          f"tree: epoch {doc['tree']['epoch']}, tick {doc['tree']['tick_in_epoch']} of {doc['tree']['ticks_per_epoch']}")
    if "ledger" in doc:
        led = doc["ledger"]
        rows = [("users", led["users"]), ("users at the cap", f"{led['users_at_cap']} (cap {led['cap']} ticks/epoch)"),
                ("events not learned (cap)", led["capped_events"]),
                ("users at the lifetime budget", "– (none enforced)" if led.get("user_budget") is None else
                 f"{led['users_at_budget']} (user_budget epsilon {led['user_budget']:g})"),
                ("events not learned (budget)", led.get("budget_events", 0)),
                ("largest epsilon spent", f"{led['spent_max']:.4g}"),
                ("median epsilon spent", f"{led['spent_median']:.4g}")]
        width = max(len(r[0]) for r in rows)
        print("user-level ledger:")
        for name, value in rows:
            print(f"  {name:<{width}}  {value}")
        hist = led.get("spent_histogram") or {}
        if hist.get("counts"):
            e = hist["edges"]
            print("  spent epsilon   users")
            for i, c in enumerate(hist["counts"]):
                print(f"  [{e[i]:.3g}, {e[i + 1]:.3g})".ljust(18) + f"{c}")
    acl = doc.get("redis_acl")
    if acl is not None and not acl["enforced"]:
        print(f"redis ACL: {acl['note']}")
    if "user" in doc:
        u = doc["user"]
        if "reports" in u:  # local mode
            print(f"user {u['user']}: {u['reports']} reports → {u['bound']}")
            return 0
        eps = "∞" if u["epsilon"] is None else f"{u['epsilon']:.4g}"
        if u.get("unit") == "user":
            print(f"user {u['user']}: {u['interactions']} interactions in {u['ticks_this_epoch']} of at most {u['cap']} "
                  f"release ticks this epoch{' (AT THE CAP)' if u['at_cap'] else ''} → ({eps}, {u['delta']:.2g})-DP "
                  f"over their whole history" + (f"; AT THE LIFETIME BUDGET (epsilon {u['user_budget']:g}): no longer "
                                                 f"learned from" if u.get("at_budget") else ""))
        else:
            print(f"user {u['user']}: {u['interactions']} interactions → ({eps}, {u['delta']:.2g})-DP over all of them "
                  f"({u['bound']})")
    return 0
