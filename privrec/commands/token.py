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
    from pipeline.serve.auth import OPERATOR_ENV, SECRET_ENV, user_token
    from privrec.ops.stackfile import TOKENS_FILE, default_state_dir, read_tokens

    if args.operator:
        operator = os.environ.get(OPERATOR_ENV)
        if not operator:
            sd = args.state_dir or default_state_dir()
            stored = read_tokens(sd)
            operator = None if stored is None else stored.operator
            if not operator:
                raise ValueError(f"no operator token: set {OPERATOR_ENV}, or pass the --state-dir of the `privrec up` "
                                 f"that started the stack (no {sd / TOKENS_FILE})")
        print(operator)
        try:
            from privrec.commands.replay import resolve_http

            print(f"{resolve_http(args.http, args.state_dir)}/dashboard#token={operator}")
        except ValueError:
            pass
        return 0
    secret = os.environ.get(SECRET_ENV)
    if not secret:
        sd = args.state_dir or default_state_dir()
        tokens = read_tokens(sd)
        if tokens is None:
            raise ValueError(f"no token secret: set {SECRET_ENV}, or pass the --state-dir of the `privrec up` that "
                             f"started the stack (no {sd / TOKENS_FILE})")
        secret = tokens.secret
    token = user_token(secret, args.user)
    print(token)
    try:
        from privrec.commands.replay import resolve_http

        base = resolve_http(args.http, args.state_dir)
    except ValueError:
        return 0
    print(f"{base}/?{urllib.parse.urlencode({'user': args.user})}#token={token}")
    return 0
