"""Names of the Redis keys that may leave the trusted boundary: released and model state.

Layout (DESIGN §4): ``{ns}:{kind}:{{{ns}:{slot}}}:{name}``. The kind comes
right after the namespace, so ``{ns}:released:*`` and ``{ns}:model:*`` are
the only patterns a serving role needs (a Redis ACL can enforce it); the
``{ns:slot}`` hash tag keeps every key of one atomic write in one Redis
Cluster slot. Trusted keys (exact statistics, offsets, noise state, the
noise secret) are built in :mod:`pipeline.state.trusted`, which the serving code
never imports.

Examples
--------
>>> k = PublicKeys("demo")
>>> k.released, k.model_meta, k.model_unit(3)
('demo:released:{demo:rel}:stats', 'demo:model:{demo:model}:meta', 'demo:model:{demo:model}:u3')
"""

from __future__ import annotations

import struct
from dataclasses import dataclass


__all__ = ["PublicKeys", "PUBLIC_KINDS", "partition_of"]


_M = 0x5BD1E995


def murmur2(data: bytes) -> int:
    """Kafka's default partitioner hash (the Java client's ``Utils.murmur2``, as kafka-python's
    ``kafka.partitioner.default.murmur2`` computes it, the same value) over 4-byte words at once: about half its time.

    >>> murmur2(b"42"), murmur2(b"")
    (417700972, 275646681)
    """
    length = len(data)
    h = 0x9747B28C ^ length
    for k in struct.unpack_from(f"<{length >> 2}I", data):
        k = (k * _M) & 0xFFFFFFFF
        k = ((k ^ (k >> 24)) * _M) & 0xFFFFFFFF
        h = ((h * _M) & 0xFFFFFFFF) ^ k
    extra, tail = length & 3, length & ~3
    if extra:
        if extra == 3:
            h ^= data[tail + 2] << 16
        if extra >= 2:
            h ^= data[tail + 1] << 8
        h = ((h ^ data[tail]) * _M) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * _M) & 0xFFFFFFFF
    return h ^ (h >> 15)


def partition_of(user: str, partitions: int) -> int:
    """The partition of ``interactions`` that holds ``user``'s events: Kafka's default partitioner on the key ``user``.

    Every producer of the project keys an event by its user; ingest refuses an event that arrived on another
    partition, so one user's contributions are bounded (and their ledger kept) in exactly one place.

    >>> partition_of("42", 4) == partition_of("42", 4) and 0 <= partition_of("42", 4) < 4
    True
    """
    return (murmur2(user.encode("utf-8")) & 0x7FFFFFFF) % int(partitions)


#: Key kinds serving may read.
PUBLIC_KINDS = ("released", "model")
#: Release ticks kept in :attr:`PublicKeys.tick_log`.
TICK_LOG_LENGTH = 1000


@dataclass(frozen=True)
class PublicKeys:
    """Released statistics, serving models and the namespace's public config."""

    ns: str

    def _key(self, kind: str, slot: str, name: str) -> str:
        return f"{self.ns}:{kind}:{{{self.ns}:{slot}}}:{name}"

    @property
    def released(self) -> str:
        """Hash: the latest released statistics (``ReleasedStats`` mapping) with ``version``."""
        return self._key("released", "rel", "stats")

    @property
    def released_log(self) -> str:
        """Stream of released versions (version, time, event) for the budget view."""
        return self._key("released", "rel", "log")

    @property
    def model_meta(self) -> str:
        """Hash: ``version``, algorithm, alpha, d, units, and the privacy statement."""
        return self._key("model", "model", "meta")

    @property
    def model_items(self) -> str:
        """Hash: the item term — ``pop`` (the items' popularity feature, float64 bytes), ``weight``, ``version``."""
        return self._key("model", "model", "items")

    def model_unit(self, unit: int) -> str:
        """Hash: ``theta``, ``M`` and ``version`` of one unit's serving model."""
        return self._key("model", "model", f"u{unit}")

    @property
    def release_figures(self) -> str:
        """Hash: the latest release's exact figures under the add/remove relation — ``version``, ``count`` (the
        interactions it covers), ``offsets`` (per partition, the first not covered), ``ledger`` (its summary).
        Participation data: answered to the operator only (under replace they are in :attr:`released`)."""
        return self._key("ledger", "rel", "figures")

    @property
    def release_figures_log(self) -> str:
        """Stream: :attr:`release_figures` of every release (the operator's history)."""
        return self._key("ledger", "rel", "figures_log")

    def ledger_users(self, partition: int) -> str:
        """Hash: interactions counted per user in one partition (public arrival counts; the budget view). Local mode
        with a shuffler: the reports the shuffler accepted (the in-worker task or the separate service writes them)."""
        return self._key("ledger", f"p{partition}", "users")

    def ledger_participation(self, partition: int) -> str:
        """Hash: per user of the partition, participations per epoch (user-level privacy; public arrival data)."""
        return self._key("ledger", f"p{partition}", "participation")

    def ledger_classes(self, partition: int) -> str:
        """Hash: per class ``epoch:k:past`` of the partition's participation records, how many users it holds
        (:attr:`pipeline.config.ledger.LedgerRecord.class_field`; kept by the fold with the records it writes, so
        the ledger's figures read a few classes instead of every user). Absent until the first fold that sees it
        missing builds it; readers then count the participation hash itself."""
        return self._key("ledger", f"p{partition}", "classes")

    def ledger_summary(self, partition: int) -> str:
        """Hash: user-level counters of the partition (``at_cap:<epoch>``, ``dropped``, ``folded``)."""
        return self._key("ledger", f"p{partition}", "summary")

    def ledger_deadletters(self, partition: int) -> str:
        """Hash: malformed events of one partition counted by reason (operations data, no rewards)."""
        return self._key("ledger", f"p{partition}", "deadletters")

    @property
    def stack_repairs(self) -> str:
        """Hash: repairs of the embedded broker and redis-server by the supervisor, per service (operations data)."""
        return self._key("ops", "ops", "repairs")

    @property
    def tick_log(self) -> str:
        """List: the leader's last :data:`TICK_LOG_LENGTH` release ticks, newest first, each a JSON object of its
        wall times and what it folded (operations data: ``privrec bench population`` reads it)."""
        return self._key("ops", "ops", "ticks")

    def retired_logs(self, partition: int) -> str:
        """Hash: per broker identity whose log is gone, the partition's next offset to count in that log when it
        was forgotten, and ``@adopted``: the broker the partition's offset now refers to (operations data; the
        web's outbox sends again what a lost log held beyond it, and all of a log no worker ever adopted)."""
        return self._key("ops", f"p{partition}", "retired-logs")

    def recommendation(self, rec_id: str) -> str:
        """String (JSON, with a TTL): a shown list, kept so that feedback can name it by ``rec_id``."""
        return self._key("recs", "recs", rec_id)

    def patterns(self) -> list[str]:
        """Glob patterns of every key serving is allowed to read."""
        return [f"{self.ns}:{kind}:*" for kind in PUBLIC_KINDS]
