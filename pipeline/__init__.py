"""pipeline: moves data between Kafka, Redis and the math in ``models``.

The tree follows the flow of an interaction (ingest -> release -> solve -> serve) and the three
trust modes, which differ only in where the statistics are perturbed and how the noisy parts are
aggregated (DESIGN §1): the global mode is the flow itself; a mode package holds what a mode adds.

Layout (each layer imports only the layers below it; siblings on one line do not import each
other; checked by the import contracts in ``pyproject.toml``)
---------------------------------------------------------------------------------------------
apps          the processes: the faust worker (``python -m pipeline.apps.worker``), the HTTP API and
              page (``python -m pipeline.apps.web``), wiring the flow and the modes together
modes         what each non-global trust mode adds: ``modes.local`` (devices add the noise: report
              ingest, sums of reports, ``POST /report``) and ``modes.federated`` (sites, the
              coordinator, serving each user from their site's model); the modes never import each other
serve | ingestion | release
              the flow: ``serve`` answers from the published models only (never the trusted store,
              ingest or the release); ``ingestion`` validates events into exact statistics,
              idempotently; ``release`` runs the leader's release (mechanism state persisted before
              publishing) and solve, and the per-unit baselines' release
state | data | services
              ``state``: the trusted store (exact statistics, offsets, noise state, the noise secret,
              user-level contributions); ``data``: the item catalogs and the records of the public
              topics; ``services``: the embedded broker and redis-server, tracked processes
config        the ground: settings, the public Redis key layout and ledger record, Kafka and Redis
              connections, the ACL users, worker metrics, fault points

Only ``serve`` and the layers above it import the web framework (aiohttp).

Submodules are not imported here, so ``import pipeline`` stays cheap and importing the serving
code never loads the trusted store; import the module you need.
"""

__all__ = ["apps", "modes", "serve", "ingestion", "release", "state", "data", "services", "config"]
