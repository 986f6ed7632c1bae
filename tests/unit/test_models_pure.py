"""``models`` is pure numpy: importing it pulls in no I/O framework."""

from __future__ import annotations

import subprocess
import sys


def test_models_imports_no_io_frameworks() -> None:
    code = (
        "import sys, models, models.policies, models.mechanisms, models.accounting, models.ground.environment\n"
        "bad = sorted(m for m in ('faust', 'redis', 'aiokafka', 'kafka', 'aiohttp', 'matplotlib') if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_public_name_is_documented() -> None:
    import models

    for name in models.__all__:
        obj = getattr(models, name)
        if callable(obj) and not isinstance(obj, dict):
            assert obj.__doc__ and obj.__doc__.strip(), f"{name} has no docstring"
