"""``privrec token --user U``: the token that opens user U's per-user views, and their page link; ``--operator``: the
operator token and the dashboard link.

The token is ``HMAC-SHA256(secret, U)`` (:mod:`pipeline.serve.auth`) with the stack's secret
(``$PRIVREC_TOKEN_SECRET``, else the state directory's ``tokens.json``): the operator gives it to U alone.
"""

from __future__ import annotations

import argparse
import os
import urllib.parse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("token", help="print the token that opens one user's per-user views (operator only)",
                       description="Print user U's token (HMAC-SHA256 of the stack's secret and U), which opens "
                                   "GET /budget?user=U and the page's privacy panel for U, and the page link that "
                                   "carries it (in the URL fragment, which the browser never sends). Reads the "
                                   "secret from $PRIVREC_TOKEN_SECRET or the stack's tokens.json.")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", help="a user id")
    who.add_argument("--operator", action="store_true",
                     help="the operator token instead, and the dashboard link that carries it (under the add/remove "
                          "relation the dashboard's participation figures need it)")
    p.add_argument("--http", default=None, help="API base URL for the link (default: $PRIVREC_HTTP_URL or the "
                                                "running stack; no link without one)")
    p.add_argument("--state-dir", type=Path, default=None, help="state directory of `privrec up`")
    p.set_defaults(func=_token)


def _token(args: argparse.Namespace) -> int:
    from pipeline.serve.auth import SECRET_ENV, user_token
    from privrec.commands.budget import operator_token
    from privrec.commands.replay import resolve_http
    from privrec.ops.stackfile import TOKENS_FILE, default_state_dir, read_tokens

    if args.operator:
        token = operator_token(args.state_dir, "the dashboard's link")
        link = "/dashboard"
    else:
        secret = os.environ.get(SECRET_ENV)
        if not secret:
            sd = args.state_dir or default_state_dir()
            tokens = read_tokens(sd)
            if tokens is None:
                raise ValueError(f"no token secret: set {SECRET_ENV}, or pass the --state-dir of the `privrec up` "
                                 f"that started the stack (no {sd / TOKENS_FILE})")
            secret = tokens.secret
        token = user_token(secret, args.user)
        link = f"/?{urllib.parse.urlencode({'user': args.user})}"
    print(token)
    try:
        base = resolve_http(args.http, args.state_dir)
    except ValueError:  # no running stack known: the token alone
        return 0
    print(f"{base}{link}#token={token}")
    return 0
