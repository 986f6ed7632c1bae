"""Local mode's pure part: what a user's device computes, and how the server combines reports.

- ``reports`` — the report record (``privrec.LocalReport/2``): strict parsing, the only thing a
  device sends.
- ``client`` — :class:`LocalClient`, one user's device: their exact statistic, their own noise
  state and secret seed, persisted (:class:`FileStorage`) so that a restarted client re-sends a
  pending report as it was and never redraws released noise.
- ``config`` — :class:`LocalConfig`, the public calibration every device of a namespace uses.
- ``aggregate`` — :class:`LocalAggregate`, the server's sums of reports per model unit (no exact
  per-user value ever enters it), and the public noise level of the sum.
- ``shuffle`` — :class:`Shuffler`, batches of one report per distinct user, stripped and shuffled.
- ``policy`` — :class:`LocalUCB`, the offline twin (devices + the server's sums + LinUCB per unit) that
  ``privrec experiment modes`` runs.

Nothing here imports Kafka, Redis or faust: a device can run it alone.
"""

from .aggregate import LocalAggregate, StaleReport
from .client import FileStorage, LocalClient, MemoryStorage, ReportRefused, Storage
from .config import ALGORITHMS, LocalConfig
from .policy import LocalUCB
from .reports import SCHEMA, LocalReport, ReportError, parse_report
from .shuffle import ShuffledBatch, Shuffler

__all__ = ["ALGORITHMS", "LocalConfig", "LocalClient", "ReportRefused", "Storage", "FileStorage", "MemoryStorage", "LocalReport",
           "ReportError", "parse_report", "SCHEMA", "LocalAggregate", "StaleReport", "Shuffler", "ShuffledBatch", "LocalUCB"]
