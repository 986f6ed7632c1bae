"""Feedback is matched against the list the server showed: a producer cannot forge the Gram's rows.

The flat model releases the exact Gram matrix, a sum of ``x xᵀ`` over every item of every answered shown
list (docs/privacy.md). That is public only because the list is what ``GET /recommend`` showed, a function of
released models and the request. A producer writing to ``interactions`` could otherwise name a list of its
own. For example, a one-item list holding the chosen item would make the Gram name the user's choice.
Ingest therefore checks every feedback event against the list the server recorded under its ``rec_id``
(:meth:`pipeline.serve.shown.ShownLists.put`: ``{ns}:recs:{{ns:recs}}:<rec_id>``, JSON
``{"rec_id", "user", "items", ...}``, kept 24 h):

* an event that names a ``rec_id`` is accepted only if the server recorded that ``rec_id`` (not expired), for
  the same ``user``, the event's ``arm`` is in the recorded list, and the event's ``shown`` list **equals**
  the recorded one as an ordered list. Order is part of what was shown. The Gram does not depend on it,
  but ``POST /feedback`` copies the stored list as it is, so a genuine event always matches exactly, and a
  reordered list is not the one the server logged;
* an event without a ``rec_id`` is accepted only when :func:`rec_id_required` is false for the model in force;
* an organic listen (``"kind": "listen"``) answers no list and is not checked.

A refused event goes to ``dead-letters`` with a reason from :func:`shown_refusal`.

Examples
--------
>>> stored = b'{"rec_id": "r0", "user": "0", "items": ["0", "1", "2", "3"]}'
>>> ev = {"user": "0", "arm": "0", "rec_id": "r0", "shown": ["0", "1", "2", "3"]}
>>> shown_refusal(ev, stored, require_rec_id=True) is None
True
>>> shown_refusal(ev | {"shown": ["0"]}, stored, require_rec_id=True)
"shown list differs from the one the server recorded for rec_id 'r0': got ['0'], the server showed ['0', '1', '2', '3']"
>>> shown_refusal({"user": "0", "arm": "0", "rec_id": None}, None, require_rec_id=False) is None
True
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis

from ..config.keys import PublicKeys
from ..config.settings import Settings

__all__ = ["rec_id_required", "shown_refusal", "ShownListCheck", "NO_REC_ID", "REASON_PREFIXES"]

#: Why an event without a server-issued ``rec_id`` is refused where :func:`rec_id_required` holds.
NO_REC_ID = ("no server-issued rec_id: the flat model publishes the exact Gram of shown lists, so a producer's own "
             "list would reveal the choice; send feedback through POST /feedback or use the default model "
             "(--model hierarchy)")

#: The start of every reason :func:`shown_refusal` gives (the dead-letter counters' labels).
REASON_PREFIXES = ("no server-issued rec_id", "unknown rec_id", "rec_id issued to another user",
                   "arm not in the recorded list", "shown list missing", "shown list differs")


def rec_id_required(settings: Settings) -> bool:
    """Whether an ``interactions`` feedback event must name a server-issued ``rec_id``.

    True exactly when the model in force releases an exact (noise-free) Gram matrix of shown lists: the flat
    model (``--model flat``) with privacy on. There the Gram is public under the neighbouring relation, so only
    a list the server showed may enter it. The default model (``--model hierarchy``) releases no Gram (its
    contribution takes only the chosen or listened items), and without privacy nothing is protected, so
    events without a ``rec_id`` are accepted there (the papers' protocol: the ``arm`` is a one-item list).

    >>> rec_id_required(Settings(model="flat", epsilon=2.0)), rec_id_required(Settings(model="flat", epsilon=float("inf")))
    (True, False)
    >>> rec_id_required(Settings())  # the default model: the hierarchy
    False
    """
    return not settings.hierarchy and settings.private


def shown_refusal(event: dict[str, Any], stored: bytes | None, *, require_rec_id: bool) -> str | None:
    """Why a parsed feedback ``event`` may not enter the statistics, or ``None`` if it may.

    Parameters
    ----------
    event
        The decoded event (already valid by :func:`pipeline.data.records.parse_batch`; not a listen).
    stored
        The server's record under the event's ``rec_id`` (``None``: unknown or expired, or no ``rec_id``).
    require_rec_id
        :func:`rec_id_required` for the model in force.

    Examples
    --------
    >>> stored = b'{"rec_id": "r0", "user": "0", "items": ["0", "1"]}'
    >>> shown_refusal({"user": "0", "arm": "1", "rec_id": "r0"}, stored, require_rec_id=False)
    "shown list missing: the event names rec_id 'r0' but carries no shown list (the server showed ['0', '1'])"
    >>> shown_refusal({"user": "1", "arm": "1", "rec_id": "r0", "shown": ["0", "1"]}, stored, require_rec_id=False)
    "rec_id issued to another user: 'r0' was shown to user '0', the event names user '1'"
    >>> shown_refusal({"user": "0", "arm": "7", "rec_id": "r0", "shown": ["7"]}, stored, require_rec_id=False)
    "arm not in the recorded list: arm '7' was not among the items the server showed under rec_id 'r0'"
    >>> shown_refusal({"user": "0", "arm": "1", "rec_id": "r9", "shown": ["1"]}, None, require_rec_id=False)
    "unknown rec_id 'r9': the server recorded no list under it (never issued by /recommend, or expired after 24 h)"
    """
    rec_id = event.get("rec_id")
    if rec_id is None:
        return NO_REC_ID if require_rec_id else None
    if type(rec_id) is not str or stored is None:
        return (f"unknown rec_id {rec_id!r}: the server recorded no list under it (never issued by /recommend, "
                f"or expired after 24 h)")
    record = json.loads(stored)
    if record.get("user") != event["user"]:
        return (f"rec_id issued to another user: {rec_id!r} was shown to user {record.get('user')!r}, the event "
                f"names user {event['user']!r}")
    items = record.get("items")
    if event["arm"] not in items:
        return (f"arm not in the recorded list: arm {event['arm']!r} was not among the items the server showed "
                f"under rec_id {rec_id!r}")
    shown = event.get("shown")
    if shown is None:
        return (f"shown list missing: the event names rec_id {rec_id!r} but carries no shown list (the server "
                f"showed {items})")
    if shown != items:
        return (f"shown list differs from the one the server recorded for rec_id {rec_id!r}: got {shown}, the "
                f"server showed {items}")
    return None


class ShownListCheck:
    """The shown-list check of one namespace: the recorded lists of a batch read in one ``MGET``.

    Parameters
    ----------
    client
        A Redis client whose user may read ``{namespace}:recs:*`` (the worker's ``~{ns}:*``).
    namespace
        The namespace under which the web server stores its shown lists.
    require_rec_id
        :func:`rec_id_required` for the model in force.
    """

    def __init__(self, client: redis.Redis, namespace: str, *, require_rec_id: bool) -> None:
        self.client = client
        self.keys = PublicKeys(namespace)
        self.require_rec_id = require_rec_id

    @classmethod
    def for_settings(cls, client: redis.Redis, settings: Settings) -> ShownListCheck:
        """The check of the stack ``settings`` describes: the rule of its model, the lists of its web server (a
        federated site's worker reads them in the coordinator's namespace, read-only:
        :func:`pipeline.config.acl.acl_rules`)."""
        ns = settings.namespace
        if settings.site is not None:
            ns = ns.removesuffix(f"-site{settings.site}")
        return cls(client, ns, require_rec_id=rec_id_required(settings))

    def refusals(self, events: Sequence[tuple[int, dict[str, Any]]]) -> list[tuple[int, str]]:
        """``(index, reason)`` of each refused ``(index, event)``; listens are not checked.

        The lists are read in one ``MGET`` (every key of the namespace's shown lists shares the hash tag
        ``{ns:recs}``, so this holds on a Redis Cluster too)."""
        # a feedback without rec_id is refused only when one is required (shown_refusal): the others are not looked at
        check_all = self.require_rec_id
        feedback = [(i, ev) for i, ev in events
                    if (check_all or ev.get("rec_id") is not None) and ev.get("kind", "feedback") != "listen"]
        named = [(i, ev) for i, ev in feedback if type(ev.get("rec_id")) is str]
        stored: dict[int, bytes | None] = {}
        if named:
            values = self.client.mget([self.keys.recommendation(ev["rec_id"]) for _, ev in named])
            stored = {i: v for (i, _), v in zip(named, values)}
        out = []
        for i, ev in feedback:
            reason = shown_refusal(ev, stored.get(i), require_rec_id=self.require_rec_id)
            if reason is not None:
                out.append((i, reason))
        return out
