"""The web server's per-request metrics, counted in plain Python and turned into Prometheus metrics at scrape time.

``prometheus_client``'s ``Counter.inc`` and ``Histogram.observe`` take a lock and walk the buckets on every
call; on ``/recommend``'s path that was a measurable share of the server's CPU (``docs/serving-performance.md``).
:class:`RequestStats` keeps a count per ``(endpoint, status)`` and, per endpoint, one count per latency bucket
and the sum, in dicts and lists (one server thread updates them, from the event loop); ``/metrics`` reads them
through :meth:`RequestStats.collect` as the same two families as before:

* ``privrec_http_requests_total{endpoint, status}`` (counter),
* ``privrec_http_request_seconds{endpoint}`` (histogram, buckets :data:`BUCKETS`).

Examples
--------
>>> from prometheus_client import CollectorRegistry, generate_latest
>>> reg = CollectorRegistry()
>>> stats = RequestStats(reg)
>>> stats.observe("/recommend", 200, 0.0007); stats.observe("/recommend", 200, 0.003)
>>> text = generate_latest(reg).decode()
>>> 'privrec_http_requests_total{endpoint="/recommend",status="200"} 2.0' in text
True
>>> 'privrec_http_request_seconds_bucket{endpoint="/recommend",le="0.001"} 1.0' in text
True
>>> 'privrec_http_request_seconds_bucket{endpoint="/recommend",le="+Inf"} 2.0' in text
True
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

__all__ = ["RequestStats", "BUCKETS"]

#: Upper bounds (seconds) of the latency histogram's buckets (``+Inf`` is added).
BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


class RequestStats:
    """Request counts and latency histograms of the web server, a Prometheus collector.

    Parameters
    ----------
    registry
        Registry to register with (``None``: not registered).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.counts: dict[tuple[str, int], int] = {}
        # endpoint -> [count per bucket (the last: beyond every bound), ..., sum of the seconds]
        self.latency: dict[str, list[float]] = {}
        if registry is not None:
            registry.register(self)

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        """Count a request to ``endpoint`` answered with ``status`` after ``seconds``."""
        key = (endpoint, status)
        counts = self.counts
        counts[key] = counts.get(key, 0) + 1
        row = self.latency.get(endpoint)
        if row is None:
            row = self.latency[endpoint] = [0.0] * (len(BUCKETS) + 2)
        row[bisect_left(BUCKETS, seconds)] += 1  # the first bound >= seconds: Prometheus' "le"
        row[-1] += seconds

    def collect(self) -> Iterator[Metric]:
        """The two metric families (called by the registry at scrape time)."""
        requests = CounterMetricFamily("privrec_http_requests", "HTTP requests", labels=["endpoint", "status"])
        for (endpoint, status), n in sorted(self.counts.items()):
            requests.add_metric([endpoint, str(status)], n)
        yield requests
        latency = HistogramMetricFamily("privrec_http_request_seconds", "HTTP request latency", labels=["endpoint"])
        for endpoint, row in sorted(self.latency.items()):
            cumulative, buckets = 0.0, []
            for bound, count in zip((*(repr(b) for b in BUCKETS), "+Inf"), row[:-1]):
                cumulative += count
                buckets.append((bound, cumulative))
            latency.add_metric([endpoint], buckets, sum_value=row[-1])
        yield latency

    def describe(self) -> list[Metric]:
        """Nothing up front: the registry then does not call :meth:`collect` at registration."""
        return []
