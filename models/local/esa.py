"""Encode, shuffle, analyze: what a device sends the shuffler, and what the shuffler sends the analyzer.

Prochlo's split (Bittau et al. 2017) for local mode with shuffling. Three records:

* the **content** (:data:`CONTENT_SCHEMA`, sealed by the device to the analyzer's key, :mod:`.seal`):
  only the noisy vector ``m`` — no user, version, request or shown list. Anything that reached the analyzer
  next to a content and that the operator's web server can map to a user (a ``rec_id``, the list of items
  it showed in one answer) would re-identify it, so none of it is inside; :func:`parse_content` refuses a
  content that carries such a field.
* the **envelope** (:data:`ENVELOPE_SCHEMA`, device → shuffler): who sends (``user``), their report counter
  (``version``, the cap check), the list answered (``rec_id``: the shuffler checks it was shown to this user
  and takes its items from the web's shown lists, which are public) and the sealed content. The shuffler
  sees identities and this metadata, never the content.
* the **sealed batch** (:data:`SEALED_BATCH_SCHEMA`, shuffler → analyzer): a batch label (the model unit), a
  sequence number, the multiset of the shown items of every report (public; for the Gram), and the sealed
  contents — both lists shuffled, independently, with the operating system's randomness. No identity.

:class:`SealedShuffler` batches envelopes with the batching policy of :class:`.shuffle.Shuffler` (one
report per distinct user per batch) and closes a batch into a :class:`SealedBatch`.

Examples
--------
>>> from models.local.seal import AnalyzerKey
>>> from models.local.reports import LocalReport
>>> key = AnalyzerKey.generate()
>>> env = seal_report(LocalReport("7", 1, "round", "r1", [0.5, -1.0]), key.public_bytes())
>>> sorted(env.to_dict())
['rec_id', 'schema', 'sealed', 'user', 'version']
>>> parse_content(key.open(env.sealed), d=2, algorithm="round").tolist()
[0.5, -1.0]
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .config import LocalConfig
from .reports import (MAX_ABS, MAX_SHOWN, LocalReport, ReportError, _string,  # the reports' field rules
                      _version_and_epoch)
from .seal import AnalyzerKey, SealError, b64decode, b64encode, check_sealed, seal
from .shuffle import ShuffledBatch, Shuffler, _Open

__all__ = ["is_sealed_batch", "OpenedBatch", "open_batch", "MESSAGE_SCHEMA", "message_content", "parse_message", "CONTENT_SCHEMA", "ENVELOPE_SCHEMA", "SEALED_BATCH_SCHEMA", "MAX_SEALED_BYTES", "Envelope", "SealedBatch",
           "SealedShuffler", "report_content", "seal_report", "parse_envelope", "parse_content"]

CONTENT_SCHEMA = "privrec.ReportContent/1"
ENVELOPE_SCHEMA = "privrec.Envelope/1"
SEALED_BATCH_SCHEMA = "privrec.SealedBatch/1"
#: Largest sealed content accepted (a d = 25 vector of JSON floats is about 700 bytes).
MAX_SEALED_BYTES = 1 << 14
_ENVELOPE_FIELDS = {"schema", "user", "version", "rec_id", "sealed", "epoch", "msgs"}
#: A listen's codeword message, sealed on its own (``{"schema", "c"}``): the shuffler mixes messages one by one.
MESSAGE_SCHEMA = "privrec.ItemMessage/1"
#: The most sealed messages an envelope may carry (a codebook of 4096 and the listen's own).
MAX_MESSAGES = 4097
_CONTENT_FIELDS = {"schema", "algorithm", "m"}
#: Fields that would tie a content to a person or a request: refused inside a content.
_LINKING = ("user", "version", "rec_id", "shown", "item", "reward")
_RNG = random.SystemRandom()


def report_content(report: LocalReport) -> bytes:
    """The plaintext a device seals: the algorithm and the noisy vector, nothing that names the user or the list."""
    return json.dumps({"schema": CONTENT_SCHEMA, "algorithm": report.algorithm,
                       "m": [float(v) for v in report.vector]}, separators=(",", ":")).encode()


def message_content(code: int) -> bytes:
    """The plaintext of one item message (a codeword index): nothing else, so messages cannot be linked."""
    return json.dumps({"schema": MESSAGE_SCHEMA, "c": int(code)}, separators=(",", ":")).encode()


def parse_message(raw: bytes, *, codewords: int) -> int:
    """The codeword index of an opened message (``codewords``: the dummy); :class:`ReportError` naming the field."""
    body = _json_object(raw, "message")
    if set(body) != {"schema", "c"} or body.get("schema") != MESSAGE_SCHEMA:
        raise ReportError("message", f"must be exactly {{'schema': {MESSAGE_SCHEMA!r}, 'c': <codeword>}}")
    c = body["c"]
    if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c <= codewords:
        raise ReportError("c", f"must be a codeword index in [0, {codewords}], got {c!r:.40}")
    return c


@dataclass(frozen=True)
class Envelope:
    """Device → shuffler: identity and metadata in the clear, the content sealed to the analyzer.

    ``shown``: the answered list's items, added by the shuffler from the web's shown lists (never sent).
    ``epoch``: at user level, the device's epoch of the report (in the clear, as the version: the shuffler checks
    the cap per epoch from them, :func:`pipeline.modes.local.localmode.check_user_level`).
    """

    user: str
    version: int
    rec_id: str
    sealed: bytes
    shown: tuple[str, ...] = ()
    epoch: int | None = None
    #: codewords: the report's messages, each sealed on its own (``privrec.ItemMessage/1``)
    msgs: tuple[bytes, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": ENVELOPE_SCHEMA, "user": self.user, "version": self.version,
                               "rec_id": self.rec_id, "sealed": b64encode(self.sealed)}
        if self.msgs:
            out["msgs"] = [b64encode(m) for m in self.msgs]
        if self.epoch is not None:
            out["epoch"] = self.epoch
        if self.shown:
            out["shown"] = list(self.shown)
        return out

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    def with_shown(self, shown: tuple[str, ...]) -> Envelope:
        return replace(self, shown=shown)


def seal_report(report: LocalReport, public_key: bytes) -> Envelope:
    """The envelope of ``report``: its content sealed to ``public_key``, its identity and metadata in the clear."""
    return Envelope(report.user, report.version, report.rec_id, seal(public_key, report_content(report)),
                    epoch=report.epoch, msgs=tuple(seal(public_key, message_content(m)) for m in report.messages))


def _json_object(raw: bytes | str, parameter: str) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nesting too deep
        raise ReportError(parameter, f"not JSON ({e})") from None
    if not isinstance(body, dict):
        raise ReportError(parameter, f"must be a JSON object, got {type(body).__name__}")
    return body


def parse_envelope(raw: bytes | str | dict[str, Any], *, stored: bool = False) -> Envelope:
    """Parse a device's envelope; :class:`~models.local.reports.ReportError` naming the first bad field.

    ``stored``: the shuffler's own saved copy, which may carry ``shown``. The sealed bytes are checked as far
    as possible without the key (length, the ephemeral point on the curve).
    """
    body = raw if isinstance(raw, dict) else _json_object(raw, "body")
    for key in ("reward", "item", "m", "b"):
        if key in body:
            raise ReportError(key, "an envelope carries its report sealed to the analyzer ('sealed'); nothing of the "
                                   "report's contents may travel in the clear")
    allowed = _ENVELOPE_FIELDS | ({"shown"} if stored else set())
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ReportError(unknown[0] or "(empty)", f"unknown field (an envelope has {sorted(_ENVELOPE_FIELDS)})")
    if body.get("schema") != ENVELOPE_SCHEMA:
        raise ReportError("schema", f"must be {ENVELOPE_SCHEMA!r}, got {body.get('schema')!r:.60}")
    user, rec_id = _string(body, "user"), _string(body, "rec_id")
    version, epoch = _version_and_epoch(body)
    text = body.get("sealed")
    if not isinstance(text, str) or len(text) > 2 * MAX_SEALED_BYTES:
        raise ReportError("sealed", f"must be a base64 string of at most {MAX_SEALED_BYTES} bytes")
    try:
        sealed = b64decode(text)
        check_sealed(sealed, max_bytes=MAX_SEALED_BYTES)
    except SealError as e:
        raise ReportError("sealed", str(e).removeprefix("sealed: ").removeprefix("public key: ")) from None
    shown = body.get("shown", [])
    if not isinstance(shown, list) or len(shown) > MAX_SHOWN or not all(isinstance(a, str) and a for a in shown):
        raise ReportError("shown", "must be a list of item ids")
    texts = body.get("msgs", [])
    if not isinstance(texts, list) or len(texts) > MAX_MESSAGES or not all(isinstance(t, str) and len(t) < 512
                                                                            for t in texts):
        raise ReportError("msgs", f"must be a list of at most {MAX_MESSAGES} sealed messages (base64 strings)")
    msgs = []
    for t in texts:
        try:
            m = b64decode(t)
            check_sealed(m, max_bytes=256)
        except SealError as e:
            raise ReportError("msgs", str(e).removeprefix("sealed: ").removeprefix("public key: ")) from None
        msgs.append(m)
    return Envelope(user, version, rec_id, sealed, tuple(shown), epoch, tuple(msgs))


def parse_content(raw: bytes, *, d: int, algorithm: str) -> NDArray[np.float64]:
    """The noisy vector of an opened content; :class:`~models.local.reports.ReportError` naming the bad field."""
    body = _json_object(raw, "content")
    linking = [k for k in _LINKING if k in body]
    if linking:
        raise ReportError(linking[0], "a sealed content must not say who sent it, which report or list it answers "
                                      "or the raw answer: next to the contents it would re-identify the user")
    unknown = sorted(set(body) - _CONTENT_FIELDS)
    if unknown:
        raise ReportError(unknown[0] or "(empty)", f"unknown field (a content has {sorted(_CONTENT_FIELDS)})")
    if body.get("schema") != CONTENT_SCHEMA:
        raise ReportError("schema", f"must be {CONTENT_SCHEMA!r}, got {body.get('schema')!r:.60}")
    if body.get("algorithm") != algorithm:
        raise ReportError("algorithm", f"this namespace runs local algorithm {algorithm!r}, got "
                                       f"{body.get('algorithm')!r:.60}")
    vec = body.get("m")
    if not isinstance(vec, list) or len(vec) != d or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in vec):
        raise ReportError("m", f"must be a list of {d} numbers")
    try:
        arr = np.asarray(vec, dtype=np.float64)
    except OverflowError:
        raise ReportError("m", f"holds a value beyond +-{MAX_ABS:g}") from None
    if not np.isfinite(arr).all() or np.abs(arr).max(initial=0.0) > MAX_ABS:
        raise ReportError("m", f"must hold finite values within +-{MAX_ABS:g}")
    return arr


@dataclass(frozen=True)
class SealedBatch:
    """Shuffler → analyzer: a batch label, its sequence number, the shown items and the sealed contents, shuffled."""

    unit: int
    seq: int
    items: list[str]
    sealed: list[bytes]
    epsilon: float
    delta: float
    bound: str = ""
    #: codewords: every report's sealed messages, shuffled together one by one (no order, no report boundary)
    msgs: list[bytes] = field(default_factory=list)
    #: the analysis of ``epsilon`` / ``delta`` (:attr:`models.local.shuffle.ShuffledBatch.analysis`)
    analysis: str = ""

    @property
    def n(self) -> int:
        return len(self.sealed)

    def to_json(self) -> bytes:
        body: dict[str, Any] = {"schema": SEALED_BATCH_SCHEMA, "unit": self.unit, "seq": self.seq, "items": self.items,
                                "sealed": [b64encode(s) for s in self.sealed], "epsilon": self.epsilon,
                                "delta": self.delta, "bound": self.bound}
        if self.msgs:
            body["msgs"] = [b64encode(m) for m in self.msgs]
        if self.analysis:
            body["analysis"] = self.analysis
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, raw: bytes | dict[str, Any]) -> SealedBatch:
        """Parse a sealed batch (``ValueError`` naming what is wrong; the contents are opened by the analyzer)."""
        try:
            body = raw if isinstance(raw, dict) else json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise ValueError(f"sealed batch: not JSON ({e})") from None
        if not isinstance(body, dict) or body.get("schema") != SEALED_BATCH_SCHEMA:
            raise ValueError(f"sealed batch: must be a JSON object with schema {SEALED_BATCH_SCHEMA!r}")
        unit, seq, items, sealed = body.get("unit"), body.get("seq"), body.get("items"), body.get("sealed")
        if not (isinstance(unit, int) and isinstance(seq, int)) or isinstance(unit, bool) or isinstance(seq, bool) \
                or unit < 0 or seq < 1:
            raise ValueError("sealed batch: unit and seq must be integers (unit >= 0, seq >= 1)")
        if not isinstance(items, list) or not isinstance(sealed, list) or not sealed or len(items) < len(sealed):
            raise ValueError("sealed batch: items and sealed must be non-empty lists, items at least as long as "
                             "sealed (every item of every answered list)")
        if not all(isinstance(i, str) and i for i in items) or not all(isinstance(s, str) for s in sealed):
            raise ValueError("sealed batch: items must be non-empty strings and sealed base64 strings")
        eps, delta = body.get("epsilon", 0.0), body.get("delta", 0.0)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (eps, delta)):
            raise ValueError("sealed batch: epsilon and delta must be numbers")
        texts = body.get("msgs", [])
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError("sealed batch: msgs must be a list of base64 strings")
        return cls(unit, seq, list(items), _decoded(sealed), float(eps), float(delta), str(body.get("bound", "")),
                   _decoded(texts), str(body.get("analysis", "")))


def _decoded(texts: list[str]) -> list[bytes]:
    """Base64 texts to bytes; one that does not decode becomes ``b""``, which the analyzer dead-letters alone, with
    the reason, keeping the rest of the batch."""
    out = []
    for t in texts:
        try:
            out.append(b64decode(t))
        except SealError:
            out.append(b"")
    return out


class SealedShuffler(Shuffler):
    """:class:`.shuffle.Shuffler`'s batching policy over envelopes; a closed batch is a :class:`SealedBatch`.

    The policy reads a report's ``user`` only; this class never sees a content (it cannot open one).
    """

    def __init__(self, config: LocalConfig) -> None:
        super().__init__(config)
        #: The envelopes of the batches the last calls closed (the caller clears it; it deletes their copies).
        self.just_closed: list[Envelope] = []

    def add_envelope(self, envelope: Envelope, *, unit: int) -> list[SealedBatch]:
        """Add one envelope (with its ``shown`` items); return the batches it completed."""
        # the policy needs only `.user` (and hands the held records back to `_close` and `state`)
        out: list[Any] = self.add(envelope, unit=unit)  # type: ignore[arg-type]
        return out

    def _close(self, unit: int, o: _Open) -> SealedBatch:  # type: ignore[override]
        held: list[Envelope] = list(o.reports.values())  # type: ignore[arg-type]  # envelopes, see add_envelope
        o.reports = type(o.reports)()
        self.just_closed += held
        sealed = [e.sealed for e in held]
        items = [a for e in held for a in e.shown]
        msgs = [m for e in held for m in e.msgs]
        _RNG.shuffle(sealed)
        _RNG.shuffle(items)
        _RNG.shuffle(msgs)  # message by message: the analyzer cannot tell which came from one report
        self.seq[unit] = self.seq.get(unit, 0) + 1
        eps, delta, bound = self.guarantee()
        return SealedBatch(unit, self.seq[unit], items, sealed, eps, delta, bound, msgs, self.analysis)


def is_sealed_batch(raw: bytes) -> bool:
    """Whether ``raw`` is a :class:`SealedBatch` (else a plain :class:`~models.local.shuffle.ShuffledBatch`)."""
    return SEALED_BATCH_SCHEMA.encode() in raw[:200]


@dataclass(frozen=True)
class OpenedBatch:
    """A sealed batch opened: the batch the analyzer adds (``None`` if any content failed) and the dead letters
    (sealed bytes, reason)."""

    batch: ShuffledBatch | None
    failed: list[tuple[bytes, str]]


def open_batch(raw: bytes, key: AnalyzerKey, config: LocalConfig) -> OpenedBatch:
    """Open every content of a sealed batch (``ValueError`` if the batch itself is malformed) — the analyzer's side.

    All or nothing: if a content fails, no content and no shown item of the batch counts (each content is a dead
    letter: the failed ones with their reason, the others naming the batch's failures). With codewords each
    message is opened on its own: one that does not open or names no codeword is a dead letter (its sealed bytes
    and the reason), the rest count.
    """
    sealed = SealedBatch.parse(raw)
    vectors: list[list[float]] = []
    failed: list[tuple[bytes, str]] = []
    for blob in sealed.sealed:
        try:
            if not blob:
                raise SealError("sealed: not base64")
            vectors.append(parse_content(key.open(blob), d=config.d, algorithm=config.algorithm).tolist())
        except SealError as e:
            failed.append((blob, f"sealed report: {e}"))
        except ReportError as e:
            failed.append((blob, f"sealed report: opened, but its content is malformed: {e}"))
    if failed:  # its shown items cannot be told apart from the others' (they are unlinked on purpose): drop it all
        why = (f"sealed report: not counted: {len(failed)} of the {sealed.n} contents of batch {sealed.seq} of unit "
               f"{sealed.unit} did not open, and the batch's shown items are not linked to its contents, so the "
               f"whole batch is dropped (a failed report's list must not enter the Gram)")
        bad = {blob for blob, _ in failed}
        opened = [blob for blob in sealed.sealed if blob not in bad]
        return OpenedBatch(None, failed + [(blob, why) for blob in opened])
    messages: list[int] = []
    if config.codewords:
        for blob in sealed.msgs:
            try:
                messages.append(parse_message(key.open(blob), codewords=config.codewords))
            except (SealError, ReportError) as e:
                failed.append((blob, f"sealed message: {e}"))
    return OpenedBatch(ShuffledBatch(sealed.unit, sealed.seq, sealed.items, vectors, sealed.epsilon, sealed.delta,
                                     sealed.bound, analysis=sealed.analysis, messages=messages), failed)
