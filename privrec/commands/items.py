"""``privrec items add FILE.csv``: add items to a running stack (``POST /items``, operator token)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("items", help="add items to a running stack served from a catalog directory")
    isub = p.add_subparsers(dest="items_command", metavar="ACTION", required=True)
    add = isub.add_parser(
        "add", help="add the items of FILE.csv (the items.csv format) through POST /items",
        description="Reads FILE.csv in the items.csv format (item, name, tags and/or features; checked first, "
                    "naming file, line and column) and sends each item to POST /items with the operator token "
                    "$PRIVREC_ADMIN_TOKEN; the server publishes it to the compacted `items` topic, from which every "
                    "worker and web server adds it. Items already in the catalog are reported and left alone.")
    add.add_argument("file", type=Path, metavar="FILE.csv")
    add.add_argument("--http", default=None, help="API base URL (default: $PRIVREC_HTTP_URL, or the running stack "
                                                  "of --state-dir)")
    add.add_argument("--state-dir", type=Path, default=None, help="state directory of `privrec up`")
    add.set_defaults(func=_add)


def _add(args: argparse.Namespace) -> int:
    from producers.catalog.format import read_items
    from privrec.commands.replay import resolve_http

    token = os.environ.get("PRIVREC_ADMIN_TOKEN")
    if not token:
        raise ValueError("set PRIVREC_ADMIN_TOKEN to the operator token the stack was started with")
    if not args.file.is_file():
        raise ValueError(f"{args.file}: no such file")
    base = resolve_http(args.http, args.state_dir).rstrip("/")
    rows = read_items(args.file, _served_d(base))  # checked before anything is sent
    added = existing = 0
    refused: list[str] = []
    for item, name, tags, x, line in zip(rows.ids, rows.names, rows.tags, rows.features, rows.lines):
        body: dict[str, Any] = {"item": item, "name": name}
        if x is not None:
            body["features"] = x.tolist()
        else:
            body["tags"] = tags
        code, reply = _post(f"{base}/items", body, token)
        if code == 202:
            added += 1
        elif code == 409:
            existing += 1
        elif code in (401, 403):
            raise ValueError(f"POST /items refused the token (HTTP {code}): {reply}")
        else:
            refused.append(f"{args.file.name} line {line}: HTTP {code}: {reply}")
    print(f"added {added} items; {existing} already in the catalog; {len(refused)} refused")
    for r in refused:
        print("  " + r, file=sys.stderr)
    return 1 if refused else 0


def _served_d(base: str) -> int | None:
    """The feature dimension the stack serves (``None`` before its first model: the server checks it)."""
    try:
        with urllib.request.urlopen(f"{base}/budget", timeout=10) as resp:
            d = (json.loads(resp.read()).get("model") or {}).get("d")
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as exc:
        raise ValueError(f"cannot reach the API at {base}: {exc.reason}") from None
    return int(d) if d else None


def _post(url: str, body: dict[str, Any], token: str) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except urllib.error.URLError as exc:
        raise ValueError(f"cannot reach the API at {url}: {exc.reason}") from None
