"""Record types of the public topics, and the strict parser of ``interactions`` events.

``interactions`` (key = user id) carries JSON objects (DESIGN §7)::

    {"event_id": str, "user": str, "arm": str, "context": [float, ...] | null,
     "reward": float, "ts": float (ms since epoch), "rec_id": str | null}

:func:`parse_interaction` turns the raw bytes into a :class:`Parsed` ``(unit, context, reward, user)``
or raises :class:`MalformedEvent` with the reason that goes to
``dead-letters``. Rules: a JSON object; ``event_id``, ``user``, ``arm`` are
non-empty strings, and ``user``, ``arm`` and ``rec_id`` (when given) at most :data:`MAX_ID_CHARS` characters
(what one event can make the stack keep per id); ``reward`` is a finite number in ``[0, 1]`` (the privacy
sensitivities assume it); ``user`` is known to the catalog; ``context``, when
given, has exactly ``d`` finite numbers and is scaled down to norm ``<= 1``
(the context bound ``Lx = 1`` of the sensitivities); when omitted, ``arm``
must be a catalog arm and its features are used.

Examples
--------
>>> from pipeline.data.catalog import SyntheticCatalog
>>> cat = SyntheticCatalog(n_users=2, d=2, n_arms=3)
>>> unit, x, r, user = parse_interaction(b'{"event_id": "e1", "user": "1", "arm": "2", "reward": 1}', cat)
>>> unit, r, x.shape
(1, 1.0, (2,))
>>> parse_interaction(b'{"event_id": "e2", "user": "1", "arm": "2", "reward": 1.5}', cat)
Traceback (most recent call last):
...
pipeline.data.records.MalformedEvent: reward 1.5 is outside [0, 1]
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any, NamedTuple

import faust
import numpy as np
from numpy.typing import NDArray

from .catalog import Catalog, UnknownArmError, UnknownUserError
from ..config.keys import partition_of

__all__ = ["Interaction", "Recommendation", "DeadLetter", "MalformedEvent", "Parsed", "ParsedBatch",
           "parse_interaction", "parse_batch", "partition_of", "MAX_SHOWN", "MAX_ID_CHARS",
           "dead_letter_value", "TOPICS"]

#: Topic names (DESIGN §7).
TOPICS = {"interactions": "interactions", "recommendations": "recommendations", "dead_letters": "dead-letters",
          "ldp_reports": "ldp-reports", "ldp_shuffled": "ldp-shuffled", "federated_updates": "federated-updates"}


#: The longest user id, item id or rec_id the stack takes (characters): the HTTP API answers 400 past it and
#: ingest sends such an event to ``dead-letters``, so that no request or producer can make the stack keep
#: per-user records under unbounded keys. The catalogs' ids are far shorter (LastFM's are at most 5 digits, a
#: ``/session`` user is 28 characters, a rec_id 32 hex digits).
MAX_ID_CHARS = 128


class Interaction(faust.Record, serializer="json"):
    """One logged interaction (value of the ``interactions`` topic)."""

    event_id: str
    user: str
    arm: str
    reward: float
    context: list[float] | None = None
    ts: float | None = None
    rec_id: str | None = None


class Recommendation(faust.Record, serializer="json"):
    """One shown list (value of the ``recommendations`` topic)."""

    rec_id: str
    user: str
    items: list[str]
    model_version: int
    ts: float


class DeadLetter(faust.Record, serializer="json"):
    """A rejected message: the original bytes (text, or base64) and why."""

    original: str
    original_encoding: str
    reason: str
    topic: str
    partition: int
    offset: int


class MalformedEvent(ValueError):
    """An event that cannot be counted; the message is the dead-letter reason."""


_REQUIRED = ("event_id", "user", "arm", "reward")
_REQUIRED_SET = frozenset(_REQUIRED)


class Parsed(NamedTuple):
    """A valid interaction: its model unit, context (norm <= 1), reward in [0, 1], and user id."""

    unit: int
    context: NDArray[np.float64]
    reward: float
    user: str


def parse_interaction(raw: bytes, catalog: Catalog) -> Parsed:
    """Validate one ``interactions`` value (see the module docstring for the rules).

    The single-event form of :func:`parse_batch` (one implementation of the rules).
    """
    batch = parse_batch([raw], catalog)
    if batch.dead:
        raise MalformedEvent(batch.dead[0][1])
    return Parsed(int(batch.units[0]), batch.contexts[0], float(batch.rewards[0]), batch.users[0])


_TOO_LARGE_CONTEXT = "context has NaN or infinite values (an integer too large for a float)"


def _as_float(value: int | float, reason: str) -> float:
    """``float(value)``; an integer too large for a float is malformed, not a crash."""
    try:
        return float(value)
    except OverflowError:
        raise MalformedEvent(f"{reason} (an integer of {int(value).bit_length()} bits)") from None


def _too_long(obj: dict[str, Any]) -> str:
    """The dead-letter reason of an event whose ``user``, ``arm`` or ``rec_id`` exceeds :data:`MAX_ID_CHARS`."""
    k = next(k for k in ("user", "arm", "rec_id") if isinstance(obj.get(k), str) and len(obj[k]) > MAX_ID_CHARS)
    return f"field {k!r} has {len(obj[k])} characters, at most {MAX_ID_CHARS} (MAX_ID_CHARS)"


#: A JSON integer ``ts`` of smaller magnitude is a finite float (the common case, checked inline by :func:`_check_event`).
_TS_EXACT = 1 << 1000


def _check_ts(ts: Any) -> None:
    if ts is None:
        return
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(
            _as_float(ts, "ts must be a finite number of ms or null")):
        raise MalformedEvent(f"ts must be a finite number of ms or null, got {ts!r}")


try:  # orjson is ~2.3x faster on these events; stdlib json decides whenever orjson refuses
    import orjson as _orjson

    def _loads(raw: bytes) -> Any:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:  # NaN/Infinity literals, >64-bit ints, bad UTF-8: stdlib's verdict
            return json.loads(raw)
except ImportError:  # pragma: no cover
    _loads = json.loads

_NUM = frozenset((int, float))


class ParsedBatch(NamedTuple):
    units: NDArray[np.int64]
    contexts: NDArray[np.float64]
    rewards: NDArray[np.float64]
    users: list[str]
    dead: list[tuple[int, str]]
    #: catalog row of each event's arm (-1: an arm outside the catalog, with an explicit context)
    items: NDArray[np.int64] = np.zeros(0, dtype=np.int64)
    #: whether each event is an organic listen (``"kind": "listen"``) rather than feedback on a recommendation
    listens: NDArray[np.bool_] = np.zeros(0, dtype=bool)
    #: the contexts that enter the public Gram matrix (one row per *shown* item: every item of the list the
    #: feedback answers, or the event's own arm when no list is named; none for a listen) ...
    gram_contexts: NDArray[np.float64] = np.zeros((0, 0))
    #: ... and the index (into the accepted events) of the event each row belongs to, ascending
    gram_events: NDArray[np.int64] = np.zeros(0, dtype=np.int64)
    #: ``(index in the batch, decoded event)`` of each accepted event, in order (the shown-list check reads them)
    decoded: list[tuple[int, dict[str, Any]]] = []


#: Values of the optional ``kind`` field: feedback on a shown item (default) or an organic listen.
KINDS = ("feedback", "listen")


def _shown_rows(obj: dict[str, Any], arm: str, catalog: Catalog) -> list[int] | None:
    """Catalog rows of the list a feedback answers (``"shown"``), or ``None`` when the event names no list."""
    shown = obj.get("shown")
    if shown is None:
        return None
    if type(shown) is not list or not shown or not all(type(a) is str and a for a in shown):
        raise MalformedEvent("shown must be a non-empty list of item id strings (the list the feedback answers) "
                             "or absent")
    if len(shown) > MAX_SHOWN:
        raise MalformedEvent(f"shown has {len(shown)} items, at most {MAX_SHOWN}")
    if arm not in shown:
        raise MalformedEvent(f"arm {arm!r} is not in the shown list")
    try:
        return [catalog.arm_row(a) for a in shown]
    except UnknownArmError as exc:
        raise MalformedEvent(f"shown: {exc}") from None


#: The longest shown list an event may name (``/recommend``'s largest ``k``).
MAX_SHOWN = 1000


def _check_event(obj: Any, catalog: Catalog, d: int, homes: dict[str, tuple[int, int]], partition: int | None,
                 partitions: int | None) -> tuple[int, float, int, str, Any, list[int] | None]:
    """One decoded event's checks (:func:`parse_batch`'s loop): its unit, reward, item row (-1: not in the catalog),
    kind, explicit context (``None``: the item's features, which :func:`parse_batch` gathers for the whole batch) and
    shown rows, or :class:`MalformedEvent` with the reason. ``d`` is the catalog's dimension (read once per batch);
    ``homes`` caches each user's (unit, home partition) for the batch."""
    if type(obj) is not dict:
        raise MalformedEvent(f"not a JSON object but {type(obj).__name__}")
    if not _REQUIRED_SET <= obj.keys():
        missing = [k for k in _REQUIRED if k not in obj]
        raise MalformedEvent(f"missing field(s): {', '.join(missing)}")
    if not (type(obj["event_id"]) is str and obj["event_id"] and type(obj["user"]) is str and obj["user"]
            and type(obj["arm"]) is str and obj["arm"]):  # the common case in one test; str subclasses
        for k in ("event_id", "user", "arm"):  # cannot come from JSON
            if not isinstance(obj[k], str) or not obj[k]:
                raise MalformedEvent(f"field {k!r} must be a non-empty string, got {obj[k]!r}")
    if len(obj["user"]) > MAX_ID_CHARS or len(obj["arm"]) > MAX_ID_CHARS or (
            type(obj.get("rec_id")) is str and len(obj["rec_id"]) > MAX_ID_CHARS):
        raise MalformedEvent(_too_long(obj))
    reward = obj["reward"]
    if type(reward) is float and 0.0 <= reward <= 1.0:  # the common case (NaN fails the comparison)
        r = reward
    else:
        if type(reward) not in _NUM:
            raise MalformedEvent(f"reward must be a number, got {reward!r}")
        r = _as_float(reward, "reward is outside [0, 1]")
        if not math.isfinite(r):
            raise MalformedEvent(f"reward {reward!r} is not finite")
        if not 0.0 <= r <= 1.0:
            raise MalformedEvent(f"reward {r!r} is outside [0, 1]")
    hit = homes.get(obj["user"])
    if hit is None:  # a user's events come together: hash each user once per batch
        try:
            unit = catalog.unit_of(obj["user"])
        except UnknownUserError as exc:
            raise MalformedEvent(str(exc)) from None
        home = partition_of(obj["user"], partitions) if partition is not None and partitions is not None else -1
        hit = homes[obj["user"]] = (unit, home)
    unit, home = hit
    if partition is not None and partitions is not None:
        if home != partition:
            raise MalformedEvent(f"partition mismatch: user {obj['user']!r} belongs to partition {home} "
                                 f"(the message key must be the user id), the event arrived on {partition}")
    kind = obj.get("kind", "feedback")
    if kind not in KINDS:
        raise MalformedEvent(f"kind must be one of {KINDS} (or absent), got {kind!r}")
    if kind == "listen" and obj.get("shown") is not None:
        raise MalformedEvent("a listen answers no shown list: shown must be absent")
    shown = None if obj.get("shown") is None else _shown_rows(obj, obj["arm"], catalog)
    try:
        item = catalog.arm_row(obj["arm"])
    except UnknownArmError:
        item = -1
    ctx = obj.get("context")
    if kind == "listen" and item < 0:
        raise MalformedEvent(f"a listen must name a catalog arm, got {obj['arm']!r}")
    if ctx is None:
        if item < 0:
            raise MalformedEvent(f"unknown arm {obj['arm']!r} in catalog {catalog.name!r} (and no context given)")
    else:
        types = set(map(type, ctx)) if type(ctx) is list else None
        if types is None or not types <= _NUM:
            raise MalformedEvent("context must be a list of numbers or null")
        if len(ctx) != d:
            raise MalformedEvent(f"context has {len(ctx)} values, expected d = {d}")
        if int in types:  # JSON integers may exceed a float; checked per event, not per batch
            try:
                [float(v) for v in ctx]
            except OverflowError:
                raise MalformedEvent(_TOO_LARGE_CONTEXT) from None
    ts = obj.get("ts")
    if not (ts is None or (type(ts) is int and -_TS_EXACT < ts < _TS_EXACT)):  # else the full check
        _check_ts(ts)
    return unit, r, item, kind, ctx, shown


def parse_batch(raws: list[bytes], catalog: Catalog, *, partition: int | None = None,
                partitions: int | None = None) -> ParsedBatch:
    """``parse_interaction`` over a batch: same accepted events, bytes and reasons; one numpy pass.

    With ``partition`` and ``partitions``, an event whose user belongs to another partition
    (:func:`partition_of`) is refused: a producer that keys events by something other than the user would
    otherwise spread one user's contributions, and their cap, over several partitions.
    """
    d = catalog.d
    units: list[int] = []
    contexts: list[Any] = []
    rewards: list[float] = []
    users: list[str] = []
    items: list[int] = []
    listens: list[bool] = []
    explicit: list[bool] = []
    shown_rows: list[list[int] | None] = []
    keep: list[int] = []
    decoded: list[tuple[int, dict[str, Any]]] = []
    dead: list[tuple[int, str]] = []
    fm = catalog.feature_matrix
    homes: dict[str, tuple[int, int]] = {}  # user -> (unit, home partition or -1): both pure functions of the id
    for i, raw in enumerate(raws):
        try:
            obj: Any = _loads(raw)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nesting too deep
            dead.append((i, f"not JSON: {exc}"))
            continue
        try:
            unit, r, item, kind, ctx, shown = _check_event(obj, catalog, d, homes, partition, partitions)
        except MalformedEvent as exc:
            dead.append((i, str(exc)))
            continue
        units.append(unit)
        contexts.append(ctx)
        rewards.append(r)
        users.append(obj["user"])
        items.append(item)
        listens.append(kind == "listen")
        explicit.append(ctx is not None)
        shown_rows.append(shown)
        keep.append(i)
        decoded.append((i, obj))
    X = _contexts(contexts, items, fm, d)
    if contexts:
        ok = _clip_contexts(X, np.asarray(explicit), keep, dead)
        if ok is not None:
            X = X[ok]
            units = [u for u, o in zip(units, ok) if o]
            rewards = [w for w, o in zip(rewards, ok) if o]
            users = [u for u, o in zip(users, ok) if o]
            items = [a for a, o in zip(items, ok) if o]
            listens = [a for a, o in zip(listens, ok) if o]
            shown_rows = [a for a, o in zip(shown_rows, ok) if o]
            decoded = [a for a, o in zip(decoded, ok) if o]
    gram_X, gram_events = _gram_rows(X, listens, shown_rows, fm, d)
    return ParsedBatch(np.asarray(units, dtype=np.int64), X, np.asarray(rewards, dtype=np.float64), users, dead,
                       np.asarray(items, dtype=np.int64), np.asarray(listens, dtype=bool), gram_X, gram_events,
                       decoded)


def _contexts(explicit: list[Any], items: list[int], fm: Any, d: int) -> NDArray[np.float64]:
    """The events' contexts as rows of a new array: the catalog's features of each event's item, gathered at once,
    and the explicit ones (``explicit[j]`` not ``None``) over them."""
    idx = np.asarray(items, dtype=np.intp)
    X = np.zeros((len(items), d))
    known = idx >= 0  # an arm outside the catalog has an explicit context
    X[known] = fm[idx[known]]
    for j, ctx in enumerate(explicit):
        if ctx is not None:
            X[j] = ctx
    return X


def _clip_contexts(X: NDArray[np.float64], exp: NDArray[np.bool_], keep: list[int], dead: list[tuple[int, str]]
                   ) -> NDArray[np.bool_] | None:
    """Clip the explicit contexts of ``X`` to norm 1 in place (the per-event formula, bit-identical); those with NaN or
    infinite values become dead letters (``keep``: each row's index in the batch; ``dead`` stays sorted). The rows
    to keep, or ``None`` when all are kept."""
    bad = exp & ~np.isfinite(X).all(axis=1)
    with np.errstate(over="ignore"):  # huge finite contexts: inf, which selects them
        near = np.flatnonzero(exp & ~bad & (np.einsum("ij,ij->i", X, X) > 1.0 - 1e-9))
    for j in near:
        x = X[j]
        with np.errstate(over="ignore"):  # an overflow is handled right below
            norm = float(np.sqrt(x @ x))
        if norm == math.inf:  # huge finite values: x @ x overflows (x / inf would be 0); scale first
            x = x / np.max(np.abs(x))
            X[j] = x / float(np.sqrt(x @ x))
        elif norm > 1.0:
            X[j] = x / norm
    if not bad.any():
        return None
    for j in np.flatnonzero(bad):
        dead.append((keep[j], "context has NaN or infinite values"))
    dead.sort()
    return ~bad


def _gram_rows(X: NDArray[np.float64], listens: list[bool], shown: list[list[int] | None], fm: Any,
               d: int) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """The public Gram's rows of a batch: every shown item of an answered list; the arm itself when the event names
    no list (a producer's one-item list); nothing for a listen (the user's own choice, DESIGN §2)."""
    if not any(listens) and not any(s is not None for s in shown):
        return X, np.arange(X.shape[0], dtype=np.int64)  # the common case: each event's own context
    rows: list[NDArray[np.float64]] = []
    owners: list[int] = []
    for j, (listen, rows_j) in enumerate(zip(listens, shown)):
        if listen:
            continue
        if rows_j is None:
            rows.append(X[j:j + 1])
            owners.append(j)
        else:
            rows.append(np.asarray(fm[rows_j], dtype=np.float64).reshape(len(rows_j), d))
            owners += [j] * len(rows_j)
    if not rows:
        return np.zeros((0, d)), np.zeros(0, dtype=np.int64)
    return np.concatenate(rows), np.asarray(owners, dtype=np.int64)


def dead_letter_value(raw: bytes, reason: str, topic: str, partition: int, offset: int) -> bytes:
    """The ``dead-letters`` value: the original bytes plus why and where (DESIGN §7)."""
    try:
        original, encoding = raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        original, encoding = base64.b64encode(raw).decode("ascii"), "base64"
    return json.dumps({"original": original, "original_encoding": encoding, "reason": reason, "topic": topic,
                       "partition": partition, "offset": offset}).encode()
