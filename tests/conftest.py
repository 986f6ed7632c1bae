"""Settings shared by every test folder.

- numpy math at d ≈ 25 is faster single-threaded (DESIGN §5), and tests must not fight over
  the 2 cores, so BLAS threads are pinned before anything imports numpy.
- Tests under ``tests/integration/`` get the ``integration`` marker automatically, so
  ``pytest -m 'not integration'`` runs the offline suite alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

_INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)
