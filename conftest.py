"""Root pytest configuration: doctests of the packages, minus the worker's entry point."""

collect_ignore = [
    "pipeline/worker.py",  # `python -m pipeline.worker` runs a faust worker; nothing to doctest
]
