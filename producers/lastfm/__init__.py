"""The HetRec 2011 LastFM dataset in the papers' bandit protocol.

Start with :func:`load_catalog`; ``docs/lastfm.md`` explains every choice and
reports the numbers.

>>> from producers.lastfm import load_catalog            # doctest: +SKIP
>>> cat = load_catalog()                                   # doctest: +SKIP
>>> ev = next(cat.events())                                # doctest: +SKIP
>>> cat.features_of(ev.pool).shape, cat.cluster_of(ev.user)  # doctest: +SKIP
((25, 25), 0)

Modules
-------
``raw``       reading the files (encodings, clear errors, data directory)
``features``  TF-IDF of tag words -> truncated SVD -> unit norm
``events``    one event per positive pair, 25-arm pools, shuffled
``clusters``  friend-graph spectral clustering, CoLin ``W``, GOB.Lin adjacency
``cache``     ``.npz`` + JSON cache keyed by input content and parameters
``catalog``   :class:`LastFMCatalog` and :func:`load_catalog`
``compare``   numbers against BanditLib's preprocessed sample in ``bandit/``

The data are under non-commercial terms: they are read from a data directory
(``$PRIVREC_DATA_DIR``), never copied into the repository.
"""

from __future__ import annotations

from producers.lastfm.cache import CACHE_DIR_ENV, default_cache_dir
from producers.lastfm.catalog import BuildParams, LastFMCatalog, LastFMEvent, load_catalog
from producers.lastfm.compare import compare_with_authors_sample
from producers.lastfm.raw import (
    DATA_DIR_ENV,
    DOWNLOAD_URL,
    DataFormatError,
    DatasetNotFoundError,
    default_data_dir,
)

__all__ = [
    "load_catalog",
    "LastFMCatalog",
    "LastFMEvent",
    "BuildParams",
    "compare_with_authors_sample",
    "DatasetNotFoundError",
    "DataFormatError",
    "default_data_dir",
    "default_cache_dir",
    "DATA_DIR_ENV",
    "CACHE_DIR_ENV",
    "DOWNLOAD_URL",
]
