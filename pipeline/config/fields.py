"""How a setting is declared: once, as a field of :class:`pipeline.config.settings.Settings`.

Each field of ``Settings`` is made by :func:`setting`, which stores a :class:`SettingInfo` in the
field's metadata: its group, its help, whether it defines the model (``MODEL_FIELDS``), the value
the env example shows and whether that value belongs in a Secret. Its name, type and default are
the dataclass field's own. From that one declaration come the ``--flags`` and their help
(:func:`add_arguments`), ``MODEL_FIELDS``, and the generated files of ``privrec settings``
(:mod:`privrec.ops.settings_files`: ``deploy/privrec.env.example``, ``deploy/k8s/configmap.yaml``,
``docs/settings.md``).

Examples
--------
>>> env_name("tick_seconds"), env_name("lambda_"), env_name("kafka")
('PRIVREC_TICK_SECONDS', 'PRIVREC_LAMBDA', 'KAFKA_BOOTSTRAP')
>>> flag_name("lambda_")
'--lambda'
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["GROUPS", "SettingInfo", "setting", "info", "declared", "env_name", "flag_name", "env_value",
           "add_arguments"]

#: The groups of settings, in the order the generated files list them, with what each holds.
GROUPS: dict[str, str] = {
    "connections": "where the services are: Kafka, Redis, the namespace of the keys and the topic's partitions",
    "model": "the model and its privacy: algorithm, mechanism, budget, catalog and the serving model",
    "local": "local mode: what a device reports and how the reports are shuffled",
    "federated": "federated mode: the sites and how they share",
    "operations": "how the processes run; may change between restarts",
}

#: Endpoints read from their conventional variables rather than ``PRIVREC_*``.
_ENDPOINT_VARS = {"kafka": "KAFKA_BOOTSTRAP", "redis_url": "REDIS_URL"}


@dataclass(frozen=True)
class SettingInfo:
    """What a setting's declaration says beyond its name, type and default.

    Attributes
    ----------
    group
        One of :data:`GROUPS`.
    help
        What the setting does, for ``--help``, the env example and the docs table (one paragraph).
    model
        Whether it defines the model and its privacy: stored in Redis with the namespace, and a worker
        started later with another value is refused (``MODEL_FIELDS``).
    choices
        The values it accepts, when they are a fixed list (shown in the help; the check is the class's).
    notes
        Longer explanation, for the docs page only (``None``: the help says everything).
    example
        The value the env example writes (``None``: the default). An empty string writes ``NAME=``.
    example_set
        Whether the env example sets it (an uncommented line); ``None``: when its default is not ``None``.
    secret
        Whether a deployment keeps it in a Secret rather than a ConfigMap (endpoints, credentials).
    """

    group: str
    help: str
    model: bool = False
    choices: tuple[Any, ...] | None = None
    notes: str | None = None
    example: str | None = None
    example_set: bool | None = None
    secret: bool = False

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"`group` must be one of {tuple(GROUPS)}, got {self.group!r}.")

    def described(self, sep: str = ", ") -> str:
        """The help, after the list of ``choices`` (joined by ``sep``) unless the help already names every one.

        >>> SettingInfo(group="model", help="tick or doubling", choices=("tick", "doubling")).described()
        'tick or doubling'
        >>> SettingInfo(group="model", help="share when", choices=("tick", "doubling")).described(" | ")
        'one of: tick | doubling; share when'
        """
        if self.choices is None or all(str(c) in self.help for c in self.choices):
            return self.help
        return f"one of: {sep.join(map(str, self.choices))}; {self.help}"


def setting(default: Any, *, group: str, help: str, model: bool = False, choices: tuple[Any, ...] | None = None,
            notes: str | None = None, example: str | None = None, example_set: bool | None = None,
            secret: bool = False) -> Any:
    """A dataclass field with ``default`` that carries its :class:`SettingInfo` (see the module docstring)."""
    meta = SettingInfo(group=group, help=" ".join(help.split()), model=model, choices=choices,
                       notes=None if notes is None else " ".join(notes.split()), example=example,
                       example_set=example_set, secret=secret)
    return dataclasses.field(default=default, metadata={"setting": meta})


def info(f: dataclasses.Field[Any]) -> SettingInfo:
    """The declaration of field ``f``."""
    meta: SettingInfo = f.metadata["setting"]
    return meta


def declared(cls: type) -> Iterator[tuple[dataclasses.Field[Any], SettingInfo]]:
    """Every field of ``cls`` with its declaration, in declaration order."""
    for f in dataclasses.fields(cls):
        yield f, info(f)


def env_name(name: str) -> str:
    """The environment variable of setting ``name``."""
    return _ENDPOINT_VARS.get(name) or "PRIVREC_" + name.rstrip("_").upper()


def flag_name(name: str) -> str:
    """The command-line flag of setting ``name``."""
    return "--" + name.rstrip("_").replace("_", "-")


def env_value(value: Any) -> str:
    """``value`` as an environment variable's text; ``repr`` keeps floats exact (0.1 stays 0.1, inf stays inf)."""
    return repr(value) if isinstance(value, float) else str(value)


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type) -> None:
    """Add one ``--flag`` per setting of ``cls`` (default ``None``: fall back to the environment)."""
    for f, meta in declared(cls):
        about = meta.described().replace("%", "%%")  # argparse formats help with %
        parser.add_argument(flag_name(f.name), dest=f.name, default=None, metavar=f.name.rstrip("_").upper(),
                            help=f"{about} (env {env_name(f.name)}; default {f.default!r})")
