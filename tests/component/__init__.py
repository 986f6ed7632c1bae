"""Component tests: real parts of ``pipeline/``, ``privrec/``, ``producers/`` and ``deploy/`` in one process, no services.

A package, so that a basename here may repeat one in ``tests/unit`` or ``tests/integration`` (pytest's default import
mode needs unique basenames outside packages). Where a new test goes: ``tests/README.md``.
"""

__all__: list[str] = []
