"""The empirical privacy audit: Monte-Carlo distinguishers between worst-case neighbours (see README.md)."""

__all__: list[str] = []
