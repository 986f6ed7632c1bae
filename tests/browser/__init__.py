"""Browser tests of the web page (marker ``browser``; see ``conftest.py`` here).

A package, so that its ``conftest.py`` is imported as ``browser.conftest``: as a bare
``conftest`` it would collide with ``tests/conftest.py`` under ``--doctest-modules``.
"""

__all__: list[str] = []
