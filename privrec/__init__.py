"""privrec: command-line entry point, experiments and benchmarks.

This package is the glue around the three working packages: ``models`` (pure
numpy math), ``pipeline`` (Kafka, faust, Redis, HTTP) and ``producers`` (event
sources). It holds the ``privrec`` command, the offline experiments that
reproduce the papers, and the benchmarks.
"""

__all__: list[str] = []
