"""The live web apps of the HTTP fuzz targets (started by ``conftest.web``): a synchronous request helper."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

D = 5
N_USERS = 6
N_ARMS = 30


#: aiohttp's HTTP parser refuses a request line longer than this with its own plain-text 400, before the app
MAX_LINE = 8190


@dataclass
class Reply:
    status: int
    content_type: str
    body: bytes
    #: length of the request target (path and query) as sent
    target_length: int = 0

    @property
    def refused_by_the_http_parser(self) -> bool:
        """A request line too long for aiohttp's parser: its plain-text 400, not the app's answer."""
        return (self.status == 400 and self.target_length > MAX_LINE - 20
                and self.body.startswith(b"Got more than %d bytes" % MAX_LINE))

    def json(self) -> Any:
        return json.loads(self.body)


class WebApps:
    """Three live apps on one event loop; :meth:`request` is synchronous (for hypothesis' sync tests)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clients: dict[str, Any], redis_url: str,
                 settings: dict[str, Any], tokens: Any) -> None:
        self.loop = loop
        self.clients = clients
        self.redis_url = redis_url
        self.settings = settings
        #: the apps' :class:`pipeline.serve.auth.Tokens` (one secret and operator token for the three)
        self.tokens = tokens
        self._rec_ids: dict[tuple[str, str], tuple[str, list[str]]] = {}

    def request(self, app: str, method: str, path_and_query: str, body: bytes | None = None,
                content_type: str | None = "application/json", authorization: str | None = None) -> Reply:
        return self.loop.run_until_complete(self._request(app, method, path_and_query, body, content_type,
                                                          authorization))

    async def _request(self, app: str, method: str, path_and_query: str, body: bytes | None,
                       content_type: str | None, authorization: str | None) -> Reply:
        from yarl import URL

        client = self.clients[app]
        headers = {"Content-Type": content_type} if content_type is not None and body is not None else {}
        if authorization is not None:
            headers["Authorization"] = authorization
        # encoded=True: the path and query go out byte for byte as the strategy built them (escapes and all)
        url = URL(str(client.make_url("/")).rstrip("/") + path_and_query, encoded=True)
        async with client.session.request(method, url, data=body, headers=headers) as resp:
            raw = await resp.read()
            return Reply(resp.status, resp.headers.get("Content-Type", ""), raw, len(path_and_query))

    def shown_list(self, app: str, user: str = "1") -> tuple[str, list[str]]:
        """A fresh ``(rec_id, items)`` from ``GET /recommend`` (each call a new, unanswered list)."""
        r = self.request(app, "GET", f"/recommend?user={user}&k=3")
        assert r.status == 200, r.body
        doc = r.json()
        return doc["rec_id"], [it["item"] for it in doc["items"]]

    def shared_list(self, app: str, user: str = "1") -> tuple[str, list[str]]:
        """One ``(rec_id, items)`` per app and user for the whole session (most examples never get far enough
        to answer it; one that does claims it only with a producer, and there is none)."""
        key = (app, user)
        if key not in self._rec_ids:
            self._rec_ids[key] = self.shown_list(app, user)
        return self._rec_ids[key]


