"""Event producers: everything that creates interaction events for the pipeline.

``producers.lastfm``
    The HetRec 2011 LastFM dataset turned into the papers' protocol: 25-dim
    artist features, 25-arm pools around each logged positive, 100 friend-graph
    user clusters and the CoLin / GOB.Lin cluster graph (see ``docs/lastfm.md``).

Producers only create events; the math lives in ``models`` and the transport
in ``pipeline``.
"""

from __future__ import annotations

__all__ = ["lastfm"]
