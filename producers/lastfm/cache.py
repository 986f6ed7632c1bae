"""On-disk cache of built LastFM artifacts: ``.npz`` arrays plus a JSON manifest.

An entry is a directory ``<cache_dir>/<key>/`` holding ``meta.json`` and one
``.npz`` per artifact (no pickles: arrays are loaded with
``allow_pickle=False``). The key is a SHA-256 over the schema version, the
build parameters and the SHA-256 of every input file's content, so editing,
replacing or touching-with-new-content any input file, or changing a parameter,
selects a new entry and triggers a rebuild. Entries are written to a temporary
directory and renamed into place, so a crash never leaves a half-written
entry. Old entries are not deleted; remove the directory to reclaim space.

Examples
--------
>>> import tempfile
>>> root = Path(tempfile.mkdtemp())
>>> write_entry(root / "k1", {"a": {"x": np.arange(3)}}, {"n": 3})
>>> arrays, meta = read_entry(root / "k1", ["a"])
>>> arrays["a"]["x"], meta["n"]
(array([0, 1, 2]), 3)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "CACHE_DIR_ENV",
    "default_cache_dir",
    "file_sha256",
    "cache_key",
    "write_entry",
    "read_entry",
    "read_document",
]

CACHE_DIR_ENV = "PRIVREC_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$PRIVREC_CACHE_DIR`` if set, else ``~/.cache/privrec/lastfm``."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "privrec" / "lastfm"


def file_sha256(path: Path) -> str:
    """SHA-256 hex digest of a file's bytes."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cache_key(schema: int, params: Mapping[str, Any], inputs: Mapping[str, str]) -> str:
    """Hex key (24 chars) of a schema version, build parameters and input digests.

    Examples
    --------
    >>> cache_key(1, {"seed": 0}, {"a.dat": "00"}) == cache_key(1, {"seed": 0}, {"a.dat": "00"})
    True
    >>> cache_key(1, {"seed": 0}, {"a.dat": "00"}) == cache_key(1, {"seed": 1}, {"a.dat": "00"})
    False
    """
    blob = json.dumps({"schema": schema, "params": dict(params), "inputs": dict(inputs)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def write_entry(
    entry: Path,
    artifacts: Mapping[str, Mapping[str, NDArray[Any]]],
    meta: Mapping[str, Any],
    documents: Mapping[str, Any] | None = None,
) -> None:
    """Atomically write an entry.

    Parameters
    ----------
    entry
        The entry directory (must not exist yet; if it appears meanwhile,
        the other writer wins and this call discards its copy).
    artifacts
        ``name -> {array name -> array}``, written as ``<name>.npz``.
    meta
        The manifest, written as ``meta.json``.
    documents
        Extra JSON files, ``name -> value``, written as ``<name>.json``.
    """
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        for name, arrays in artifacts.items():
            with (tmp / f"{name}.npz").open("wb") as f:
                # numpy's stub types **kwds as `bool` (for its allow_pickle keyword); ours are arrays.
                np.savez(f, **arrays)  # type: ignore[arg-type]
        for name, value in (documents or {}).items():
            (tmp / f"{name}.json").write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")
        (tmp / "meta.json").write_text(json.dumps(dict(meta), indent=2, sort_keys=True) + "\n")
        if entry.exists():  # Another process built the same entry meanwhile: keep theirs.
            shutil.rmtree(tmp)
            return
        os.replace(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_entry(
    entry: Path, names: list[str]
) -> tuple[dict[str, dict[str, NDArray[Any]]], dict[str, Any]]:
    """Read the artifacts ``names`` and the manifest of a cache entry.

    JSON documents are read with :func:`read_document`.

    Raises
    ------
    FileNotFoundError
        If the entry or one of its files is missing.
    ValueError
        If a file is corrupt (the caller rebuilds).
    """
    meta = json.loads((entry / "meta.json").read_text())
    arrays: dict[str, dict[str, NDArray[Any]]] = {}
    for name in names:
        with np.load(entry / f"{name}.npz", allow_pickle=False) as z:
            arrays[name] = {k: z[k] for k in z.files}
    return arrays, meta


def read_document(entry: Path, name: str) -> Any:
    """Read ``<entry>/<name>.json``."""
    return json.loads((entry / f"{name}.json").read_text(encoding="utf-8"))
