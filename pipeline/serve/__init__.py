"""Flow, step 4: answers from the published serving models only.

Nothing here imports the trusted store (:mod:`pipeline.state`), ingestion or the release: an
import contract in ``pyproject.toml`` keeps it so.

Modules
-------
serving       UCB recommendations from the published serving models
appkeys       the typed keys of the web application's shared state
budget_view   what ``/budget``, ``/budget/history`` and the dashboard say (public ledger keys only)
openapi       the HTTP API's contract (``GET /openapi.json``)
shown         the shown lists of ``GET /recommend``, kept for feedback and logged behind the answer
outbox        the web server's durable outbox: feedback survives a broker outage, counted once
items_live    new items while the stack runs: ``POST /items``, the compacted ``items`` topic
auth          who may read a per-user view: user tokens (HMAC of the user id) and the operator token
"""

__all__ = ["appkeys", "auth", "budget_view", "httpio", "httpstats", "items_live", "openapi", "outbox", "serving", "shown"]
