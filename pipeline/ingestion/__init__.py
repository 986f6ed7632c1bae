"""Flow, step 1: events in, exact statistics out (validated, idempotent per partition offset).

Modules
-------
ingest        the ingest stage: validate a batch of ``interactions`` events, dead-letter the bad
              ones with a reason, fold the rest into exact statistics in one atomic step
agents        the batch consumer of ``interactions`` running as a task of the faust worker, feeding
              :mod:`~pipeline.ingestion.ingest` (and, in local mode, the report processor)

``ingestion`` and ``release`` sit side by side: neither imports the other.
"""

__all__ = ["agents", "ingest", "shown_lists"]
