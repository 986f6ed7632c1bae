"""Local mode's pure part: what a user's device computes, and how the server combines reports.

- ``reports`` — the report record (``privrec.LocalReport/2``): strict parsing, the only thing a
  device sends.
- ``client`` — :class:`LocalClient`, one user's device: their exact statistic, their own noise
  state and secret seed, persisted (:class:`FileStorage`) so that a restarted client re-sends a
  pending report as it was and never redraws released noise.
- ``config`` — :class:`LocalConfig`, the public calibration every device of a namespace uses.
- ``analyzer`` — :class:`Analyzer`, the server's one fold of reports (or shuffled batches) into sums per model
  unit (no exact per-user value ever enters it), its state and codec; the worker and the offline twin run it.
- ``aggregate`` — the analyzer's primitives (the context clip, the version check, the sums' noise level).
- ``shuffle`` — :class:`Shuffler`, batches of one report per distinct user, stripped and shuffled.
- ``policy`` — :class:`LocalUCB`, the offline twin (devices + the server's sums + LinUCB per unit) that
  ``privrec experiment modes`` runs.

Nothing here imports Kafka, Redis or faust: a device can run it alone.
"""

from .aggregate import StaleReport
from .analyzer import Analyzer, AnalyzerState
from .client import FileStorage, LocalClient, MemoryStorage, ReportRefused, Storage
from .config import ALGORITHMS, LocalConfig
from .policy import LocalUCB
from .reports import SCHEMA, LocalReport, ReportError, parse_report
from .shuffle import ShuffledBatch, Shuffler

__all__ = ["ALGORITHMS", "LocalConfig", "LocalClient", "ReportRefused", "Storage", "FileStorage", "MemoryStorage", "LocalReport",
           "ReportError", "parse_report", "SCHEMA", "Analyzer", "AnalyzerState", "StaleReport", "Shuffler", "ShuffledBatch", "LocalUCB"]
