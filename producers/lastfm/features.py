"""Artist features: TF-IDF of tag words, truncated SVD to ``d`` dims, unit L2 norm.

This follows the papers' protocol (spec collaborative-dp-bandits §8 "LastFM
and Delicious", G17) and the generator published with BanditLib: every tag
assignment row contributes the words of its tag (the tag text split on
whitespace, ``_`` and ``-``, lower-cased) to its artist; the artist x word
count matrix goes through scikit-learn's ``TfidfTransformer()`` with defaults
and ``TruncatedSVD(n_components=d)``. We then scale every row to unit L2 norm,
so ``Lx = 1`` exactly (spec G17).

Artists that nobody tagged have no features. They are left out of the
feature table, so they never appear in a pool (see ``docs/lastfm.md``).

Examples
--------
>>> tag_words("Hip-Hop  classic_rock")
['hip', 'hop', 'classic', 'rock']
"""

from __future__ import annotations

import re

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import TfidfTransformer

__all__ = ["tag_words", "build_features"]

_SPLIT = re.compile(r"[\s_\-]+")


def tag_words(tag: str) -> list[str]:
    """Split a tag value into lower-case words on whitespace, ``_`` and ``-``."""
    return [w for w in _SPLIT.split(tag.lower()) if w]


def build_features(
    tagged: NDArray[np.int64],
    tags: dict[int, str],
    d: int,
    seed: int,
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Build unit-norm ``d``-dim artist features from tag assignments.

    Parameters
    ----------
    tagged
        ``(n, >=3)`` rows ``user, artist, tag, ...`` (``user_taggedartists.dat``).
    tags
        ``tagID -> tagValue`` (``tags.dat``).
    d
        Feature dimension (the papers use 25).
    seed
        ``random_state`` of the randomised truncated SVD.

    Returns
    -------
    artist_ids : ndarray of int64, shape (n_artists,)
        Sorted ids of the artists that have features.
    features : ndarray of float64, shape (n_artists, d)
        Row ``i`` belongs to ``artist_ids[i]``; every row has L2 norm 1.

    Raises
    ------
    ValueError
        If ``d`` is not smaller than the number of distinct tag words, or a
        tag id is missing from ``tags``.

    Examples
    --------
    >>> rows = np.array([[1, 10, 1], [1, 11, 2], [2, 12, 3], [2, 10, 3]])
    >>> ids, X = build_features(rows, {1: "rock", 2: "hard-rock", 3: "pop"}, d=2, seed=0)
    >>> ids
    array([10, 11, 12])
    >>> np.linalg.norm(X, axis=1)
    array([1., 1., 1.])
    """
    if d < 1:
        raise ValueError(f"`d` must be positive, got {d}.")
    missing = sorted(set(np.unique(tagged[:, 2]).tolist()) - set(tags))
    if missing:
        raise ValueError(f"tag ids {missing[:10]} used in `tagged` are missing from `tags`.")
    # Vocabulary over the tags that are used, words in sorted order (deterministic).
    used = np.unique(tagged[:, 2])
    words_of = {int(t): tag_words(tags[int(t)]) for t in used}
    vocab = {w: i for i, w in enumerate(sorted({w for ws in words_of.values() for w in ws}))}
    if d >= len(vocab):
        raise ValueError(f"`d` must be smaller than the number of tag words ({len(vocab)}), got {d}.")
    # tag x word incidence, then (artist x tag) @ (tag x word) = artist x word counts.
    tag_index = {int(t): i for i, t in enumerate(used)}
    tw_rows = [tag_index[t] for t, ws in words_of.items() for _ in ws]
    tw_cols = [vocab[w] for ws in words_of.values() for w in ws]
    tag_word = sp.csr_matrix(
        (np.ones(len(tw_rows)), (tw_rows, tw_cols)), shape=(len(used), len(vocab))
    )
    artist_ids, artist_pos = np.unique(tagged[:, 1], return_inverse=True)
    tag_pos = np.searchsorted(used, tagged[:, 2])
    artist_tag = sp.csr_matrix(
        (np.ones(len(tagged)), (artist_pos, tag_pos)), shape=(len(artist_ids), len(used))
    )
    counts = (artist_tag @ tag_word).tocsr()
    has_words = np.asarray(counts.sum(axis=1)).ravel() > 0
    tfidf = TfidfTransformer().fit_transform(counts)
    reduced = TruncatedSVD(n_components=d, random_state=seed).fit_transform(tfidf)
    norms = np.linalg.norm(reduced, axis=1)
    keep = has_words & (norms > 1e-12)
    features = reduced[keep] / norms[keep, None]
    return artist_ids[keep].astype(np.int64), features.astype(np.float64)
