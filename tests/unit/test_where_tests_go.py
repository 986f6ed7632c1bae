"""``tests/unit`` holds tests of pure code only (the rule in ``tests/README.md``), checked on the import graph.

A module here may import, directly or through any module of the repository it reaches, neither ``pipeline`` nor a
service client (redis, Kafka, faust, aiohttp). The graph is read from the source (every ``import`` statement, also
those inside functions), so the check needs no import and catches a helper that loads the pipeline lazily.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: the repository's top-level packages a test can import
PACKAGES = frozenset({"models", "pipeline", "privrec", "producers"})
#: what a unit test must not reach: the pipeline, and the clients of the services it talks to
FORBIDDEN = frozenset({"pipeline", "redis", "kafka", "aiokafka", "faust", "aiohttp"})


def _source(module: str) -> Path | None:
    """The file that defines ``module`` in the repository, or ``None`` (a name bound in a module, or not ours)."""
    base = REPO.joinpath(*module.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _imports(path: Path, module: str) -> set[str]:
    """Every module name an ``import`` statement in ``path`` names (``from a import b`` gives ``a`` and ``a.b``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against the importing module's package
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def reached(path: Path) -> set[str]:
    """Top-level names of every package reached from the test module at ``path``, through the repository's modules
    (a module's parent packages count as imported, as Python imports them first)."""
    seen: set[str] = set()
    tops: set[str] = set()
    todo = list(_imports(path, "test"))
    while todo:
        name = todo.pop()
        if not name or name in seen:
            continue
        seen.add(name)
        top = name.split(".")[0]
        tops.add(top)
        if top not in PACKAGES:
            continue
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        source = _source(name)
        if source is not None:
            todo.extend(_imports(source, name))
    return tops


UNIT_TESTS = sorted((REPO / "tests" / "unit").glob("*.py"))


@pytest.mark.parametrize("path", UNIT_TESTS, ids=[p.name for p in UNIT_TESTS])
def test_a_unit_test_reaches_neither_the_pipeline_nor_a_service_client(path: Path) -> None:
    found = sorted(reached(path) & FORBIDDEN)
    assert not found, (f"tests/unit/{path.name} reaches {', '.join(found)}: it tests more than pure code; move it to "
                       "tests/component (in process, no services) or tests/integration (see tests/README.md)")


def test_the_check_sees_a_lazy_import_through_the_repository(tmp_path: Path) -> None:
    """An import inside a test function counts, and so do the imports of the repository's modules it names
    (``privrec.ops`` imports the pipeline's settings); ``models`` alone reaches nothing forbidden."""
    probe = tmp_path / "test_probe.py"
    probe.write_text("def test_x():\n    from privrec.ops import up\n")
    assert "pipeline" in reached(probe)
    probe.write_text("import numpy as np\nfrom models.streaming import UnitStats\n")
    assert not reached(probe) & FORBIDDEN
