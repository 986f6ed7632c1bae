"""Federated mode's transport: site messages on ``federated-updates``, the coordinator, consensus at a site.

A *site* is a worker with its own users (whole model units, :func:`models.streaming.federated.assign_sites`),
its own input topic (``interactions-site-<i>``), its own trusted namespace and secret noise seed
(:func:`site_namespace`). It runs the global mode's ingest and release on its own data; what leaves it is
only its released statistics — the public Grams and counts of its units and its noisy ``b_tilde``.

Messages (``federated-updates``, key = ``site-<i>``, value = JSON, see :func:`encode_message`):

* ``release`` — a site's latest release (star): ``{"kind", "site", "version", "arrays": {...}}``;
* ``consensus`` — a site's round-``r`` state ``s_i(r) = y_i(r) + delta_i(r)`` (decentralized), with the
  increment of its own release ``delta_i(r)`` beside it, so anyone can check that the increments add up
  to the site's release and that ``y_i(r+1) = sum_k P_ik s_k(r)``.

Star (:class:`Coordinator`): keep each site's latest release (a repeated or older version is
ignored — a site that restarts re-sends its last release, which counts once), sum them
(:func:`models.streaming.federated.sum_releases`) and publish the sum as the namespace's released
statistics; the ordinary solve stage turns it into the serving model.

Decentralized (:class:`ConsensusSite`): rounds are synchronous — site ``i`` computes
``y_i(r+1)`` only once every neighbour's round-``r`` state has arrived, so the views follow
``y(r+1) = P s(r)`` exactly and converge to the network average at the spectral rate of ``P``.
A neighbour that is down stalls the mixing (never the serving): the site keeps serving from its
last view, and the rounds resume when the neighbour is back (its round state is persisted).

Nothing here reads another site's trusted keys: a site sees other sites only through messages,
and the coordinator only through messages (Redis ACL users enforce it, :mod:`pipeline.config.acl`).
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import redis
from numpy.typing import NDArray

from models.accounting import NoNoiseEvent
from models.ground.codec import SchemaError, decode_arrays, encode_arrays
from models.streaming import ReleasedStats
from models.streaming.federated import combined_noise_std, sum_releases

__all__ = ["MESSAGE_SCHEMA", "SiteMessage", "MalformedMessage", "encode_message", "decode_message",
           "site_namespace", "site_topic", "Coordinator", "ConsensusSite", "FedKeys"]

MESSAGE_SCHEMA = "privrec.FederatedUpdate/1"
_KINDS = ("release", "consensus")


def site_namespace(namespace: str, site: int) -> str:
    """The trusted namespace of site ``site`` (its keys, its ACL user): ``<ns>-site<i>``.

    >>> site_namespace("privrec", 2)
    'privrec-site2'
    """
    return f"{namespace}-site{int(site)}"


def site_topic(site: int) -> str:
    """Site ``site``'s own input topic (its users' interactions): ``interactions-site-<i>``."""
    return f"interactions-site-{int(site)}"


class MalformedMessage(ValueError):
    """A ``federated-updates`` message that cannot be used; the message is the dead-letter reason."""


@dataclass(frozen=True)
class SiteMessage:
    """One decoded ``federated-updates`` message.

    ``release`` is the site's own release (``release``: its latest; ``consensus``: the increment
    ``delta_i(r)`` since its previous round); ``state`` is ``s_i(r)`` (consensus only);
    ``block_std`` the per-unit-block noise std of the site's release (public).
    """

    kind: str
    site: int
    version: int
    round: int
    release: ReleasedStats
    block_std: NDArray[np.float64]
    state: ReleasedStats | None = None


def _stats_arrays(prefix: str, r: ReleasedStats) -> dict[str, NDArray[Any]]:
    return {f"{prefix}gram": r.gram, f"{prefix}b_tilde": r.b_tilde, f"{prefix}count": np.asarray(r.count, float)}


def encode_message(kind: str, *, site: int, version: int, release: ReleasedStats, block_std: NDArray[np.float64],
                   round_: int = 0, state: ReleasedStats | None = None) -> bytes:
    """JSON bytes of one message: the arrays as base64 little-endian float64 (models.ground.codec) plus scalars."""
    if kind not in _KINDS:
        raise ValueError(f"`kind` must be one of {_KINDS}, got {kind!r}.")
    arrays = {**_stats_arrays("", release), "block_std": np.asarray(block_std, dtype=np.float64)}
    if state is not None:
        arrays.update(_stats_arrays("state_", state))
    mapping = encode_arrays(arrays, scalars={"kind": kind, "site": int(site), "version": int(version),
                                             "round": int(round_), "structure": release.structure,
                                             "noise_std": release.noise_std}, schema=MESSAGE_SCHEMA)
    return json.dumps({k: base64.b64encode(v).decode() for k, v in mapping.items()}).encode()


def decode_message(raw: bytes, *, n_units: int, d: int, sites: int) -> SiteMessage:
    """Validate and decode one message; :class:`MalformedMessage` (the dead-letter reason) otherwise."""
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"not JSON: {exc}") from None
    if not isinstance(obj, dict) or "meta" not in obj:
        raise MalformedMessage("not a federated update (a JSON object with 'meta' and base64 arrays)")
    try:
        mapping = {str(k): base64.b64decode(str(v), validate=True) for k, v in obj.items()}
        arrays, scalars = decode_arrays(mapping, schema=MESSAGE_SCHEMA)
    except (SchemaError, ValueError, KeyError, TypeError) as exc:
        raise MalformedMessage(f"undecodable arrays: {exc}") from None
    kind, site = scalars.get("kind"), scalars.get("site")
    if kind not in _KINDS:
        raise MalformedMessage(f"unknown kind {kind!r}")
    if not isinstance(site, int) or not 0 <= site < sites:
        raise MalformedMessage(f"unknown site {site!r} (sites 0..{sites - 1})")
    version, round_ = scalars.get("version"), scalars.get("round")
    if not isinstance(version, int) or version < 1 or not isinstance(round_, int) or round_ < 0:
        raise MalformedMessage(f"bad version/round {version!r}/{round_!r}")
    noise_std = scalars.get("noise_std")
    if not isinstance(noise_std, (int, float)) or not (math.isfinite(noise_std) and noise_std >= 0):
        raise MalformedMessage(f"bad noise_std {noise_std!r}")

    def stats(prefix: str) -> ReleasedStats:
        shapes = {"gram": (n_units, d, d), "b_tilde": (n_units * d,), "count": (n_units,)}
        out = {}
        for name, shape in shapes.items():
            a = arrays.get(prefix + name)
            if a is None or a.shape != shape:
                raise MalformedMessage(f"{prefix}{name} has shape {None if a is None else a.shape}, expected {shape}")
            if not np.isfinite(a).all():
                raise MalformedMessage(f"{prefix}{name} has NaN or infinite values")
            out[name] = a.astype(np.float64)
        return ReleasedStats(str(scalars.get("structure")), np.zeros((0, 0)), out["gram"], out["b_tilde"],
                             out["count"], int(version), NoNoiseEvent(), float(noise_std))  # type: ignore[arg-type]

    release = stats("")
    block = arrays.get("block_std")
    if block is None or block.shape != (n_units,) or not np.isfinite(block).all() or (block < 0).any():
        raise MalformedMessage(f"block_std must be {n_units} finite non-negative numbers")
    state = stats("state_") if kind == "consensus" else None
    return SiteMessage(str(kind), int(site), int(version), int(round_), release, block.astype(np.float64), state)


@dataclass(frozen=True)
class FedKeys:
    """Redis keys of the federated protocol state of one namespace (a site's, or the coordinator's)."""

    ns: str

    def _key(self, name: str) -> str:
        return f"{self.ns}:fed:{{{self.ns}:fed}}:{name}"

    @property
    def latest(self) -> str:
        """Hash (coordinator): per site, the latest release message (raw bytes) and its version."""
        return self._key("latest")

    @property
    def site(self) -> str:
        """Hash (site, decentralized): the consensus round, the view ``y_i(r)`` and the open round's message."""
        return self._key("site")

    @property
    def sync(self) -> str:
        """Hash (site): ``ticks`` (the site's share clock) and ``sent_version`` (last release sent, star)."""
        return self._key("sync")

    @property
    def inbox(self) -> str:
        """Hash (site, decentralized): ``<site>:<round>`` → a neighbour's consensus message."""
        return self._key("inbox")


class Coordinator:
    """Star: the latest release of each site, summed into the namespace's released statistics.

    ``V`` is the public mixing matrix (the solve stage needs it); the released hash is written
    in the format of :class:`models.streaming.ReleasedStats` so :class:`pipeline.release.stages.SolveStage`
    solves it unchanged.
    """

    def __init__(self, client: redis.Redis, namespace: str, *, V: NDArray[np.float64], structure: str,
                 sites: int) -> None:
        from ...config.keys import PublicKeys

        self.client, self.ns, self.V, self.structure, self.sites = client, namespace, V, structure, sites
        self.keys = FedKeys(namespace)
        self.public = PublicKeys(namespace)

    def offer(self, msg: SiteMessage, raw: bytes) -> bool:
        """Keep ``msg`` if it is newer than the site's stored release; ``False`` for a repeat or an older one."""
        if msg.kind != "release":
            return False
        stored = self.client.hget(self.keys.latest, f"v{msg.site}")
        if stored is not None and int(stored) >= msg.version:
            return False
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.latest, mapping={f"v{msg.site}": str(msg.version), f"m{msg.site}": raw})
            pipe.execute()
        return True

    def latest(self, *, n_units: int, d: int) -> list[SiteMessage]:
        raw = self.client.hgetall(self.keys.latest)
        out = []
        for s in range(self.sites):
            m = raw.get(f"m{s}".encode())
            if m is not None:
                out.append(decode_message(m, n_units=n_units, d=d, sites=self.sites))
        return out

    def aggregate(self, *, n_units: int, d: int) -> int | None:
        """Sum the sites' latest releases into ``{ns}:released:*``; the new version, or ``None`` if unchanged."""
        msgs = self.latest(n_units=n_units, d=d)
        if not msgs:
            return None
        # the aggregate's version increases whenever any site's does: the sum of the site versions
        version = sum(m.version for m in msgs)
        current = self.client.hget(self.public.released, "version")
        if current is not None and int(current) >= version:
            return None
        std = combined_noise_std([m.block_std for m in msgs])
        agg = sum_releases([replace(m.release, V=self.V, structure=self.structure) for m in msgs], noise_std=std)
        agg = replace(agg, version=version, count=np.rint(agg.count).astype(np.int64))
        mapping: dict[str, Any] = dict(agg.to_mapping())
        mapping.update({"version": str(version), "count": str(int(agg.count.sum())),
                        "sites": json.dumps({str(m.site): m.version for m in msgs})})
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(self.public.released)
            pipe.hset(self.public.released, mapping=mapping)
            pipe.xadd(self.public.released_log, {"version": str(version), "count": str(int(agg.count.sum()))},
                      maxlen=10_000, approximate=True)
            pipe.execute()
        return version


class ConsensusSite:
    """Decentralized: site ``site``'s running-consensus view, one synchronous round at a time.

    State (in the site's own namespace, :class:`FedKeys`): the round ``r``, the view ``y_i(r)``
    (an estimate of the network average), the site release the last round included, and the inbox
    of neighbours' round states. :meth:`start_round` returns the message to send for round ``r``
    (at most once per round: a restart re-sends the same bytes); :meth:`finish_round` computes
    ``y_i(r+1) = sum_k P_ik s_k(r)`` once every neighbour's ``s_k(r)`` is in.
    """

    SCHEMA = "privrec.ConsensusView/1"

    def __init__(self, client: redis.Redis, namespace: str, *, site: int, P: NDArray[np.float64],
                 n_units: int, d: int, structure: str) -> None:
        self.client, self.site, self.P = client, int(site), np.asarray(P, dtype=np.float64)
        self.n_units, self.d, self.structure = n_units, d, structure
        self.keys = FedKeys(namespace)
        self.neighbours = [int(k) for k in np.flatnonzero(self.P[self.site]) if int(k) != self.site]

    # -- persisted state
    def _load(self) -> tuple[int, ReleasedStats, ReleasedStats, bytes | None]:
        raw = self.client.hgetall(self.keys.site)
        zero = ReleasedStats(self.structure, np.zeros((0, 0)), np.zeros((self.n_units, self.d, self.d)),
                             np.zeros(self.n_units * self.d), np.zeros(self.n_units), 0, NoNoiseEvent(), 0.0)
        if not raw or b"meta" not in raw:
            return 0, zero, zero, None
        arrays, scalars = decode_arrays({k: v for k, v in raw.items() if k in (b"meta",) or k.startswith(b"a:")},
                                        schema=self.SCHEMA)

        def stats(prefix: str) -> ReleasedStats:
            return replace(zero, gram=arrays[prefix + "gram"].astype(np.float64),
                           b_tilde=arrays[prefix + "b_tilde"].astype(np.float64),
                           count=arrays[prefix + "count"].astype(np.float64))

        return int(scalars["round"]), stats("view_"), stats("included_"), raw.get(b"sent")  # type: ignore[arg-type]

    def _save(self, round_: int, view: ReleasedStats, included: ReleasedStats, sent: bytes | None) -> None:
        mapping: dict[str, bytes] = encode_arrays({**_stats_arrays("view_", view), **_stats_arrays("included_", included)},
                                                  scalars={"round": round_}, schema=self.SCHEMA)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.site)
            pipe.hset(self.keys.site, mapping={**mapping, **({"sent": sent} if sent is not None else {})})
            pipe.execute()

    @property
    def round(self) -> int:
        return self._load()[0]

    def view(self) -> ReleasedStats:
        """``y_i(r)``: this site's estimate of the network *average* (serve ``M * y_i``)."""
        return self._load()[1]

    # -- the protocol
    def start_round(self, release: ReleasedStats, block_std: NDArray[np.float64]) -> bytes:
        """The round-``r`` message ``s_i(r) = y_i(r) + delta_i(r)``; the same bytes until the round finishes."""
        round_, view, included, sent = self._load()
        if sent is not None:
            return sent
        delta = replace(release, gram=release.gram - included.gram, b_tilde=release.b_tilde - included.b_tilde,
                        count=np.asarray(release.count, float) - included.count)
        state = replace(view, gram=view.gram + delta.gram, b_tilde=view.b_tilde + delta.b_tilde,
                        count=view.count + delta.count)
        raw = encode_message("consensus", site=self.site, version=max(1, release.version), release=delta,
                             block_std=block_std, round_=round_, state=state)
        # persisted before it is sent: the round's message is fixed, a restart re-sends it unchanged
        self._save(round_, view, replace(release, count=np.asarray(release.count, float)), raw)
        self.client.hset(self.keys.inbox, f"{self.site}:{round_}", raw)
        return raw

    def receive(self, msg: SiteMessage, raw: bytes) -> bool:
        """File a neighbour's (or our own) consensus message; ``False`` if it is not one this site mixes."""
        if msg.kind != "consensus" or (msg.site not in self.neighbours and msg.site != self.site):
            return False
        return bool(self.client.hsetnx(self.keys.inbox, f"{msg.site}:{msg.round}", raw))

    def finish_round(self) -> bool:
        """``y_i(r+1) = sum_k P_ik s_k(r)`` if every neighbour's round-``r`` state is in; then ``r += 1``."""
        round_, view, included, sent = self._load()
        if sent is None:
            return False
        wanted = [self.site, *self.neighbours]
        raws = self.client.hmget(self.keys.inbox, [f"{k}:{round_}" for k in wanted])
        if any(r is None for r in raws):
            return False
        states = {k: decode_message(r, n_units=self.n_units, d=self.d, sites=self.P.shape[0]).state
                  for k, r in zip(wanted, raws)}
        w = self.P[self.site]
        gram = sum(w[k] * states[k].gram for k in wanted)  # type: ignore[union-attr]
        b = sum(w[k] * states[k].b_tilde for k in wanted)  # type: ignore[union-attr]
        count = sum(w[k] * np.asarray(states[k].count, float) for k in wanted)  # type: ignore[union-attr]
        new_view = replace(view, gram=np.asarray(gram), b_tilde=np.asarray(b), count=np.asarray(count))
        self._save(round_ + 1, new_view, included, None)
        self.client.hdel(self.keys.inbox, *[f"{k}:{round_ - 1}" for k in wanted])  # keep one old round
        return True
