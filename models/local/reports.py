"""The one record a device sends in local mode, and its strict parser.

A report carries a *noisy* vector only: ``b`` (``tree``: the device's noisy running sum) or ``m``
(``round``: one noisy ``r x``), and the shown list it answers (``rec_id``) — never which item of the
list the user acted on: that choice is protected like the reward (DESIGN §2), so it lives only inside
the noisy vector. Anything else — a ``reward`` or an ``item`` field above all — is refused, so a
client that tries to send a raw reward or its choice learns it at once.

The server adds the list's items (``shown``, public: it showed them) before the report goes on the
``ldp-reports`` topic; the Gram matrix takes every one of them.

Examples
--------
>>> rep = LocalReport(user="7", version=1, algorithm="round", rec_id="r1", vector=[0.5, -1.25])
>>> parse_report(rep.to_json(), d=2) == rep
True
>>> parse_report(b'{"schema": "privrec.LocalReport/2", "user": "7", "item": "a3"}', d=2)
Traceback (most recent call last):
...
models.local.reports.ReportError: item: local reports do not say which item the user acted on (that choice is protected); the noisy vector carries it
>>> parse_report(b'{"schema": "privrec.LocalReport/1", "user": "7", "reward": 1}', d=2)
Traceback (most recent call last):
...
models.local.reports.ReportError: reward: local reports carry no raw reward; send the noisy vector ('b' or 'm') built on the device
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["SCHEMA", "LocalReport", "ReportError", "parse_report", "MAX_ABS", "MAX_ID_CHARS"]

SCHEMA = "privrec.LocalReport/2"
#: Largest accepted magnitude of a report coordinate (noise at epsilon >= 0.01 stays far below it).
MAX_ABS = 1e6
_VECTOR = {"tree": "b", "round": "m"}
_FIELDS = {"schema", "user", "version", "algorithm", "rec_id", "shown", "b", "m", "epoch", "msgs"}
#: The most item messages a report may carry (a codebook's codewords, and the listen's own).
MAX_MESSAGES = 4097
#: The longest shown list a report may carry (``/recommend``'s largest ``k``).
MAX_SHOWN = 1000


class ReportError(ValueError):
    """A malformed report: ``parameter`` names the field, the message says what is wrong."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = message


@dataclass(frozen=True, eq=False)
class LocalReport:
    """One report: who, which of their reports, on which shown list, and the noisy vector.

    ``shown``: the list's items, added by the server (empty as the device sends it). ``epoch``: at user level,
    the device's epoch of the report (``floor(t / epoch_seconds)``, public like the time of any request; the
    server counts a device's reports per epoch against the cap); ``None`` at event level (the field is
    optional, so reports of devices made before user level still parse).
    """

    user: str
    version: int
    algorithm: str
    rec_id: str
    vector: NDArray[np.float64] = field(repr=False)
    shown: tuple[str, ...] = ()
    epoch: int | None = None
    #: ``codewords``: the blanket's messages (codeword indices, the listen's and the fakes, sorted)
    messages: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "vector", np.asarray(self.vector, dtype=np.float64))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LocalReport):
            return NotImplemented
        return (self.user, self.version, self.algorithm, self.rec_id, self.shown, self.epoch, self.messages) == (
            other.user, other.version, other.algorithm, other.rec_id, other.shown, other.epoch,
            other.messages) and bool(
            np.array_equal(self.vector, other.vector))

    def to_dict(self) -> dict[str, Any]:
        out = {"schema": SCHEMA, "user": self.user, "version": self.version, "algorithm": self.algorithm,
               "rec_id": self.rec_id, _VECTOR[self.algorithm]: [float(v) for v in self.vector]}
        if self.shown:
            out["shown"] = list(self.shown)
        if self.epoch is not None:
            out["epoch"] = self.epoch
        if self.messages:
            out["msgs"] = list(self.messages)
        return out

    def to_json(self) -> bytes:
        """The bytes a device sends (floats as ``repr``: exact round trip)."""
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()


#: The longest ``user`` or ``rec_id`` a report may carry: the stack's id limit
#: (``pipeline.data.records.MAX_ID_CHARS``; a test pins the two equal, models cannot import the pipeline).
MAX_ID_CHARS = 128


def _string(body: dict[str, Any], key: str, limit: int = MAX_ID_CHARS) -> str:
    v = body.get(key)
    if not isinstance(v, str) or not v or len(v) > limit:
        raise ReportError(key, f"must be a non-empty string of at most {limit} characters, got {v!r:.60}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in the JSON): no key, topic or reply can carry it
        raise ReportError(key, f"must be valid Unicode text (no lone surrogates), got {v!r:.60}") from None
    return v


def _version_and_epoch(body: dict[str, Any]) -> tuple[int, int | None]:
    """A report's (or an envelope's) ``version`` (the device's report counter, >= 1) and optional ``epoch``
    (>= 0); :class:`ReportError` naming the bad one."""
    version = body.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version < 2**53:
        raise ReportError("version", f"must be an integer >= 1 (the device's report counter), got {version!r:.60}")
    epoch = body.get("epoch")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch < 2**53):
        raise ReportError("epoch", f"must be an integer >= 0 (the device's epoch of the report), got {epoch!r:.60}")
    return version, epoch


def parse_report(raw: bytes | str | dict[str, Any], *, d: int, algorithm: str | None = None) -> LocalReport:
    """Parse and check one report; raise :class:`ReportError` naming the first bad field.

    ``algorithm``: the namespace's (a report of the other algorithm is refused).
    """
    if isinstance(raw, dict):
        body: Any = raw
    else:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nesting too deep
            raise ReportError("body", f"not JSON ({e})") from None
    if not isinstance(body, dict):
        raise ReportError("body", f"must be a JSON object, got {type(body).__name__}")
    if "reward" in body:
        raise ReportError("reward", "local reports carry no raw reward; send the noisy vector ('b' or 'm') built "
                                    "on the device")
    if "item" in body:
        raise ReportError("item", "local reports do not say which item the user acted on (that choice is "
                                  "protected); the noisy vector carries it")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise ReportError(unknown[0] or "(a field with an empty name)", f"unknown field (a report has {sorted(_FIELDS)})")
    if not isinstance(body.get("schema"), str) or body.get("schema") != SCHEMA:
        raise ReportError("schema", f"must be {SCHEMA!r}, got {body.get('schema')!r:.60}")
    user, rec_id = _string(body, "user"), _string(body, "rec_id")
    shown = body.get("shown", [])
    if not isinstance(shown, list) or len(shown) > MAX_SHOWN or not all(
            isinstance(a, str) and a and len(a) <= MAX_ID_CHARS for a in shown):
        raise ReportError("shown", f"must be a list of at most {MAX_SHOWN} item id strings (added by the server)")
    version, epoch = _version_and_epoch(body)
    alg = body.get("algorithm")
    if not isinstance(alg, str) or alg not in _VECTOR:
        raise ReportError("algorithm", f"must be one of {sorted(_VECTOR)}, got {alg!r:.60}")
    if algorithm is not None and alg != algorithm:
        raise ReportError("algorithm", f"this namespace runs local algorithm {algorithm!r}, got {alg!r}")
    key, other = _VECTOR[alg], _VECTOR["round" if alg == "tree" else "tree"]
    if other in body:
        raise ReportError(other, f"a {alg!r} report carries {key!r}, not {other!r}")
    vec = body.get(key)
    if not isinstance(vec, list) or len(vec) != d:
        raise ReportError(key, f"must be a list of {d} numbers, got "
                               f"{('a list of ' + str(len(vec))) if isinstance(vec, list) else type(vec).__name__}")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vec):
        raise ReportError(key, "must hold numbers only")
    try:
        arr = np.asarray(vec, dtype=np.float64)
    except OverflowError:  # a JSON integer too large for a float
        raise ReportError(key, f"holds a value beyond +-{MAX_ABS:g}") from None
    if not np.isfinite(arr).all():
        raise ReportError(key, "holds a value that is not finite (NaN or infinity)")
    if np.abs(arr).max(initial=0.0) > MAX_ABS:
        raise ReportError(key, f"holds a value beyond +-{MAX_ABS:g}")
    for a in shown:
        _string({"shown": a}, "shown")
    msgs = body.get("msgs", [])
    if not isinstance(msgs, list) or len(msgs) > MAX_MESSAGES or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_MESSAGES for v in msgs):
        raise ReportError("msgs", f"must be a list of at most {MAX_MESSAGES} codeword indices (integers >= 0)")
    return LocalReport(user=user, version=version, algorithm=alg, rec_id=rec_id, vector=arr, shown=tuple(shown),
                       epoch=epoch, messages=tuple(msgs))
