#!/usr/bin/env python3
"""Move ``pipeline/`` into subpackages (issue 23) and rewrite every reference to the moved modules.

Re-runnable and idempotent: run it after merging a branch written against the flat layout, and it

1. ``git mv``-s the files of :data:`MOVES` that are still at their old place (a file git's rename
   detection already carried to the new place is left alone; both places present is an error to
   resolve by hand);
2. rewrites, in every tracked text file, the references to old modules: absolute imports and dotted
   names (``pipeline.web``, ``"pipeline.trusted.TrustedStore.publish"`` monkeypatch targets,
   ``python -m pipeline.worker``, ``:mod:`` roles, doctest output), relative imports inside
   ``pipeline/`` (``from .keys import X``, ``from . import faults``; a statement importing modules
   that now live in different packages is split, one statement per package), ``from pipeline import
   acl, services``, file paths (``pipeline/web.py``, ``"pipeline" / "web.py"``, ``pipeline/static``)
   and the package data of ``pyproject.toml``;
3. lists the modules still directly in ``pipeline/`` (each must be added to :data:`MOVES`, or the
   exhaustive layers contract of ``pyproject.toml`` fails).

New names never equal an old module's name (no ``pipeline/ingest/`` package beside the old
``pipeline/ingest.py``), so a name is old or new without context and a second run changes nothing.
A relative import is read in the new layout first and in the old one only if it names nothing there.

Usage: ``python3 scripts/restructure.py [--check]`` from the repository root (``--check``: change
nothing, exit 1 if a run would change something).

Merging branches written against the flat layout (tried on the branches of 2026-11-25)::

    git merge A B ...                        # the other branches first, in the flat layout
    git checkout restructure -- scripts/restructure.py
    python3 scripts/restructure.py           # moves + rewrites their code too; commit
    git commit -qam "pipeline/ in subpackages (scripts/restructure.py)"
    git merge -X ours restructure            # same moves and lines on both sides; brings the package
                                             # maps, README, docs/, contracts, tests
    # a moved module git does not see as renamed on our side (main's local_http.py on 2026-11-25:
    # "rename/delete"): keep ours, e.g. git checkout --ours -- pipeline/modes/local/local_http.py && git add it
    python3 scripts/restructure.py           # must say: 0 moves, 0 files rewritten
    lint-imports && ./scripts/test.sh

A module another branch added directly in ``pipeline/`` is listed at the end of a run: give it a place in
:data:`MOVES` (the layers contract is exhaustive) and run again. The hand edits the branch made to files
other branches may touch are in :data:`FIXUPS`, so the run reproduces them and ``-X ours`` loses nothing.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve()
#: files that spell the old layout on purpose (this script and its test), and the files the restructure
#: branch rewrote by hand (the package map, the README, the layer test): left alone, a run on a branch
#: without the restructure leaves them as they were, so merging the restructure branch takes its versions
#: without a conflict. In ``pyproject.toml`` only the package data is rewritten (the branch brings the
#: import contracts).
EXCLUDE = {SELF, ROOT / "tests" / "unit" / "test_restructure.py", ROOT / "pipeline" / "__init__.py",
           ROOT / "README.md", ROOT / "tests" / "unit" / "test_layers.py"}

#: old module -> new module (the subpackages follow the flow and the trust modes)
MOVES: dict[str, str] = {
    # config: the ground every process stands on
    "pipeline.settings": "pipeline.config.settings",
    "pipeline.keys": "pipeline.config.keys",
    "pipeline.ledger": "pipeline.config.ledger",
    "pipeline.acl": "pipeline.config.acl",
    "pipeline.kafkaconn": "pipeline.config.kafkaconn",
    "pipeline.redisconn": "pipeline.config.redisconn",
    "pipeline.metrics": "pipeline.config.metrics",
    "pipeline.faults": "pipeline.config.faults",
    # data: the items and the records that flow
    "pipeline.catalog": "pipeline.data.catalog",
    "pipeline.catalog_base": "pipeline.data.catalog_base",
    "pipeline.catalog_open": "pipeline.data.catalog_open",
    "pipeline.records": "pipeline.data.records",
    # state: the trusted store (serving never imports it)
    "pipeline.trusted": "pipeline.state.trusted",
    "pipeline.userlevel": "pipeline.state.userlevel",
    # the flow: ingestion -> release (and solve) -> serve
    "pipeline.ingest": "pipeline.ingestion.ingest",
    "pipeline.agents": "pipeline.ingestion.agents",
    "pipeline.stages": "pipeline.release.stages",
    "pipeline.timers": "pipeline.release.timers",
    "pipeline.baseline_release": "pipeline.release.baseline_release",
    "pipeline.serving": "pipeline.serve.serving",
    "pipeline.appkeys": "pipeline.serve.appkeys",
    "pipeline.budget_view": "pipeline.serve.budget_view",
    "pipeline.openapi": "pipeline.serve.openapi",
    "pipeline.shown": "pipeline.serve.shown",
    "pipeline.outbox": "pipeline.serve.outbox",
    "pipeline.items_live": "pipeline.serve.items_live",
    # the modes: what each adds to the global mode's flow
    "pipeline.localmode": "pipeline.modes.local.localmode",
    "pipeline.local_http": "pipeline.modes.local.local_http",
    "pipeline.sites": "pipeline.modes.federated.sites",
    "pipeline.federation": "pipeline.modes.federated.federation",
    "pipeline.coordinator": "pipeline.modes.federated.coordinator",
    "pipeline.federated_serving": "pipeline.modes.federated.federated_serving",
    # apps: the processes, wiring the flow and the modes together
    "pipeline.app": "pipeline.apps.worker_app",
    "pipeline.worker": "pipeline.apps.worker",
    "pipeline.web": "pipeline.apps.web",
    # modules the branches written beside issue 23 add directly in pipeline/ (moved once merged)
    "pipeline.esa": "pipeline.modes.local.esa",
    "pipeline.shuffler_service": "pipeline.modes.local.shuffler_service",
    "pipeline.httpstats": "pipeline.serve.httpstats",
}

#: old directory -> new directory (moved whole)
DIR_MOVES: dict[str, str] = {"pipeline/static": "pipeline/apps/static"}

#: modules that stay where they are
STAYS = {"pipeline", "pipeline.services"}

#: The restructure branch's hand edits to files other branches may edit too, done by the script as well: a run
#: on a merge of those branches then produces the same lines as the branch, and merging it brings no conflict.
#: (path in the new layout, text before, text after); each applied where the text before is found.
FIXUPS: list[tuple[str, str, str]] = [
    ("pipeline/serve/appkeys.py",
     "from __future__ import annotations\n\nfrom aiohttp import web\n",
     "from __future__ import annotations\n\nfrom typing import TYPE_CHECKING\n\nfrom aiohttp import web\n"),
    ("pipeline/serve/appkeys.py",
     "from ..modes.federated.federated_serving import SiteRouter\nfrom ..config.keys import PublicKeys\n"
     "from .serving import Recommender\nfrom ..config.settings import Settings\n",
     "from ..config.keys import PublicKeys\nfrom .serving import Recommender\nfrom ..config.settings import Settings\n"
     "\nif TYPE_CHECKING:  # an annotation only: serving does not import a mode\n"
     "    from ..modes.federated.federated_serving import SiteRouter\n"),
    ("tests/unit/test_ops_deploy.py", r'(pipeline\.[a-z_]+)", text)', r'(pipeline(?:\.[a-z_]+)+)", text)'),
    # the README's sections moved to docs/
    ("models/mechanisms/participation.py", '(README, "Privacy\n#: guarantees")', '(docs/privacy.md, "Privacy\n#: guarantees")'),
    ("pipeline/apps/web.py", '(README, "Latency")', '(docs/serving.md, "Latency")'),
    ("pipeline/config/settings.py", '(README, "Privacy\n#: guarantees")', '(docs/privacy.md, "Privacy\n#: guarantees")'),
    ("pipeline/config/settings.py", '(README, "Continual-release mechanisms")',
     '(docs/experiments.md, "Continual-release mechanisms")'),
    ("pipeline/config/settings.py", '(README, "Privacy guarantees")', '(docs/privacy.md, "Privacy guarantees")'),
    ("pipeline/config/settings.py", ':attr:`lifetime_budget` (README, "A', ':attr:`lifetime_budget` (docs/privacy.md, "A'),
    ("pipeline/config/settings.py", "(README: why 10)", "(docs/privacy.md: why 10)"),
    ("pipeline/config/settings.py", "see the README section 'Your own catalog')", "see docs/own-data.md)"),
    ("pipeline/serve/items_live.py", '(README, "Privacy": new items)', "(docs/privacy.md: new items)"),
    ("pipeline/serve/openapi.py", '(README, \\"Serving\\")', "(docs/serving.md)"),
    ("privrec/experiments/modes.py", "(0.79, README)", "(0.79, docs/serving.md)"),
    ("producers/catalog/__init__.py", 'See the README section "Your own catalog" for the format',
     'See ``docs/own-data.md`` ("Your own catalog") for the format'),
]

_OLD_NAMES = sorted((m.split(".", 1)[1] for m in MOVES), key=len, reverse=True)
_ALT = "|".join(_OLD_NAMES)
_DOTTED = re.compile(rf"(?<![\w.])pipeline\.({_ALT})(?!\w)")
_PATH = re.compile(rf"(?<![\w.-])pipeline/({_ALT})\.py(?!\w)")
_JOINED = re.compile(rf"\"pipeline\"(\s*/\s*)\"({_ALT})\.py\"")
_DIRS = [(re.compile(rf"(?<![\w.-]){re.escape(old)}(?![\w.])"), new) for old, new in DIR_MOVES.items()]
_IMPORT = re.compile(
    r"^(?P<indent>[ \t]*)from[ \t]+(?P<mod>\.+[\w.]*|pipeline(?:\.\w+)*)[ \t]+import[ \t]+"
    r"(?P<names>\([^)]*\)|[^\n#()]*?)(?P<trail>[ \t]*(?:#[^\n]*)?)$",
    re.MULTILINE,
)
_TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".sh", ".service", ".example",
                  ".env", ".json", ".rst", ".html", ".js", ".css", ".lua", ""}


def _path_of(module: str) -> str:
    return module.replace(".", "/")


def _exists(module: str) -> bool:
    """A module or package of the working tree (the new layout, once the moves are done)."""
    p = ROOT / _path_of(module)
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _is_package(module: str) -> bool:
    return (ROOT / _path_of(module) / "__init__.py").is_file()


# ------------------------------------------------------------------------------------------------ moves

def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def move(check: bool) -> list[str]:
    """The ``git mv``-s still to do (done unless ``check``); an error if a module is at both places.

    A moved directory that a merge brought new files into at its old place (``pipeline/static/x.js``)
    has those files moved one by one.
    """
    todo, clash = [], []
    for o, n in MOVES.items():
        old, new = _path_of(o) + ".py", _path_of(n) + ".py"
        if (ROOT / old).exists() and (ROOT / new).exists():
            clash.append(f"{old} and {new}")
        elif (ROOT / old).exists():
            todo.append((old, new))
    for old, new in DIR_MOVES.items():
        if not (ROOT / old).exists():
            continue
        if not (ROOT / new).exists():
            todo.append((old, new))
            continue
        for f in sorted(p for p in (ROOT / old).rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            rel = f.relative_to(ROOT / old)
            if (ROOT / new / rel).exists():
                clash.append(f"{old}/{rel} and {new}/{rel}")
            else:
                todo.append((f"{old}/{rel}", f"{new}/{rel}"))
    if clash:
        sys.exit("restructure: both the old and the new file exist (merge the old one's changes into the new "
                 "one, git rm the old one, rerun):\n  " + "\n  ".join(clash))
    if not check:
        for old, new in todo:
            (ROOT / new).parent.mkdir(parents=True, exist_ok=True)
            _git("mv", old, new)
    missing = sorted({str(Path(_path_of(n)).parent) for n in MOVES.values()
                      if (ROOT / _path_of(n)).with_suffix(".py").exists()
                      and not (ROOT / _path_of(n)).parent.joinpath("__init__.py").exists()})
    if missing:  # the packages' __init__.py (their docstring maps) come with the restructure branch
        print("restructure: packages without __init__.py (merge the restructure branch): " + ", ".join(missing))
    return [f"git mv {o} {n}" for o, n in todo]


# ------------------------------------------------------------------------------------------------ imports

def _module_of(path: Path) -> str | None:
    """``pipeline.apps.web`` for ``pipeline/apps/web.py``; None outside the packages."""
    rel = path.relative_to(ROOT)
    if rel.suffix != ".py" or not (ROOT / rel.parts[0] / "__init__.py").is_file():
        return None
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _old_module(module: str) -> str:
    for old, new in MOVES.items():
        if new == module:
            return old
    return module


def _resolve(spec: str, package: str) -> str:
    """The absolute module of ``from <spec> import``, read from ``package``."""
    if not spec.startswith("."):
        return spec
    level = len(spec) - len(spec.lstrip("."))
    base = package.split(".")
    base = base[: len(base) - (level - 1)]
    rest = spec[level:]
    return ".".join(base + ([rest] if rest else []))


def _relative(target: str, package: str) -> str:
    t, p = target.split("."), package.split(".")
    common = 0
    while common < min(len(t), len(p)) and t[common] == p[common]:
        common += 1
    return "." * (len(p) - common + 1) + ".".join(t[common:])


def _new(module: str) -> str:
    """The new name of an old module (or of something inside it), else the name itself."""
    for old in sorted(MOVES, key=len, reverse=True):
        if module == old or module.startswith(old + "."):
            return MOVES[old] + module[len(old):]
    return module


def _current(module_now: str, module_old: str) -> str | None:
    """Where an import names, read in the new layout, else in the old one; None: nowhere."""
    if _exists(module_now):
        return module_now
    if _new(module_old) != module_old:
        return _new(module_old)
    if _exists(module_old):
        return module_old
    return None


def _names(text: str) -> list[str]:
    inner = text.strip()
    if inner.startswith("("):
        inner = inner[1:-1]
    inner = re.sub(r"#[^\n]*", "", inner)
    return [n.strip() for n in inner.replace("\n", " ").split(",") if n.strip()]


def rewrite_imports(text: str, module: str | None) -> str:
    """Rewrite the ``from X import ...`` statements of one file (``module``: its name, if a module)."""
    package_now = package_old = None
    if module is not None:
        is_init = (ROOT / _path_of(module) / "__init__.py").is_file()
        old_module = _old_module(module)
        package_now = module if is_init else module.rsplit(".", 1)[0]
        package_old = old_module if is_init else old_module.rsplit(".", 1)[0]

    def fix(m: re.Match[str]) -> str:
        spec = m.group("mod")
        relative = spec.startswith(".")
        if relative and package_now is None:
            return m.group(0)
        target_now = _resolve(spec, package_now) if relative else spec
        target_old = _resolve(spec, package_old) if relative else spec

        def spell(target: str) -> str:
            return _relative(target, package_now) if relative else target

        def respell(target: str) -> str:
            return m.group(0).replace(f"from {spec} import", f"from {spell(target)} import", 1)

        if _is_package(target_now) or (not _exists(target_now) and _is_package(target_old)):
            # from PKG import a, b: the names may be modules that moved apart
            home = target_now if _exists(target_now) else target_old
            groups: dict[str, list[str]] = {}
            for name in _names(m.group("names")):
                bare = name.split(" as ")[0].strip()
                if _is_package(target_now) and _exists(f"{target_now}.{bare}"):
                    parent = target_now
                elif _new(f"{target_old}.{bare}") != f"{target_old}.{bare}":
                    parent = _new(f"{target_old}.{bare}").rsplit(".", 1)[0]
                elif not _exists(f"{target_now}.{bare}") and _exists(f"{target_old}.{bare}"):
                    parent = target_old  # an unmoved module (``from . import services``)
                else:  # a name defined in the package
                    parent = home
                groups.setdefault(parent, []).append(name)
            if list(groups) == [target_now]:
                return m.group(0)
            if len(groups) == 1:
                return respell(next(iter(groups)))
            lines = [f"{m.group('indent')}from {spell(p)} import {', '.join(ns)}" for p, ns in groups.items()]
            lines[-1] += m.group("trail")
            return "\n".join(lines)
        where = _current(target_now, target_old)
        if where is None or where == target_now:
            return m.group(0)
        return respell(where)

    return _IMPORT.sub(fix, text)


def _joined(m: re.Match[str]) -> str:
    """``"pipeline" / "web.py"`` -> ``"pipeline" / "apps" / "web.py"``."""
    parts = _path_of(MOVES["pipeline." + m.group(2)]).split("/")
    sep = m.group(1)
    return sep.join(f'"{p}"' for p in parts[:-1]) + sep + f'"{parts[-1]}.py"'


def rewrite(text: str, path: Path) -> str:
    """Every reference of one file to an old module or path, in the new layout."""
    if path.name == "pyproject.toml":  # package data only: paths inside the pipeline package
        for old, new in DIR_MOVES.items():
            o, n = old.split("/", 1)[1], new.split("/", 1)[1]
            text = re.sub(rf'^(pipeline = \[.*?)"{re.escape(o)}/', rf'\1"{n}/', text, flags=re.MULTILINE)
        return text
    # outside .py files (code blocks of the docs) only the absolute imports are read
    text = rewrite_imports(text, _module_of(path) if path.suffix == ".py" else None)
    text = _DOTTED.sub(lambda m: MOVES["pipeline." + m.group(1)], text)
    text = _PATH.sub(lambda m: _path_of(MOVES["pipeline." + m.group(1)]) + ".py", text)
    text = _JOINED.sub(_joined, text)
    for pattern, new in _DIRS:
        text = pattern.sub(new, text)
    for where, before, after in FIXUPS:
        if path == ROOT / where and before in text:
            text = text.replace(before, after)
    return text


def tracked_text_files() -> list[Path]:
    out = []
    for name in _git("ls-files", "-z").split("\0"):
        p = ROOT / name
        if not name or not p.is_file() or p.resolve() in EXCLUDE:
            continue
        if p.suffix not in _TEXT_SUFFIXES and p.name not in {"Procfile", "Dockerfile"}:
            continue
        try:
            p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        out.append(p)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a run would change something")
    args = ap.parse_args()
    moves = move(args.check)
    if args.check and moves:
        print("\n".join(moves))
        return 1
    changed = []
    for p in tracked_text_files():
        before = p.read_text(encoding="utf-8")
        after = rewrite(before, p)
        if after != before:
            changed.append(str(p.relative_to(ROOT)))
            if not args.check:
                p.write_text(after, encoding="utf-8")
    for line in moves:
        print(line)
    print(f"restructure: {len(moves)} moves, {len(changed)} files {'to rewrite' if args.check else 'rewritten'}")
    for c in changed:
        print("  " + c)
    loose = sorted(p.stem for p in (ROOT / "pipeline").glob("*.py") if p.name != "__init__.py")
    if loose:
        print("restructure: modules still directly in pipeline/ (add them to MOVES): " + ", ".join(loose))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
