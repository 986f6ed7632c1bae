"""The peer of ``privrec bench serve``: the least an aiohttp server can do for ``GET /recommend``.

``python -m privrec.bench.minimal --port P`` answers every ``GET`` with one constant JSON document shaped
like a ``/recommend`` answer with ten items, on the same stack as ``pipeline.apps.web`` (aiohttp, uvloop's event
loop, no access log), so the ratio of the two servers' requests/s under the same load measures what
privrec's own work costs per request (parse, score, store the shown list, log it), not what aiohttp and the
loopback cost.

>>> body = constant_body()
>>> doc = json.loads(body)
>>> len(doc["items"]), doc["model_version"]
(10, 1)
"""

from __future__ import annotations

import argparse
import json

__all__ = ["constant_body", "main"]


def constant_body() -> bytes:
    """A ``/recommend``-shaped answer (ten items), encoded once."""
    items = [{"item": str(i), "name": f"arm {i}", "score": 0.5, "mean": 0.25, "bonus": 0.25} for i in range(10)]
    return json.dumps({"user": "0", "unit": 0, "rec_id": "0" * 32, "model_version": 1, "items": items}).encode()


def main(argv: list[str] | None = None) -> None:
    import uvloop
    from aiohttp import web

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    body = constant_body()

    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None, loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
