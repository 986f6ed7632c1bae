"""Every package ``__init__.py`` is a table of contents: a docstring and an explicit ``__all__`` whose every name
exists (a submodule, a subpackage, or a name the ``__init__`` binds). Read from the source; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("models", "pipeline", "privrec", "producers", "tests")
INITS = sorted(p for root in ROOTS for p in (REPO / root).rglob("__init__.py") if "__pycache__" not in p.parts)


def _bound(tree: ast.Module) -> set[str]:
    """Names the module binds at its top level (assignments, definitions, imports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _declared_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "__all__" and getattr(node, "value", None) is not None:
            return list(ast.literal_eval(node.value))
    return None


@pytest.mark.parametrize("path", INITS, ids=[str(p.parent.relative_to(REPO)) for p in INITS])
def test_a_package_init_has_a_docstring_and_an_all_of_names_that_exist(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(REPO)
    assert ast.get_docstring(tree), f"{where} has no docstring saying what lives there"
    names = _declared_all(tree)
    assert names is not None, f"{where} has no `__all__`"
    here = path.parent
    missing = [n for n in names if n not in _bound(tree) and not (here / f"{n}.py").is_file()
               and not (here / n / "__init__.py").is_file()]
    assert not missing, f"{where}: `__all__` names {missing}, neither a submodule nor bound in the `__init__`"
