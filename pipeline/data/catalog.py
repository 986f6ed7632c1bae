"""Item catalogs: who the users are, which unit models them, and each arm's features.

A catalog is public data: user ids and their model unit, arm ids with their
feature vectors and names, and the collaboration matrix ``W`` over units.
The pipeline looks arms up here when an event omits its ``context``, and
serving scores candidates with these features.

* :class:`SyntheticCatalog`: the collaborative paper's synthetic world (users
  ``"0".."N-1"``, one unit each; arms ``"0".."K-1"``), built from a public seed.
* :class:`LastFMCatalogAdapter`: HetRec LastFM (users → 100 friend-graph
  clusters; artists with TF-IDF/SVD features), from :mod:`producers.lastfm`; :func:`load_catalog` uses it for
  ``graph="users"`` only: with clusters LastFM goes through the generic path
  (:func:`pipeline.data.catalog_open.lastfm_catalog`, the same features, units, ``W`` and fingerprint).
* a catalog directory (:mod:`pipeline.data.catalog_open`, :mod:`producers.catalog`): anyone's items, users, graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from models.ground.environment import SyntheticEnvironment

from .catalog_base import Catalog, FloatArray, UnknownArmError, UnknownUserError, _Base
from ..config.settings import SettingsError

if TYPE_CHECKING:
    from producers.lastfm import LastFMCatalog

    from .catalog_open import OpenCatalog
    from ..config.settings import Settings

__all__ = ["Catalog", "SyntheticCatalog", "LastFMCatalogAdapter", "load_catalog", "item_capacity", "UnknownUserError",
           "UnknownArmError"]


class SyntheticCatalog(_Base):
    """The synthetic world of the collaborative paper (see :class:`models.SyntheticEnvironment`).

    Examples
    --------
    >>> cat = SyntheticCatalog(n_users=3, d=4, n_arms=20, seed=1)
    >>> cat.unit_of("2"), cat.features_of(["0", "5"]).shape, cat.n_units
    (2, (2, 4), 3)
    """

    name = "synthetic"

    def __init__(self, *, n_users: int = 10, d: int = 25, n_arms: int = 1000, seed: int = 0,
                 w_quantile: float = 0.5) -> None:
        self.env = SyntheticEnvironment(n_users=n_users, d=d, n_arms=n_arms, n_shown=min(10, n_arms), horizon=1,
                                        seed=seed, w_quantile=w_quantile)
        self.W = self.env.W
        self._features = self.env.arms
        self._arm_ids = [str(i) for i in range(n_arms)]
        self._arm_rows = {a: i for i, a in enumerate(self._arm_ids)}
        self._user_unit = {str(u): u for u in range(n_users)}

    def arm_name(self, arm: str) -> str:
        self.arm_row(arm)
        return f"arm {arm}"

    @property
    def default_pool(self) -> Sequence[str]:
        """The configured pool, else the first 25 arms."""
        return self._default_pool_override or self._arm_ids[: min(25, len(self._arm_ids))]


class LastFMCatalogAdapter(_Base):
    """HetRec LastFM: users are modelled by their friend-graph cluster (``graph="clusters"``) or each by
    themselves (``graph="users"``: ``W`` is CoLin's sparse relation over all 1,892 users, the column-normalised
    ``A + I`` of the friend graph, :func:`models.streaming.sparse.colin_relation`)."""

    name = "lastfm"

    def __init__(self, catalog: LastFMCatalog, *, graph: str = "clusters") -> None:
        self.lastfm = catalog
        self.graph = graph
        if graph == "users":
            from models.streaming.sparse import colin_relation
            from producers.lastfm.clusters import friend_adjacency
            from producers.lastfm.raw import read_raw

            ids = np.array([int(u) for u in catalog.users], dtype=np.int64)
            if not np.all(ids[1:] > ids[:-1]):
                raise ValueError("the LastFM catalog's users must be sorted by id")
            self.W = colin_relation(friend_adjacency(read_raw(catalog.data_dir).friends, ids))
            self._user_unit = {u: i for i, u in enumerate(catalog.users)}
        elif graph == "clusters":
            self.W = np.asarray(catalog.W, dtype=np.float64)
            self._user_unit = dict(catalog.user_cluster)
        else:
            raise ValueError(f"`graph` must be 'clusters' or 'users', got {graph!r}.")
        self._features = np.asarray(catalog.feature_matrix, dtype=np.float64)
        self._arm_ids = list(catalog.artist_ids)
        self._arm_rows = dict(catalog.artist_index)
        self._popular = catalog.most_logged(25)

    def arm_name(self, arm: str) -> str:
        self.arm_row(arm)
        return str(self.lastfm.artist_names.get(arm, f"artist {arm}"))

    @property
    def default_pool(self) -> Sequence[str]:
        """The configured pool, else the 25 most often tagged artists."""
        return self._default_pool_override or self._popular


def item_capacity(catalog: Catalog) -> int:
    """Coordinates of the item term's reward sums: a catalog directory's pre-sized capacity (items may be added
    while running, :mod:`pipeline.serve.items_live`), else the number of items."""
    return int(getattr(catalog, "item_capacity", len(catalog.feature_matrix)))


def load_catalog(settings: Settings) -> SyntheticCatalog | LastFMCatalogAdapter | OpenCatalog:
    """The catalog the settings name (LastFM or a catalog directory is built or read from its cache), with its
    default pool.

    Raises :class:`~pipeline.config.settings.SettingsError` (``default_pool``) when the
    configured pool names an arm the catalog does not have.
    """
    catalog: SyntheticCatalog | LastFMCatalogAdapter | OpenCatalog
    if settings.catalog not in ("synthetic", "lastfm"):  # a catalog directory
        from .catalog_open import open_catalog

        catalog = open_catalog(settings.catalog, d=settings.d, units=settings.catalog_units,
                               seed=settings.world_seed)
    elif settings.catalog == "synthetic":
        catalog = SyntheticCatalog(n_users=settings.n_users, d=settings.d, n_arms=settings.n_arms,
                                   seed=settings.world_seed)
    elif settings.graph == "clusters":  # LastFM through the generic path: its export, built as any directory
        from .catalog_open import lastfm_catalog

        catalog = lastfm_catalog(settings.data_dir, d=settings.d)
    else:
        from producers.lastfm import load_catalog as load_lastfm

        catalog = LastFMCatalogAdapter(load_lastfm(settings.data_dir, d=settings.d, progress=False),
                                       graph=settings.graph)
    pool = settings.default_pool_ids
    if pool is not None:
        try:
            catalog.with_default_pool(pool)
        except UnknownArmError as exc:
            raise SettingsError("default_pool", f"{exc}.") from None
    return catalog
