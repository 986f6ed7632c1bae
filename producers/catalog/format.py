"""The catalog directory format: strict readers of ``items.csv``, ``users.csv``, ``edges.csv``, ``events.csv``.

A catalog directory holds CSV files with a header row, UTF-8 (a byte-order mark is accepted):

* ``items.csv`` (required): ``item`` (unique id string), ``name`` (optional display name), and at least one
  of ``features`` (``d`` floats separated by spaces) or ``tags`` (labels separated by ``|``, e.g.
  ``Action|Comedy|decade=1990s``). A row needs non-empty ``features`` or non-empty ``tags``.
* ``users.csv`` (optional): ``user``, optional ``unit`` (a label: users with the same label share a model),
  optional ``tags`` (read, not used by the models).
* ``edges.csv`` (optional): ``user,friend``: an undirected social graph.
* ``events.csv`` (optional, for replays): ``user,item,timestamp`` and optional ``reward`` (default 1, a logged
  positive). ``timestamp`` is a number (any unit, only the order matters) or an ISO 8601 date-time.

Anything wrong raises :class:`CatalogFormatError`, whose message names the file, the line (1 = the header)
and the column: a missing file or column, a duplicate id, a non-numeric or wrong-length ``features``, a row
with neither ``tags`` nor ``features``, bytes that are not UTF-8, a row with the wrong number of fields.

Examples
--------
>>> import tempfile
>>> root = Path(tempfile.mkdtemp())
>>> _ = (root / "items.csv").write_text("item,name,tags\\na,Alpha,x|y\\na,Again,z\\n")
>>> read_items(root)
Traceback (most recent call last):
...
producers.catalog.format.CatalogFormatError: items.csv, line 3, column item: duplicate item id 'a' (first on line 2)
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

__all__ = ["CatalogFormatError", "ItemRows", "UserRows", "EventRows", "FILES", "read_items", "read_users",
           "read_edges", "read_events", "parse_features", "split_tags"]

#: The files of a catalog directory (only ``items.csv`` is required).
FILES = ("items.csv", "users.csv", "edges.csv", "events.csv")


class CatalogFormatError(ValueError):
    """A catalog file is missing or malformed; the message names file, line and column.

    Attributes
    ----------
    file, line, column
        Where (``line`` 1 is the header; ``line``/``column`` ``None`` when the whole file is meant).
    """

    def __init__(self, file: str, line: int | None, column: str | None, message: str) -> None:
        where = file + ("" if line is None else f", line {line}") + ("" if column is None else f", column {column}")
        super().__init__(f"{where}: {message}")
        self.file, self.line, self.column = file, line, column


@dataclass(frozen=True)
class ItemRows:
    """``items.csv``: ids, names, tag lists and feature rows (``None`` where a row gives none), and line numbers."""

    ids: list[str]
    names: list[str]
    tags: list[list[str]]
    features: list[NDArray[np.float64] | None]
    lines: list[int]


@dataclass(frozen=True)
class UserRows:
    """``users.csv``: ids, unit labels (``None``: no ``unit`` column) and tag lists."""

    ids: list[str]
    units: list[str] | None
    tags: list[list[str]]


@dataclass(frozen=True)
class EventRows:
    """``events.csv`` in file order: users, items, sortable times, rewards, line numbers."""

    users: list[str]
    items: list[str]
    times: NDArray[np.float64]
    rewards: NDArray[np.float64]
    lines: list[int]


def split_tags(text: str) -> list[str]:
    """Labels of a ``tags`` cell: split on ``|``, stripped, empty ones dropped (order kept, repeats kept).

    >>> split_tags(" Action|Comedy||decade=1990s ")
    ['Action', 'Comedy', 'decade=1990s']
    """
    return [t.strip() for t in text.split("|") if t.strip()]


def parse_features(text: str, *, file: str = "items.csv", line: int | None = None,
                   d: int | None = None) -> NDArray[np.float64]:
    """The floats of a ``features`` cell (space separated), checked finite and of length ``d`` when given.

    >>> parse_features("0.5 -1.5  2").tolist()
    [0.5, -1.5, 2.0]
    >>> parse_features("0.5 x", line=4)
    Traceback (most recent call last):
    ...
    producers.catalog.format.CatalogFormatError: items.csv, line 4, column features: 'x' is not a number
    """
    out = []
    for tok in text.split():
        try:
            v = float(tok)
        except ValueError:
            raise CatalogFormatError(file, line, "features", f"{tok!r} is not a number") from None
        if not math.isfinite(v):
            raise CatalogFormatError(file, line, "features", f"{tok!r} is not a finite number")
        out.append(v)
    if d is not None and len(out) != d:
        raise CatalogFormatError(file, line, "features", f"has {len(out)} values, expected d = {d}")
    return np.asarray(out, dtype=np.float64)


def _rows(path: Path, required: tuple[str, ...], optional: tuple[str, ...] = ()
          ) -> tuple[dict[str, int], list[tuple[int, list[str]]]]:
    """Header positions and ``(line, fields)`` of every non-blank row; checks encoding, columns, field counts."""
    name = path.name
    if not path.is_file():
        raise CatalogFormatError(name, None, None, f"missing file (looked for {path})")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        line = data.count(b"\n", 0, exc.start) + 1
        raise CatalogFormatError(name, line, None, f"not UTF-8: byte 0x{data[exc.start]:02x} at character "
                                                   f"{exc.start - start + 1} of the line") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise CatalogFormatError(name, 1, None, f"empty file: expected a header row with {', '.join(required)}"
                                 ) from None
    except csv.Error as exc:
        raise CatalogFormatError(name, 1, None, f"not CSV: {exc}") from None
    cols = [h.strip() for h in header]
    pos: dict[str, int] = {}
    for i, c in enumerate(cols):
        if c in pos:
            raise CatalogFormatError(name, 1, c, "column named twice in the header")
        pos[c] = i
    for c in required:
        if c not in pos:
            raise CatalogFormatError(name, 1, c, f"missing column {c!r} (the header has {cols})")
    out: list[tuple[int, list[str]]] = []
    line = reader.line_num
    try:
        for fields in reader:
            here = line + 1
            line = reader.line_num
            if not fields or all(not f.strip() for f in fields) and len(fields) <= 1:
                continue
            if len(fields) != len(cols):
                raise CatalogFormatError(name, here, None, f"{len(fields)} fields, the header has {len(cols)}")
            out.append((here, fields))
    except csv.Error as exc:
        raise CatalogFormatError(name, reader.line_num, None, f"not CSV: {exc}") from None
    return pos, out


def read_items(root: Path, d: int | None = None) -> ItemRows:
    """Read and check ``items.csv`` of the directory ``root`` (or the items file ``root``; see the module
    docstring); ``d`` fixes the length of ``features``."""
    path = root if root.is_file() else root / "items.csv"
    name = path.name
    pos, rows = _rows(path, ("item",))
    if "features" not in pos and "tags" not in pos:
        raise CatalogFormatError(name, 1, None, "needs a 'features' or a 'tags' column (or both)")
    ids: list[str] = []
    names: list[str] = []
    tags: list[list[str]] = []
    feats: list[NDArray[np.float64] | None] = []
    lines: list[int] = []
    first: dict[str, int] = {}
    i_item, i_name, i_tags, i_feat = pos["item"], pos.get("name"), pos.get("tags"), pos.get("features")
    width = d
    for line, f in rows:
        item = f[i_item].strip()
        if not item:
            raise CatalogFormatError(name, line, "item", "empty item id")
        if item in first:
            raise CatalogFormatError(name, line, "item", f"duplicate item id {item!r} (first on line "
                                                                f"{first[item]})")
        first[item] = line
        t = split_tags(f[i_tags]) if i_tags is not None else []
        x = None
        if i_feat is not None and f[i_feat].strip():
            x = parse_features(f[i_feat], file=name, line=line, d=width)
            if width is None:
                if len(x) == 0:
                    raise CatalogFormatError(name, line, "features", "no values")
                width = len(x)
        if x is None and not t:
            raise CatalogFormatError(name, line, "tags" if i_tags is not None else "features",
                                     "empty 'tags' and 'features': an item needs one of them")
        ids.append(item)
        names.append(f[i_name].strip() if i_name is not None else "")
        tags.append(t)
        feats.append(x)
        lines.append(line)
    if not ids:
        raise CatalogFormatError(name, None, None, "no items")
    return ItemRows(ids, names, tags, feats, lines)


def read_users(root: Path) -> UserRows | None:
    """``users.csv`` if present (``None`` otherwise): unique non-empty ids; a ``unit`` on every row if the column is."""
    if not (root / "users.csv").exists():
        return None
    pos, rows = _rows(root / "users.csv", ("user",))
    ids: list[str] = []
    units: list[str] | None = [] if "unit" in pos else None
    tags: list[list[str]] = []
    first: dict[str, int] = {}
    for line, f in rows:
        user = f[pos["user"]].strip()
        if not user:
            raise CatalogFormatError("users.csv", line, "user", "empty user id")
        if user in first:
            raise CatalogFormatError("users.csv", line, "user", f"duplicate user id {user!r} (first on line "
                                                                f"{first[user]})")
        first[user] = line
        if units is not None:
            u = f[pos["unit"]].strip()
            if not u:
                raise CatalogFormatError("users.csv", line, "unit", "empty unit (give every user a unit, or drop "
                                                                    "the column)")
            units.append(u)
        ids.append(user)
        tags.append(split_tags(f[pos["tags"]]) if "tags" in pos else [])
    return UserRows(ids, units, tags)


def read_edges(root: Path) -> list[tuple[str, str]] | None:
    """``edges.csv`` if present (``None`` otherwise): ``(user, friend)`` pairs, both non-empty."""
    if not (root / "edges.csv").exists():
        return None
    pos, rows = _rows(root / "edges.csv", ("user", "friend"))
    out = []
    for line, f in rows:
        a, b = f[pos["user"]].strip(), f[pos["friend"]].strip()
        for col, v in (("user", a), ("friend", b)):
            if not v:
                raise CatalogFormatError("edges.csv", line, col, "empty user id")
        out.append((a, b))
    return out


def _time(text: str, line: int, file: str) -> float:
    t = text.strip()
    try:
        v = float(t)
    except ValueError:
        try:
            return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise CatalogFormatError(file, line, "timestamp", f"{t!r} is neither a number nor an ISO 8601 "
                                                                      f"date-time") from None
    if not math.isfinite(v):
        raise CatalogFormatError(file, line, "timestamp", f"{t!r} is not finite")
    return v


def read_events(path: Path) -> EventRows:
    """``events.csv`` (any path): non-empty user and item, a timestamp, a reward in ``[0, 1]`` (default 1)."""
    pos, rows = _rows(path, ("user", "item", "timestamp"))
    users: list[str] = []
    items: list[str] = []
    times: list[float] = []
    rewards: list[float] = []
    lines: list[int] = []
    for line, f in rows:
        user, item = f[pos["user"]].strip(), f[pos["item"]].strip()
        for col, v in (("user", user), ("item", item)):
            if not v:
                raise CatalogFormatError(path.name, line, col, f"empty {col} id")
        r = 1.0
        if "reward" in pos and f[pos["reward"]].strip():
            try:
                r = float(f[pos["reward"]])
            except ValueError:
                raise CatalogFormatError(path.name, line, "reward", f"{f[pos['reward']]!r} is not a number") from None
            if not 0.0 <= r <= 1.0:
                raise CatalogFormatError(path.name, line, "reward", f"{r!r} is outside [0, 1]")
        users.append(user)
        items.append(item)
        times.append(_time(f[pos["timestamp"]], line, path.name))
        rewards.append(r)
        lines.append(line)
    return EventRows(users, items, np.asarray(times, dtype=np.float64), np.asarray(rewards, dtype=np.float64), lines)
