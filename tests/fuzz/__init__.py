"""Property-based tests (hypothesis, schemathesis) of the decoders and the HTTP API; see ``conftest.py`` here."""

__all__: list[str] = []
