"""Trusted state in Redis: exact statistics, processed offsets, mechanism state, the noise secret.

Nothing here may reach serving (DESIGN §2). Keys follow the layout of
:mod:`pipeline.config.keys` with kinds ``trusted``, ``noise`` and ``config``:

* ``{ns}:trusted:{ns:p<P>}:stats`` — hash, per unit ``g:<u>`` / ``b:<u>`` /
  ``n:<u>`` (Gram bytes, ``b`` bytes, count) of the events of partition ``P``, and per item
  ``i:<row>`` (the item's exact reward sum, when the item term is on);
* ``{ns}:trusted:{ns:p<P>}:offset`` — next unprocessed offset of partition ``P``;
* ``{ns}:ledger:{ns:p<P>}:deadletters`` — hash, dead letters counted by reason;
* ``{ns}:ledger:{ns:p<P>}:users`` — hash, interactions counted per user (for user-level budgets);
* ``{ns}:trusted:{ns:rel}:secret`` — the mechanism's noise seed (generated once);
* ``{ns}:noise:{ns:rel}:state`` — the mechanism state after the last tick;
* ``{ns}:noise:{ns:rel}:pending`` — the release computed at that tick, kept
  until it is published;
* ``{ns}:config:{ns:rel}:settings`` — the model/privacy settings of the namespace.

Each partition's statistics and its offset change together in one Lua
script that first checks the stored offset (:data:`INGEST_SCRIPT`), so a
redelivered event is never counted twice and a stale owner of a partition
cannot overwrite a newer one.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from models.mechanisms import Mechanism, TreeState
from models.streaming import ReleasedStats, UnitStats
from models.streaming.hierarchy import ReleasedHierarchy

from ..config.keys import PublicKeys

__all__ = ["TrustedKeys", "TrustedStore", "INGEST_SCRIPT", "offset_checked_writes", "PUBLISH_SCRIPT", "ConfigMismatchError", "decode_stats",
           "decode_items"]


@dataclass(frozen=True)
class TrustedKeys:
    ns: str

    def _key(self, kind: str, slot: str, name: str) -> str:
        return f"{self.ns}:{kind}:{{{self.ns}:{slot}}}:{name}"

    def stats(self, partition: int) -> str:
        return self._key("trusted", f"p{partition}", "stats")

    def offset(self, partition: int) -> str:
        return self._key("trusted", f"p{partition}", "offset")

    def deadletters(self, partition: int) -> str:
        return PublicKeys(self.ns).ledger_deadletters(partition)

    def user_counts(self, partition: int) -> str:
        """Ledger: interactions counted per user (public: who arrived is not protected)."""
        return PublicKeys(self.ns).ledger_users(partition)

    @property
    def secret(self) -> str:
        return self._key("trusted", "rel", "secret")

    @property
    def noise_state(self) -> str:
        return self._key("noise", "rel", "state")

    @property
    def pending(self) -> str:
        return self._key("noise", "rel", "pending")

    @property
    def pending_figures(self) -> str:
        """Add/remove relation: the pending release's exact figures (count, offsets, ledger summary), published to
        the operator's key (:attr:`PublicKeys.release_figures`) with the release, never to the released hash."""
        return self._key("noise", "rel", "figures")

    @property
    def item_noise_state(self) -> str:
        """The item sums' mechanism state (the item term's release)."""
        return self._key("noise", "rel", "items")

    @property
    def config(self) -> str:
        return self._key("config", "rel", "settings")

    def broker(self, partition: int) -> str:
        """The identity of the broker whose log the partition's stored offset refers to."""
        return self._key("trusted", f"p{partition}", "broker")


def offset_checked_writes(first: int, check: str = "") -> str:
    """The Lua of an atomic commit: unless the partition's stored offset (``KEYS[1]``) is ``ARGV[1]`` (and ``check``,
    more Lua that returns 0 on a mismatch, passes), write nothing and return 0; else HSET the ``n =
    ARGV[first]`` field/value pairs that follow into ``KEYS[2]``, HINCRBY the ``m`` dead-letter reason/count pairs
    after them into ``KEYS[3]`` and the user/count pairs to the end into ``KEYS[4]``, SET the offset to ``ARGV[2]``,
    return 1. The global commit (:data:`INGEST_SCRIPT`) and user level's (``PENDING_SCRIPT``) are this one script."""
    return f"""
local stored = redis.call('GET', KEYS[1])
if stored == false then stored = '' end
if stored ~= ARGV[1] then return 0 end
{check}local n = tonumber(ARGV[{first}])
local i = {first + 1}
if n > 0 then
  local args = {{}}
  for j = 1, 2 * n do args[j] = ARGV[i + j - 1] end
  redis.call('HSET', KEYS[2], unpack(args))
end
i = {first + 1} + 2 * n
local m = tonumber(ARGV[i])
i = i + 1
for j = 1, m do
  redis.call('HINCRBY', KEYS[3], ARGV[i], tonumber(ARGV[i + 1]))
  i = i + 2
end
while i < #ARGV do
  redis.call('HINCRBY', KEYS[4], ARGV[i], tonumber(ARGV[i + 1]))
  i = i + 2
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""


# KEYS[1] - offset key of the partition
# KEYS[2] - stats hash of the partition
# KEYS[3] - dead-letter counts hash of the partition
# KEYS[4] - per-user interaction counts of the partition (ledger)
# ARGV[1] - expected stored next offset ("" when none is stored yet)
# ARGV[2] - new next offset
# ARGV[3] - number of stats fields n; ARGV[4 .. 3+2n] field/value pairs
# ARGV[4+2n] - number of dead-letter reasons m, then m reason/count pairs
# then user/count pairs (to the end)
# return 1 if applied, 0 if the stored offset differs (nothing written)
INGEST_SCRIPT = offset_checked_writes(3)

# KEYS[1] - the partition's broker identity; KEYS[2] - its offset; KEYS[3] - its retired logs (public; same slot)
# ARGV[1] - the current broker's identity
# return 1 if another broker was recorded (the offset is then deleted, and where it stood in the old broker's log
# recorded unless `reset_offsets` did first), 0 otherwise; the retired logs' field '@adopted' names the current one
ADOPT_SCRIPT = """
local stored = redis.call('GET', KEYS[1])
if stored == ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[3], '@adopted', ARGV[1])
if stored == false then return 0 end
redis.call('HSETNX', KEYS[3], stored, redis.call('GET', KEYS[2]) or '0')
redis.call('DEL', KEYS[2])
return 1
"""

# KEYS[1] - pending release hash (noise kind)
# KEYS[2] - released hash
# KEYS[3] - released log stream
# KEYS[4] - the pending release's exact figures (add/remove relation; absent or older otherwise)
# KEYS[5] - the operator's figures of the latest release (ledger kind)
# KEYS[6] - the operator's log of figures (ledger kind)
# return the version now published (0 if none)
PUBLISH_SCRIPT = """
local pv = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
local rv = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
if pv > rv then
  redis.call('COPY', KEYS[1], KEYS[2], 'REPLACE')
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', '100000', '*', 'version', tostring(pv),
             'event', redis.call('HGET', KEYS[1], 'event') or '',
             'offsets', redis.call('HGET', KEYS[1], 'offsets') or '[]',
             'count', redis.call('HGET', KEYS[1], 'count') or '0',
             'ledger', redis.call('HGET', KEYS[1], 'ledger') or '')
  if tonumber(redis.call('HGET', KEYS[4], 'version') or '0') == pv then
    redis.call('COPY', KEYS[4], KEYS[5], 'REPLACE')
    redis.call('XADD', KEYS[6], 'MAXLEN', '~', '100000', '*', 'version', tostring(pv),
               'offsets', redis.call('HGET', KEYS[4], 'offsets') or '[]',
               'count', redis.call('HGET', KEYS[4], 'count') or '0',
               'ledger', redis.call('HGET', KEYS[4], 'ledger') or '')
  end
  return pv
end
return rv
"""


class ConfigMismatchError(RuntimeError):
    """The namespace was created with other model/privacy settings."""


class TrustedStore:
    """Reads and writes of the trusted namespace (ingest, release and solve stages)."""

    def __init__(self, client: redis.Redis, ns: str) -> None:
        self.r = client
        self.keys = TrustedKeys(ns)
        self.public = PublicKeys(ns)
        self._ingest = client.register_script(INGEST_SCRIPT)
        self._publish = client.register_script(PUBLISH_SCRIPT)
        self._adopt = client.register_script(ADOPT_SCRIPT)

    # ------------------------------------------------------------ config and secret

    def ensure_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """Store ``config`` on first use; refuse a different one later."""
        text = json.dumps(config, sort_keys=True)
        self.r.set(self.keys.config, text, nx=True)
        stored = json.loads(self.r.get(self.keys.config) or "{}")
        if stored != json.loads(text):
            diff = {k: (stored.get(k), config.get(k)) for k in set(stored) | set(config) if stored.get(k) != config.get(k)}
            raise ConfigMismatchError(
                f"namespace {self.keys.ns!r} was created with other settings (stored, requested): {diff}; "
                f"use another namespace (--namespace) or the stored settings.")
        return stored

    def noise_seed(self) -> int:
        """The namespace's secret noise seed, generated on first use — and on disk before anything uses it.

        With the append-only file's ``everysec`` policy a crash loses up to a second of writes; losing
        a seed that a release was already drawn from would make the next release draw *new* noise for
        the same statistic (twice the privacy loss). So a new seed is made durable first:
        :func:`make_durable`.
        """
        if self.r.set(self.keys.secret, str(secrets.randbits(63)), nx=True):
            make_durable(self.r, self.keys.secret)
        return int(self.r.get(self.keys.secret))  # type: ignore[arg-type]

    # ------------------------------------------------------------ ingest

    def load_partition(self, partition: int, n_units: int, d: int) -> tuple[UnitStats, int | None]:
        """A partition's exact statistics and its next unprocessed offset (``None`` if never written)."""
        stats, _, off = self.load_partition_items(partition, n_units, d, 0)
        return stats, off

    def load_partition_items(self, partition: int, n_units: int, d: int, n_items: int
                             ) -> tuple[UnitStats, np.ndarray, int | None]:
        """As :meth:`load_partition`, plus the partition's exact per-item reward sums (``n_items`` of them)."""
        raw, off = self.read_partition(partition)
        return decode_stats(raw, n_units, d), decode_items(raw, n_items), off

    def read_partition(self, partition: int) -> tuple[dict[bytes, bytes], int | None]:
        """A partition's statistics hash and offset, read in one transaction (they change together)."""
        with self.r.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.keys.stats(partition))
            pipe.get(self.keys.offset(partition))
            raw, off = pipe.execute()
        return raw, (None if off is None else int(off))

    def commit_partition(self, partition: int, stats: UnitStats, units: np.ndarray, expected: int | None,
                         next_offset: int, deadletters: dict[str, int],
                         users: dict[str, int] | None = None, items: dict[int, float] | None = None) -> bool:
        """Write the touched units' statistics (and item sums) and the new offset atomically, if the offset is
        still ``expected``."""
        fields: list[Any] = []
        for u in np.unique(units):
            u = int(u)
            fields += [f"g:{u}", stats.gram[u].astype("<f8").tobytes(), f"b:{u}", stats.b[u].astype("<f8").tobytes(),
                       f"n:{u}", str(int(stats.count[u]))]
        for item, total in (items or {}).items():  # exact per-item reward sums (repr: exact floats)
            fields += [f"i:{int(item)}", repr(float(total))]
        return self.commit_fields(partition, fields, expected, next_offset, deadletters, users)

    def commit_fields(self, partition: int, fields: list[Any], expected: int | None, next_offset: int,
                      deadletters: dict[str, int], users: dict[str, int] | None = None) -> bool:
        """Write ``fields`` (name, value, name, value, …) to the partition's hash, count the dead letters' reasons
        and the users' events, and set the new offset, atomically, if the offset is still ``expected``
        (:data:`INGEST_SCRIPT`; local mode's analyzer shards use it as they are)."""
        args: list[Any] = ["" if expected is None else str(expected), str(next_offset), len(fields) // 2, *fields,
                           len(deadletters)]
        for reason, count in deadletters.items():
            args += [reason[:200], count]
        for user, count in (users or {}).items():
            args += [user, count]
        keys = [self.keys.offset(partition), self.keys.stats(partition), self.keys.deadletters(partition),
                self.keys.user_counts(partition)]
        return bool(self._ingest(keys=keys, args=args))

    def deadletter_counts(self, partitions: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in range(partitions):
            for k, v in self.r.hgetall(self.keys.deadletters(p)).items():
                out[k.decode()] = out.get(k.decode(), 0) + int(v)
        return out

    def reset_offsets(self, partitions: int) -> tuple[int, list[int | None]]:
        """Forget the stored ingest offsets; return (events counted so far, the old offsets).

        For a new, memory-only broker whose logs restart at offset 0: offsets stored against
        the previous broker would make the workers skip the new log's first events as
        "already counted". Statistics, noise state and releases are kept; new events add to them.
        """
        old = self.offsets(partitions)
        counted = 0
        if any(o is not None for o in old):
            for p in range(partitions):
                counted += sum(int(v) for k, v in self.r.hgetall(self.keys.stats(p)).items() if k.startswith(b"n:"))
            brokers = [self.r.get(self.keys.broker(p)) for p in range(partitions)]
            with self.r.pipeline(transaction=False) as pipe:  # one key per command: a cluster spreads them
                for p in range(partitions):
                    if brokers[p] is not None:  # where the old log was counted to (the web's outbox reads it)
                        pipe.hsetnx(PublicKeys(self.keys.ns).retired_logs(p), brokers[p], str(old[p] or 0))
                    pipe.delete(self.keys.offset(p))
                pipe.execute()
        return counted, old

    def adopt_broker(self, identity: str, partitions: int) -> bool:
        """Record, per partition, the broker its stored offset refers to; where another was recorded, forget the
        offset (a new log) in the same script. Returns whether any offset was reset.

        Atomic per partition (one script on the partition's hash slot, so also in a Redis Cluster): of several
        workers noticing the same new broker, one resets each partition, the others find it adopted.
        """
        reset = 0
        for p in range(partitions):
            reset += int(self._adopt(keys=[self.keys.broker(p), self.keys.offset(p),
                                           PublicKeys(self.keys.ns).retired_logs(p)], args=[identity]))
        return reset > 0

    def offsets(self, partitions: int) -> list[int | None]:
        with self.r.pipeline(transaction=False) as pipe:  # not MGET: in a cluster the keys live on several nodes
            for p in range(partitions):
                pipe.get(self.keys.offset(p))
            vals = pipe.execute()
        return [None if v is None else int(v) for v in vals]

    # ------------------------------------------------------------ release

    def snapshot(self, partitions: int, n_units: int, d: int) -> tuple[UnitStats, list[int]]:
        """Exact statistics over all partitions, summed in partition order, and the offsets they cover.

        Each partition's statistics and offset are read in one transaction, so
        they are consistent (they change together); ``offsets[p]`` is the next
        offset not included (0 for an untouched partition).
        """
        stats, _, offsets = self.snapshot_items(partitions, n_units, d, 0)
        return stats, offsets

    def snapshot_items(self, partitions: int, n_units: int, d: int, n_items: int
                       ) -> tuple[UnitStats, np.ndarray, list[int]]:
        """:meth:`snapshot` plus the per-item reward sums, consistent with it (same reads)."""
        shards, offsets = [], []
        items = np.zeros(n_items)
        for p in range(partitions):
            stats, part_items, off = self.load_partition_items(p, n_units, d, n_items)
            shards.append(stats)
            items += part_items
            offsets.append(0 if off is None else off)
        return UnitStats.merged(shards), items, offsets

    def snapshot_hierarchy(self, partitions: int, n_units: int, d: int, dim: int
                           ) -> tuple[UnitStats, np.ndarray, list[int]]:
        """:meth:`snapshot` plus the exact hierarchy vector summed over partitions, consistent with it."""
        shards, offsets = [], []
        h = np.zeros(dim)
        for p in range(partitions):
            raw, off = self.read_partition(p)
            shards.append(decode_stats(raw, n_units, d))
            h += decode_hierarchy(raw, dim)
            offsets.append(0 if off is None else off)
        return UnitStats.merged(shards), h, offsets

    def load_noise_state(self, mechanism: Mechanism) -> TreeState | None:
        raw = self.r.hgetall(self.keys.noise_state)
        return mechanism.state_from_mapping(raw) if raw else None

    def load_item_noise_state(self, mechanism: Mechanism) -> TreeState | None:
        raw = self.r.hgetall(self.keys.item_noise_state)
        return mechanism.state_from_mapping(raw) if raw else None

    def persist_release(self, state: TreeState | None, release: ReleasedStats | ReleasedHierarchy, event: str,
                        offsets: list[int], items: tuple[TreeState | None, dict[str, bytes]] | None = None,
                        ledger: str | None = None, count: int | None = None,
                        public_count: int | None = None) -> None:
        """Persist the new mechanism state and the pending release together, *before* publishing.

        ``offsets`` (per partition, the first offset *not* covered) says which events the release contains.
        ``items``: the item sums' mechanism state and their release's fields (``items/*``), persisted in the same
        transaction. ``count``: the interactions the release covers, when the release does not carry them itself
        (the hierarchy's). Under the replace relation they are public (arrivals) and published in the released
        hash. ``public_count`` set (the add/remove relation: the noisy count the release itself carries): the
        released hash gets it as its ``count`` and no offsets or ledger; the exact figures go to
        :attr:`TrustedKeys.pending_figures`, published with the release to the operator's key only.
        """
        mapping: dict[str, Any] = dict(release.to_mapping())
        if items is not None:
            mapping.update(items[1])
        exact = {"version": str(release.version), "offsets": json.dumps(offsets),
                 "count": str(int(release.count.sum()) if count is None else int(count))}
        if ledger is not None:  # user level: the release's ledger summary
            exact["ledger"] = ledger
        mapping["version"] = str(release.version)
        mapping["event"] = event
        if public_count is None:
            mapping.update(exact)
        else:
            mapping["count"] = str(int(public_count))
        with self.r.pipeline(transaction=True) as pipe:
            if state is not None:
                pipe.delete(self.keys.noise_state)
                pipe.hset(self.keys.noise_state, mapping=state.to_mapping())  # type: ignore[arg-type]
            if items is not None and items[0] is not None:
                pipe.delete(self.keys.item_noise_state)
                pipe.hset(self.keys.item_noise_state, mapping=items[0].to_mapping())  # type: ignore[arg-type]
            pipe.delete(self.keys.pending)
            pipe.hset(self.keys.pending, mapping=mapping)
            pipe.delete(self.keys.pending_figures)
            if public_count is not None:
                pipe.hset(self.keys.pending_figures, mapping=exact)
            pipe.execute()
        # on disk before it is published: were Redis to lose it, the next release of this tick would reuse its
        # (keyed) noise on other statistics, and the two would reveal their exact difference
        make_durable(self.r, self.keys.pending)

    def pending_version(self) -> int:
        return int(self.r.hget(self.keys.pending, "version") or 0)

    def publish(self) -> int:
        """Copy the pending release to the released key if it is newer; return the published version."""
        return int(self._publish(keys=[self.keys.pending, self.public.released, self.public.released_log,
                                       self.keys.pending_figures, self.public.release_figures,
                                       self.public.release_figures_log]))


def make_durable(client: redis.Redis, key: str) -> bool:
    """Wait until every write so far is fsynced to Redis's append-only file; ``False`` if that cannot be known.

    ``WAITAOF`` where Redis has it (7.2+). Redis 7.0 has not; there, with ``appendfsync always`` a write is
    fsynced before its reply and the AOF is written in order, so one write under ``always`` covers every
    earlier one: the policy is switched for that one write (``key`` rewritten with its own value) and
    restored. Without ``CONFIG`` rights (a managed Redis, an ACL user) or without an AOF, durability is
    the operator's configuration (``appendfsync always``): ``False``.
    """
    try:
        client.execute_command("WAITAOF", 1, 0, 5000)  # Redis >= 7.2: wait for the local fsync
        return True
    except redis.exceptions.ResponseError:
        pass  # unknown command (Redis 7.0): switch the policy for one write
    try:
        policy = client.config_get("appendfsync").get("appendfsync")
        if client.config_get("appendonly").get("appendonly") != "yes":
            return False
        if policy != "always":
            client.config_set("appendfsync", "always")
        try:
            if client.type(key) == b"string":
                value = client.get(key)
                if value is not None:
                    client.set(key, value, xx=True)
            else:  # a hash: rewrite one field with its own value
                field = next(iter(client.hkeys(key)), None)
                if field is not None:
                    client.hset(key, field, client.hget(key, field) or b"")
        finally:
            if policy != "always":
                client.config_set("appendfsync", policy)
        return True
    except redis.exceptions.ResponseError:  # NOPERM / CONFIG disabled
        return False


#: The field of a partition's stats hash that holds its exact hierarchy vector (``--model hierarchy``).
HIERARCHY_FIELD = b"h:0"


def decode_hierarchy(raw: dict[bytes, bytes], dim: int) -> np.ndarray:
    """A partition's exact hierarchy vector (:mod:`models.streaming.hierarchy`; zeros when it has none)."""
    v = raw.get(HIERARCHY_FIELD)
    if v is None:
        return np.zeros(dim)
    out = np.frombuffer(v, dtype="<f8").copy()
    if out.shape != (dim,):
        raise ValueError(f"the stored hierarchy vector has {out.shape[0]} values, the layout {dim}")
    return out


def decode_items(raw: dict[bytes, bytes], n_items: int) -> np.ndarray:
    out = np.zeros(n_items)
    if n_items:
        for k, v in raw.items():
            if k.startswith(b"i:"):
                out[int(k[2:])] = float(v)
    return out


def decode_stats(raw: dict[bytes, bytes], n_units: int, d: int) -> UnitStats:
    s = UnitStats.zeros(n_units=n_units, d=d)
    for k, v in raw.items():
        kind, u = k.decode().split(":")
        if kind == "h":  # the hierarchy vector (decode_hierarchy)
            continue
        i = int(u)
        if kind == "g":
            s.gram[i] = np.frombuffer(v, dtype="<f8").reshape(d, d)
        elif kind == "b":
            s.b[i] = np.frombuffer(v, dtype="<f8")
        elif kind == "n":
            s.count[i] = int(v)
    return s
