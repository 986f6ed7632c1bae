"""Subcommands of ``privrec``; each module exposes ``register(subparsers)``."""

__all__: list[str] = []
