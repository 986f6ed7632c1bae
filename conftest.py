"""Root pytest configuration: doctests of the packages, minus modules that start a faust app on import."""

collect_ignore = [
    "pipeline/app.py",
    "pipeline/agents.py",
    "pipeline/timers.py",
    "pipeline/worker.py",
]
