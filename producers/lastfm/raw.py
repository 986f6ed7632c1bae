"""Reading the raw HetRec 2011 LastFM files.

The files are tab-separated with one header line and (in the GroupLens copy)
CRLF line endings. ``tags.dat`` is ISO-8859-1 (latin-1) while ``artists.dat``
is UTF-8, so every text line is decoded as UTF-8 first and as latin-1 when that
fails; the numeric files are parsed as integers straight from their bytes.

The files are under non-commercial terms: they are read from a data directory
(``data_dir`` argument, else env ``PRIVREC_DATA_DIR``, else
``../shared/data/lastfm-2k`` next to the repository) and never copied.

Examples
--------
>>> decode_line(b"caf\\xc3\\xa9"), decode_line(b"die \\xc4rzte")
('café', 'die Ärzte')
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "DATA_DIR_ENV",
    "DOWNLOAD_URL",
    "REQUIRED_FILES",
    "DatasetNotFoundError",
    "DataFormatError",
    "RawLastFM",
    "decode_line",
    "default_data_dir",
    "resolve_data_dir",
    "data_dir_or_reason",
    "read_raw",
]

DATA_DIR_ENV = "PRIVREC_DATA_DIR"
DOWNLOAD_URL = "https://grouplens.org/datasets/hetrec-2011/"

#: file name -> expected header columns.
REQUIRED_FILES: dict[str, tuple[str, ...]] = {
    "user_artists.dat": ("userID", "artistID", "weight"),
    "user_taggedartists.dat": ("userID", "artistID", "tagID", "day", "month", "year"),
    "tags.dat": ("tagID", "tagValue"),
    "user_friends.dat": ("userID", "friendID"),
    "artists.dat": ("id", "name", "url", "pictureURL"),
}

IntArray = NDArray[np.int64]


class DatasetNotFoundError(FileNotFoundError):
    """The LastFM data directory or some of its files are missing.

    Parameters
    ----------
    data_dir
        The directory that was searched.
    missing
        Names of the required files not found there (all of them when the
        directory itself is missing).
    """

    def __init__(self, data_dir: Path, missing: list[str]) -> None:
        self.data_dir = data_dir
        self.missing = missing
        where = "does not exist" if not data_dir.is_dir() else "is missing " + ", ".join(missing)
        super().__init__(
            f"LastFM data directory {str(data_dir)!r} {where}. "
            f"Required files: {', '.join(REQUIRED_FILES)}. Download hetrec2011-lastfm-2k.zip "
            f"from {DOWNLOAD_URL} (non-commercial terms), unzip it, and point "
            f"`data_dir` or ${DATA_DIR_ENV} at the folder."
        )


class DataFormatError(ValueError):
    """A LastFM file does not have the expected layout.

    Parameters
    ----------
    path
        The offending file.
    line
        1-based line number (0 when the problem is not one line).
    problem
        What is wrong, with the value found.
    """

    def __init__(self, path: Path, line: int, problem: str) -> None:
        self.path = path
        self.line = line
        self.problem = problem
        at = f" line {line}" if line else ""
        super().__init__(f"{path}{at}: {problem}")


@dataclass(frozen=True, slots=True)
class RawLastFM:
    """The five HetRec LastFM files as integer arrays (original ids).

    Attributes
    ----------
    data_dir
        Where the files were read from.
    listened
        ``(n, 3)`` rows of ``user_artists.dat``: user, artist, play count.
    tagged
        ``(n, 6)`` rows of ``user_taggedartists.dat``: user, artist, tag,
        day, month, year.
    tags
        ``tagID -> tagValue``.
    friends
        ``(n, 2)`` rows of ``user_friends.dat`` (directed pairs).
    artist_names
        ``artistID -> name`` from ``artists.dat``.
    """

    data_dir: Path
    listened: IntArray
    tagged: IntArray
    tags: dict[int, str]
    friends: IntArray
    artist_names: dict[int, str]


def default_data_dir() -> Path:
    """``$PRIVREC_DATA_DIR`` if set, else ``../shared/data/lastfm-2k`` beside the repo root.

    The repo root is the folder that holds the ``producers`` package.
    """
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    repo_root = Path(__file__).resolve().parents[2]
    return (repo_root / ".." / "shared" / "data" / "lastfm-2k").resolve()


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the data directory, raising :class:`DatasetNotFoundError` if incomplete.

    Parameters
    ----------
    data_dir
        Explicit directory; ``None`` means :func:`default_data_dir`.
    """
    path = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    if not path.is_dir():
        raise DatasetNotFoundError(path, list(REQUIRED_FILES))
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        raise DatasetNotFoundError(path, missing)
    return path



def data_dir_or_reason(data_dir: str | os.PathLike[str] | None = None) -> tuple[Path | None, str]:
    """``(directory, "")`` when the data is there, else ``(None, why)``: for callers that skip rather than fail."""
    try:
        return resolve_data_dir(data_dir), ""
    except DatasetNotFoundError as exc:
        return None, str(exc)

def decode_line(raw: bytes) -> str:
    """Decode one line as UTF-8, falling back to latin-1 (which never fails)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    lines = data.replace(b"\r\n", b"\n").split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise DataFormatError(path, 0, "file is empty; expected a header line")
    return lines


def _check_header(path: Path, header: bytes) -> None:
    expected = REQUIRED_FILES[path.name]
    found = tuple(decode_line(header).strip().split("\t"))
    if found != expected:
        raise DataFormatError(path, 1, f"expected header {expected}, got {found}")


def _read_ints(path: Path) -> IntArray:
    """Parse an all-integer tab-separated file (after its header)."""
    lines = _lines(path)
    _check_header(path, lines[0])
    ncol = len(REQUIRED_FILES[path.name])
    body = [ln for ln in lines[1:] if ln.strip()]
    try:
        flat = np.array(b"\t".join(body).split(), dtype=np.int64)
    except ValueError:
        flat = np.empty(0, dtype=np.int64)
        ok = False
    else:
        ok = flat.size == ncol * len(body)
    if not ok:
        # Slow path only to name the first bad line.
        for i, ln in enumerate(lines[1:], start=2):
            if not ln.strip():
                continue
            fields = ln.split()
            if len(fields) != ncol or not all(f.lstrip(b"-").isdigit() for f in fields):
                raise DataFormatError(
                    path, i, f"expected {ncol} integer columns, got {decode_line(ln)!r}"
                )
        raise DataFormatError(path, 0, "could not parse integer columns")  # pragma: no cover
    return flat.reshape(len(body), ncol)


def _read_text(path: Path, ncol: int) -> dict[int, str]:
    """Parse ``id \\t text [\\t ...]`` lines into ``id -> text``."""
    lines = _lines(path)
    _check_header(path, lines[0])
    out: dict[int, str] = {}
    for i, ln in enumerate(lines[1:], start=2):
        if not ln.strip():
            continue
        fields = decode_line(ln).split("\t")
        if len(fields) < 2 or len(fields) > ncol or not fields[0].strip().isdigit():
            raise DataFormatError(
                path, i, f"expected `id<TAB>text` with at most {ncol} columns, got {fields!r}"
            )
        out[int(fields[0])] = fields[1].strip()
    return out


def read_raw(data_dir: str | os.PathLike[str] | None = None) -> RawLastFM:
    """Read the five required files.

    Parameters
    ----------
    data_dir
        Directory holding the HetRec files; ``None`` means :func:`default_data_dir`.

    Returns
    -------
    RawLastFM
        The parsed files.

    Raises
    ------
    DatasetNotFoundError
        If the directory or a required file is missing.
    DataFormatError
        If a file has an unexpected header or a malformed line.
    """
    path = resolve_data_dir(data_dir)
    return RawLastFM(
        data_dir=path,
        listened=_read_ints(path / "user_artists.dat"),
        tagged=_read_ints(path / "user_taggedartists.dat"),
        tags=_read_text(path / "tags.dat", ncol=2),
        friends=_read_ints(path / "user_friends.dat"),
        artist_names=_read_text(path / "artists.dat", ncol=4),
    )
