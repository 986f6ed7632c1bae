"""Root pytest configuration: doctests of the packages, minus the worker's entry point."""

collect_ignore = [
    "pipeline/apps/worker.py",  # `python -m pipeline.apps.worker` runs a faust worker; nothing to doctest
]
