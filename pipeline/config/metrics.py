"""Prometheus metrics of a worker (``/metrics`` on its own loopback port) and the ledger's public figures.

A worker serves its registry with ``prometheus_client``'s HTTP server on ``127.0.0.1``
(``PRIVREC_METRICS_PORT``; 0, the default, picks a free port) and reports the URL in its ops record,
so ``privrec status`` lists it. Names follow Prometheus' conventions: ``privrec_`` prefix, base units,
``_total`` for counters, ``_seconds`` for durations.

:func:`ledger_figures` reads the user-level ledger (public keys only) and turns it into the numbers
``/budget``, ``/dashboard`` and the metrics show: users, users at the cap and at the lifetime budget, the
distribution of the users' spent epsilon.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from models.accounting import gdp_epsilon

from .keys import PublicKeys
from .ledger import LifetimeBudget

__all__ = ["WorkerMetrics", "serve_metrics", "ledger_figures", "ledger_classes"]


class WorkerMetrics:
    """The worker's metrics (ingest on every worker; releases on the leader)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ingested = Counter("privrec_events_ingested_total", "Interactions counted by ingest", registry=r)
        self.dead = Counter("privrec_dead_letters_total", "Events sent to dead-letters, by reason", ["reason"],
                            registry=r)
        self.releases = Counter("privrec_releases_total", "Releases published by this worker (as leader)",
                                registry=r)
        self.release_seconds = Histogram("privrec_release_duration_seconds", "Duration of a release tick (fold, "
                                         "release, persist, publish, solve)", registry=r,
                                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
        self.lag = Gauge("privrec_ingest_lag_messages", "Messages behind the end of the assigned partitions",
                         registry=r)
        self.users_at_cap = Gauge("privrec_users_at_cap", "Users at the contribution cap in the current epoch",
                                  registry=r)
        self.dropped = Gauge("privrec_capped_events", "Events not learned from because their user was at the cap",
                             registry=r)
        self.users_at_budget = Gauge("privrec_users_at_budget", "Users at their lifetime budget (user_budget): no "
                                     "longer learned from", registry=r)
        self.budget_events = Gauge("privrec_budget_events", "Events not learned from because their user was at the "
                                   "lifetime budget", registry=r)
        self.spent_max = Gauge("privrec_budget_spent_max_epsilon", "Largest privacy loss (epsilon) of any user",
                               registry=r)
        self.spent_median = Gauge("privrec_budget_spent_median_epsilon", "Median privacy loss (epsilon) of the "
                                  "users with at least one contribution", registry=r)


def serve_metrics(metrics: WorkerMetrics, port: int = 0, addr: str = "127.0.0.1") -> str:
    """Serve ``metrics`` on ``addr:port`` (0: a free port) in a daemon thread; return the URL."""
    server, _thread = start_http_server(port, addr=addr, registry=metrics.registry)
    return f"http://{addr}:{server.server_port}/metrics"


def ledger_classes(get_all: Callable[[str], dict[bytes, bytes]], namespace: str, partitions: int) -> collections.Counter[str]:
    """Users per class of their participation record (:attr:`~pipeline.config.ledger.LedgerRecord.class_field`),
    over every partition: the partition's class counts where the fold keeps them, else counted from its
    participation hash (a namespace before them, or local mode, which keeps none)."""
    from .ledger import class_counts

    keys = PublicKeys(namespace)
    total: collections.Counter[str] = collections.Counter()  # (prometheus_client's Counter is a metric)
    for p in range(partitions):
        kept = get_all(keys.ledger_classes(p))
        if kept:
            total.update({name.decode(): int(n) for name, n in kept.items() if int(n)})
        else:
            total.update(class_counts(get_all(keys.ledger_participation(p)).values()))
    return total


def ledger_figures(get_all: Callable[[str], dict[bytes, bytes]], namespace: str, partitions: int, *,
                   epoch: int, cap: int, mu_cap: float | None, delta: float,
                   ratio: Callable[[int], float] | None, budget: LifetimeBudget | None = None) -> dict[str, Any]:
    """Users, users at the cap and at the lifetime budget, events not learned from (cap, budget) and the
    distribution of the users' spent epsilon (``spent``: epsilon -> users), from the public ledger.

    ``get_all(key)`` is a Redis ``HGETALL``; ``ratio(k) = B(k) / B(cap)`` of the mechanism. ``mu_cap`` or
    ``ratio`` ``None``: noise off, and anyone who contributed has an infinite epsilon. ``budget``: the users'
    lifetime budget (``None``: none enforced, nobody is at it). The figures depend on a user's record only through
    its class (``epoch:k:past``), so they are computed once per class (:func:`ledger_classes`), not per user.
    """
    from .ledger import LedgerRecord, spent_mu, weighted_upper_median

    keys = PublicKeys(namespace)
    spent: collections.Counter[float] = collections.Counter()
    users = at_cap = at_budget = 0
    dropped = over_budget = 0
    for name, n in ledger_classes(get_all, namespace, partitions).items():
        rec = LedgerRecord.of_class(name).at(epoch, ratio or (lambda k: 1.0))
        users += n
        if rec.epoch == epoch and rec.k >= cap:
            at_cap += n
        if budget is not None and budget.exhausted(rec, epoch):
            at_budget += n
        if mu_cap is None or ratio is None:
            spent[math.inf if (rec.k or rec.past) else 0.0] += n
        else:
            mu = spent_mu(rec, epoch, mu_cap, ratio)
            spent[gdp_epsilon(mu, delta) if mu > 0 else 0.0] += n
    for p in range(partitions):
        summary = get_all(keys.ledger_summary(p))
        dropped += int(summary.get(b"dropped", b"0"))
        over_budget += int(summary.get(b"over_budget", b"0"))
    values = sorted((v, n) for v, n in spent.items() if v > 0)
    return {"users": users, "users_at_cap": at_cap, "capped_events": dropped, "users_at_budget": at_budget,
            "budget_events": over_budget, "spent": dict(spent),
            "spent_max": values[-1][0] if values else 0.0,
            "spent_median": weighted_upper_median(values)}


