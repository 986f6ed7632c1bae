"""Plot helpers shared by the experiments (headless matplotlib, ε axes, saving)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["pyplot", "epsilon_axis", "save"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the headless Agg backend (imported lazily: the CLI stays fast)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def epsilon_axis(ax: Any, epsilons: Sequence[float]) -> None:
    """A log-scaled x axis with one labelled tick per ε."""
    ax.set_xscale("log")
    ax.set_xticks(list(epsilons))
    ax.set_xticklabels([f"{e:g}" for e in epsilons])
    ax.set_xticks([], minor=True)  # no unlabelled or "3 x 10^0" minor ticks between them
    ax.set_xlabel("ε")


def save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
