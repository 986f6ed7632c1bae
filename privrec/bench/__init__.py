"""Benchmarks behind ``privrec bench``; each prints numbers and returns a JSON document."""

__all__: list[str] = []
