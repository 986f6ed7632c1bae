"""Settings of a privrec pipeline, from flags and environment variables.

Every setting has a flag (``--epsilon``) and an environment variable
(``PRIVREC_EPSILON``); flags win. The Kafka and Redis endpoints also read
the conventional ``KAFKA_BOOTSTRAP`` and ``REDIS_URL``. Invalid settings fail
at start with a message naming the setting (:class:`SettingsError`).

The settings that define the model and its privacy (algorithm, mechanism,
epsilon, delta, tree size, catalog, dimensions, lambda, alpha) are stored in
Redis when a namespace is first used; a worker started later with different
values is refused, since mixing them would break the privacy accounting.

Examples
--------
>>> s = Settings.from_mapping({"epsilon": "inf", "algorithm": "colin"})
>>> s.epsilon, s.algorithm, s.private
(inf, 'colin', False)
>>> Settings.from_mapping({"epsilon": "-1"})
Traceback (most recent call last):
...
pipeline.config.settings.SettingsError: setting `epsilon` (PRIVREC_EPSILON): must be positive or inf, got -1.0.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from models.local.config import DEFAULT_VARIANT, VARIANTS
from models.mechanisms import MECHANISMS
from models.mechanisms.participation import B_CLIP, ITEM_CLIP

__all__ = ["Settings", "SettingsError", "add_arguments", "MODEL_FIELDS", "DEFAULT_USER_BUDGET", "DEFAULT_MECHANISM", "DEFAULT_NOISE_RIDGE", "ALGORITHMS",
           "BASELINE_ALGORITHMS"]

#: The default mechanism: the best measured in `privrec experiment mechanisms` (docs/privacy.md, "Privacy
#: guarantees"): BLT square-root factorization on the users' own statistics, exact Gaussian-DP accounting.
DEFAULT_MECHANISM = "user-blt-exact"
#: Default kappa of the noise-scaled ridge (docs/experiments.md, "Continual-release mechanisms").
DEFAULT_NOISE_RIDGE = 100.0

#: The other papers' private LinUCB variants (``models.policies.baselines``), selectable as algorithms: each
#: brings its own per-unit mechanism, so the ``mechanism`` setting does not apply to them.
BASELINE_ALGORITHMS: dict[str, str] = {
    "ss-gaussian": "SS-LinUCB-Gaussian",
    "ss-gaussian-tight": "SS-LinUCB-Gaussian-tight",
    "ss-wishart": "SS-LinUCB-Wishart",
    "dgs-laplace": "DGS-LinUCB-Laplace",
    "dgs-gaussian": "DGS-LinUCB-Gaussian",
}
ALGORITHMS = ("linucb", "colin", "goblin", *BASELINE_ALGORITHMS)
MODES = ("global", "federated", "local")
#: Local mode: what a device reports (models.local.config.ALGORITHMS).
LOCAL_ALGORITHMS = ("tree", "round")
PRIVACY_UNITS = ("user", "event")
#: Neighbouring relations (``privacy_relation``): ``add-remove`` protects whether a user took part at all (their whole
#: epoch, arrivals included); ``replace`` protects what a user did, with their arrivals public.
RELATIONS = ("add-remove", "replace")
#: The serving model over the released statistics (``model``): the hierarchy of :mod:`models.streaming.hierarchy`
#: (public prior -> pooled -> units -> items), or the papers' flat per-unit ridge regression with the item term.
MODELS = ("hierarchy", "flat")
#: ``user_cap`` when unset, by model: chosen on held-out windows of LastFM, the synthetic population and a synthetic
#: tagged catalog (docs/hierarchy.md for the hierarchy, docs/privacy.md for the flat model).
DEFAULT_CAPS = {"hierarchy": 1, "flat": 8}
#: Local mode's protocol when none is set: the variant measured to learn (``shuffled-items``, docs/local-protocol.md).
LOCAL_DEFAULT = VARIANTS[DEFAULT_VARIANT].settings
CAP_POLICIES = ("ignore", "reject")
#: Mechanisms with a multi-participation sensitivity bound (models.mechanisms.participation).
USER_LEVEL_MECHANISMS = ("blt-exact", "blt-zcdp", "gaussian-exact", "gaussian-zcdp")
#: Site graphs of the federated mode (or a path to an edge-list file: one "i j" pair per line).
TOPOLOGIES = ("star", "ring", "complete")
FED_SCHEDULES = ("tick", "doubling")
CATALOGS = ("synthetic", "lastfm")
#: LastFM: who a model unit is (``clusters``: the 100 friend-graph clusters; ``users``: every user, the friend
#: graph as a sparse relation, solved matrix-free).
GRAPHS = ("clusters", "users")
#: Kafka security (pipeline.config.kafkaconn).
KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class SettingsError(ValueError):
    """A setting is invalid; the message names it (flag and environment variable)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"setting `{name}` ({env_name(name)}): {message}")
        self.setting = name


def env_name(name: str) -> str:
    if name == "kafka":
        return "KAFKA_BOOTSTRAP"
    if name == "redis_url":
        return "REDIS_URL"
    return "PRIVREC_" + name.rstrip("_").upper()


@dataclass(frozen=True)
class Settings:
    """All pipeline settings (see the module docstring for sources and checks).

    Attributes
    ----------
    mode
        Trust model: ``"global"`` (the server adds the noise), ``"federated"``
        (``sites`` sites, each adding the noise to its own users' statistics and
        sharing only its releases; see :mod:`pipeline.modes.federated.federation`) or ``"local"``
        (each user's device adds the noise and sends only reports; see
        :mod:`pipeline.modes.local.localmode` and ``docs/local-protocol.md``).
    local_algorithm
        Local mode: ``"tree"`` (each device releases its own ``b_u`` through its own
        continual-release mechanism, LDP-CoLin / LDP-GOBLin) or ``"round"`` (one noisy
        ``r x`` per interaction, the LDP bandits paper's reduction).
    local_mechanism, local_capacity
        Local mode, ``tree``: the devices' mechanism (default ``blt-exact``) and the
        reports per epoch of a device's mechanism.
    shuffle_batch
        Local mode, ``round``: ``n > 0`` turns the shuffler on — batches of ``n``
        distinct users' reports per unit, stripped and shuffled; ``epsilon`` is then
        the central guarantee of a batch (Feldman, McMillan & Talwar).
    local_codewords
        Local mode with shuffling at user level: ``K > 0`` sends each listen as its codeword in a public codebook
        of ``K`` codewords of the catalog's features, with a blanket of fake codewords, in population-wide
        batches of ``shuffle_batch`` distinct users (docs/local-protocol.md); ``0``: Laplace reports per unit.
    local_item_term
        With codewords, ``1``: the codebook is the catalog itself (``local_codewords`` = its number of items, at most
        4096), so a message names the item listened to, and the analyzer also releases the messages' estimated
        histogram as the item sums of the item term (served with ``item_weight`` as in the global mode): the same
        histogram, post-processing, no extra privacy cost.
    sites
        Federated mode: number of sites ``M``; unit ``u`` belongs to site ``u mod M``
        (public and stable).
    site
        Federated mode: which site this worker is (set by ``privrec up`` per worker;
        ``None`` for the web process and the coordinator).
    topology
        Federated mode: ``"star"`` (a coordinator sums the sites' releases and serves
        everyone), ``"ring"`` or ``"complete"`` (decentralized: each site mixes its
        neighbours' states and serves its own users), or the path of an edge-list file.
    fed_schedule
        Federated mode: when sites share — every release tick (``"tick"``) or at release
        ticks 1, 2, 4, 8, ... (``"doubling"``, the federated paper's schedule).
    consensus_kappa
        Decentralized federated mode: step ``kappa`` of the mixing matrix
        ``P = I - (kappa / d_max) L`` (in ``(0, 1]``; 0.5 converges on every graph).
    model
        The serving model: ``"hierarchy"`` (the default for linucb over model units at user level, global mode:
        one release of a pooled block, the item counts and, where the population is large enough, each unit's block;
        served by :func:`models.streaming.hierarchy.solve_hierarchy`, docs/hierarchy.md) or ``"flat"`` (the papers'
        per-unit ridge regression released through ``mechanism``, with the item term; every other algorithm,
        mode and graph).
    hierarchy_shares
        With the hierarchy: the blocks' shares of ``mu**2`` as ``pool=0.05,items=0.95,units=0`` (unset: the rule of
        :func:`models.streaming.hierarchy.default_shares`, from the catalog's public size).
    algorithm
        ``"linucb"`` (one model per unit), ``"colin"`` or ``"goblin"`` (released
        through ``mechanism``), or one of the other papers' private LinUCB
        variants, per-unit LinUCB with their own per-unit mechanism and width
        (:data:`BASELINE_ALGORITHMS`, ``models.policies.baselines``):
        ``"ss-gaussian"`` / ``"ss-gaussian-tight"`` (Shariff & Sheffet, joint DP,
        Gaussian tree over the augmented Gram matrix, paper / exact
        calibration), ``"ss-wishart"`` (S&S, shifted Wishart tree),
        ``"dgs-laplace"`` / ``"dgs-gaussian"`` (dynamic global sensitivity:
        noise on theta; its claimed guarantee is not a proof).
    mechanism
        Continual-release mechanism (a name in ``models.mechanisms.MECHANISMS``)
        of ``linucb`` / ``colin`` / ``goblin``. **Not used by the baselines**
        (``ss-*``, ``dgs-*``), which bring their own; their stored model config
        records the baseline's mechanism instead.
    epsilon, delta
        Event-level privacy of every released statistic; ``epsilon = inf``
        switches noise off (the non-private baseline).
    tick_seconds
        Release period of the leader timer.
    tree_levels
        Levels of each release tree; a tree covers ``2**tree_levels - 1``
        ticks, then a new epoch starts. Baselines: each unit's tree is sized
        for ``2**tree_levels - 1`` of that unit's own releases, with the
        paper's level count for that many leaves.
    catalog
        ``"synthetic"`` (the paper's synthetic users and arms), ``"lastfm"``, or the path of a catalog
        directory (:mod:`producers.catalog`; stored absolute, so every process reads the same one).
    catalog_units
        Catalog directory: the number of clusters of its ``edges.csv``, or of units of the public rule
        ``SHA-256(user) mod catalog_units`` (which also places every user the catalog does not list).
    data_dir
        LastFM data directory (``None``: the default next to the repo).
    graph
        LastFM: ``"clusters"`` (every user of a friend-graph cluster shares the cluster's model; a dense
        ``dN x dN`` solve at N = 100) or ``"users"`` (one model per user, 1,892 of them, the friend graph as
        a sparse relation: CoLin's column-normalised ``A + I``, GOB.Lin's ``I + L``; solved matrix-free by
        conjugate gradients, :mod:`models.streaming.sparse`; global mode, linucb / colin / goblin).
    d, n_users, n_arms, world_seed
        Synthetic catalog: dimension, users, arms and the (public) seed of its
        construction. LastFM fixes ``d = 25`` and 100 user clusters.
    lambda_, alpha
        Ridge weight and exploration width of the serving models. ``ss-*``
        use Shariff & Sheffet's own per-unit width (Prop. 4) instead of
        ``alpha``; ``dgs-*`` use the constant ``alpha`` (their papers' practice).
    noise_ridge
        ``kappa`` of the noise-scaled ridge (linucb / colin / goblin): serving
        models are solved with ``lambda_ + kappa * s``, ``s`` the release's
        noise std (public). Tuned on held-out seeds by ``privrec experiment
        mechanisms``; ``0`` keeps ``lambda_`` fixed; no effect without noise.
    prior_strength, prior_reward
        A public prior mean of every serving model's theta (linucb): ``prior_strength`` pseudo-observations
        (``0``: off, the ordinary ridge) centred on the catalog's mean context scaled so that it scores
        ``prior_reward`` (the expected reward of an average recommendation; LastFM's one item of 25: 0.04).
        Serving models are ``M = (G + (lambda + kappa * noise_std + s) I)^-1``, ``theta = M (b + s theta_0)``
        (:func:`models.streaming.solve.public_prior`): post-processing of the public catalog, no privacy cost.
        10,000 was chosen on held-out LastFM events (docs/public-prior.md).
    item_weight
        Weight of the *item term* (linucb / colin / goblin): each candidate's score gets
        ``item_weight / (1 + (s / 2)**2) * pop_a``, where ``pop_a`` is the normalized released reward
        sum of the item (its positives, released through ``blt-exact`` beside the bandit statistic)
        and ``s`` that release's noise std (public). ``None``: 1 on every catalog with an ``-exact`` mechanism (the
        flat model; the hierarchy weighs its item level by the release's own noise), 0 with the others (no exact
        composition); 0 releases no item sums and gives the bandit the whole budget.
    listen_weight
        Weight in ``[0, 1]`` of an organic listen (an ``interactions`` event with ``"kind": "listen"``)
        in the bandit statistic; it always counts in the item sums. ``None``: 1 with noise, 0.2
        without (chosen on held-out LastFM events, ``privrec experiment lastfm``).
    item_share
        With the item term on, the bandit's share of the budget (of ``mu**2`` in Gaussian DP); the item
        sums get the rest; together exactly ``(epsilon, delta)``-DP (exact mechanisms only).
    privacy_unit
        ``"user"`` (the default for linucb / colin / goblin with a mechanism that has a multi-participation
        bound — the BLT factorizations and the Gaussian tree; otherwise ``"event"``): each user's interactions within one release
        tick are summed and clipped (``b`` to norm ``Lx``, the item rewards to norm 1) before they enter the
        statistics, each user contributes to at most ``user_cap`` ticks per epoch, and the noise is
        calibrated so that a capped user's whole history in an epoch is ``(epsilon, delta)``-DP (exact
        multi-participation sensitivity of the mechanism, ``models.mechanisms.participation``); or
        ``"event"`` (each interaction alone; a user with k interactions gets the group bound). The
        per-unit baselines (ss-*, dgs-*) are event level only. Federated mode (default ``"user"`` too, the flat
        model): each site folds its own users' ticks, caps them and keeps their ledger and lifetime budget (a user
        belongs to one site, a public rule, so their site's ledger is their whole history). Local mode (default
        ``"user"`` too): each device makes at most ``user_cap`` reports per epoch (``tree_ticks * tick_seconds``
        seconds), calibrates its noise to them and stops at ``user_budget`` (:class:`models.local.LocalConfig`,
        docs/local-protocol.md).
    privacy_relation
        The neighbouring relation (:data:`RELATIONS`). ``"add-remove"`` (unset: the default with the hierarchy in
        global mode): two streams differ by everything one user did in an epoch, taking part at all included —
        nothing published depends on it but through noise: the release schedule is one release per tick whatever
        arrived, the released count is the pool block's noisy one, and the exact figures (counts, offsets, the
        ledger's summary) go to the operator's key only; the noise is calibrated to the larger of the add/remove and
        the replace difference, so the stated ``(epsilon, delta)`` holds for both. ``"replace"`` (the flat model,
        federated and local mode): two streams differ in what one user did, with the same arrivals (public).
    user_cap
        User level: release ticks per epoch one user may contribute to (local mode: reports per epoch of a device).
        Unset: :data:`DEFAULT_CAPS` by model (1 for the hierarchy, 8 for the flat model); without noise the
        hierarchy caps no one (``tree_ticks``).
    b_clip, item_clip
        The clip of one privacy unit's contribution per release tick (a user's tick at user level, one
        interaction at event level): its reward statistic ``sum r x`` to norm ``b_clip`` and its item rewards
        to norm ``item_clip``. Neighbours *replace* a unit's rewards and choices, so the release is calibrated
        to the difference ``2 b_clip`` and ``sqrt(2) item_clip`` (the item rewards are nonnegative). The
        defaults (1 and 1: sensitivities 2 and sqrt(2)) earned slightly more than clipping to half (the noise of
        sensitivity 1) on held-out LastFM events at every user-level epsilon (docs/privacy.md, "Privacy guarantees"). The per-unit baselines (ss-*, dgs-*) calibrate
        their own noise to whole interactions and clip at 1.
    cap_policy
        User level, a user at the cap: ``"ignore"`` (still served and logged, no longer learned from) or
        ``"reject"`` (``/feedback`` and ``/listen`` answer 403).
    user_budget
        Lifetime budget of one user: epsilon at the stack's ``delta`` over the user's whole history, every
        epoch (``inf``: none). User level, the fold stops learning from a user whose spent budget would exceed
        it (their events are counted as "not learned (budget)"); local mode, the device stops reporting before
        it would exceed it and the server refuses its reports past it; federated mode, each site's fold stops
        learning from its own users as the global mode's does. Unset: 10 at user level (the federated and local
        modes' default too), none at event level (``privacy_unit = event``, where k interactions cost k times
        one); :attr:`lifetime_budget` (docs/privacy.md, "A lifetime budget per user").
    default_pool
        Comma-separated arm ids that ``/recommend`` ranks when the request
        names no candidates (``None``: the catalog's default, the 25 most
        often logged LastFM artists or the first 25 synthetic arms). Checked
        against the catalog when the web server starts.
    namespace
        Prefix of every Redis key.
    kafka, redis_url
        External endpoints (``None``: the embedded services of ``privrec up``). Redis AUTH and TLS
        go in the URL (``rediss://user:password@host:port/0``).
    kafka_security_protocol, kafka_sasl_mechanism, kafka_sasl_username, kafka_sasl_password, kafka_ssl_cafile
        Kafka TLS and SASL (``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``; ``PLAIN`` or ``SCRAM-SHA-256/512``;
        the CA bundle that signs the brokers' certificates). Used by every Kafka client of the
        pipeline (:mod:`pipeline.config.kafkaconn`).
    partitions
        Partitions of the ``interactions`` topic.
    batch_size, batch_seconds
        Ingest batching: at most ``batch_size`` events or ``batch_seconds``.
    web_processes
        Processes of the HTTP server, all on one port (``SO_REUSEPORT``; the kernel spreads the
        connections); they share nothing but Redis and Kafka.
    """

    mode: str = "global"
    sites: int = 1
    site: int | None = None
    topology: str = "star"
    fed_schedule: str = "tick"
    consensus_kappa: float = 0.5
    local_algorithm: str | None = None
    local_mechanism: str = "blt-exact"
    local_capacity: int = 1023
    shuffle_batch: int | None = None
    local_codewords: int | None = None
    local_item_term: int = 0
    model: str | None = None
    hierarchy_shares: str | None = None
    algorithm: str = "linucb"
    mechanism: str = DEFAULT_MECHANISM
    epsilon: float = 2.0
    delta: float = 1e-5
    tick_seconds: float = 1.0
    tree_levels: int = 14
    catalog: str = "synthetic"
    graph: str = "clusters"
    data_dir: str | None = None
    catalog_units: int = 100
    d: int = 25
    n_users: int = 10
    n_arms: int = 1000
    world_seed: int = 0
    lambda_: float = 1.0
    alpha: float = 0.3
    noise_ridge: float = DEFAULT_NOISE_RIDGE
    prior_strength: float = 0.0
    prior_reward: float = 0.04
    item_weight: float | None = None
    listen_weight: float | None = None
    item_share: float = 0.5
    privacy_unit: str | None = None
    privacy_relation: str | None = None
    user_cap: int | None = None
    b_clip: float = B_CLIP
    item_clip: float = ITEM_CLIP
    cap_policy: str = "ignore"
    user_budget: float | None = None
    default_pool: str | None = None
    namespace: str = "privrec"
    kafka: str | None = None
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_sasl_mechanism: str = "PLAIN"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = None
    kafka_ssl_cafile: str | None = None
    redis_url: str | None = None
    partitions: int = 4
    batch_size: int = 2000
    batch_seconds: float = 0.05
    web_processes: int = 1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SettingsError("mode", f"must be one of {MODES}, got {self.mode!r}.")
        if not 1 <= self.sites <= 64:
            raise SettingsError("sites", f"must be an integer in [1, 64], got {self.sites}.")
        if self.site is not None and not 0 <= self.site < self.sites:
            raise SettingsError("site", f"must be in [0, {self.sites - 1}] (setting `sites` is {self.sites}), "
                                        f"got {self.site}.")
        if self.topology not in TOPOLOGIES and not os.path.isfile(self.topology):
            raise SettingsError("topology", f"must be one of {TOPOLOGIES} or the path of an edge-list file, "
                                            f"got {self.topology!r} (no such file).")
        if self.fed_schedule not in FED_SCHEDULES:
            raise SettingsError("fed_schedule", f"must be one of {FED_SCHEDULES}, got {self.fed_schedule!r}.")
        if not 0 < self.consensus_kappa <= 1:
            raise SettingsError("consensus_kappa", f"must be in (0, 1], got {self.consensus_kappa}.")
        if self.mode == "federated" and self.baseline is not None:
            raise SettingsError("algorithm", f"the federated mode runs linucb, colin or goblin (a site shares its "
                                             f"released statistics), got {self.algorithm!r}.")
        if self.algorithm not in ALGORITHMS:
            raise SettingsError("algorithm", f"must be one of {ALGORITHMS}, got {self.algorithm!r}.")
        self._resolve_local()
        self._resolve_model()
        self._check_local()
        if self.mechanism not in MECHANISMS:
            raise SettingsError("mechanism", f"must be one of {sorted(MECHANISMS)}, got {self.mechanism!r}.")
        if math.isnan(self.epsilon) or self.epsilon <= 0:
            raise SettingsError("epsilon", f"must be positive or inf, got {self.epsilon}.")
        if not 0 < self.delta < 1:
            raise SettingsError("delta", f"must be in (0, 1), got {self.delta}.")
        if not (self.tick_seconds > 0 and math.isfinite(self.tick_seconds)):
            raise SettingsError("tick_seconds", f"must be a positive number of seconds, got {self.tick_seconds}.")
        if not 1 <= self.tree_levels <= 40:
            raise SettingsError("tree_levels", f"must be in [1, 40], got {self.tree_levels}.")
        if self.catalog not in CATALOGS:
            if not os.path.isdir(self.catalog):
                raise SettingsError("catalog", f"must be one of {CATALOGS} or a catalog directory (holding "
                                               f"items.csv), got {self.catalog!r} (no such directory).")
            object.__setattr__(self, "catalog", os.path.abspath(self.catalog))  # the same for every process
        if not 1 <= self.catalog_units <= 1_000_000:
            raise SettingsError("catalog_units", f"must be an integer in [1, 1000000], got {self.catalog_units}.")
        if self.graph not in GRAPHS:
            raise SettingsError("graph", f"must be one of {GRAPHS}, got {self.graph!r}.")
        if self.graph == "users":
            if self.catalog != "lastfm":
                raise SettingsError("graph", "'users' applies to the LastFM catalog (the synthetic catalog already "
                                             "gives every user a model of their own).")
            if self.mode != "global":
                raise SettingsError("graph", f"'users' runs in global mode only, got mode {self.mode!r}.")
            if self.baseline is not None:
                raise SettingsError("graph", f"'users' runs linucb, colin or goblin, got {self.algorithm!r}.")
        for name in ("d", "n_users", "n_arms", "partitions", "batch_size"):
            if getattr(self, name) < 1:
                raise SettingsError(name, f"must be a positive integer, got {getattr(self, name)}.")
        if not (self.lambda_ > 0 and math.isfinite(self.lambda_)):
            raise SettingsError("lambda_", f"must be positive, got {self.lambda_}.")
        if not (self.alpha >= 0 and math.isfinite(self.alpha)):
            raise SettingsError("alpha", f"must be non-negative, got {self.alpha}.")
        if not (self.noise_ridge >= 0 and math.isfinite(self.noise_ridge)):
            raise SettingsError("noise_ridge", f"must be non-negative, got {self.noise_ridge}.")
        if not (self.prior_strength >= 0 and math.isfinite(self.prior_strength)):
            raise SettingsError("prior_strength", f"must be a non-negative number of pseudo-observations, got "
                                                  f"{self.prior_strength}.")
        if not (0 < self.prior_reward <= 1):  # NaN fails too
            raise SettingsError("prior_reward", f"must be in (0, 1] (an expected reward), got {self.prior_reward}.")
        if self.prior_strength and (self.algorithm != "linucb" or self.graph != "clusters"):
            raise SettingsError("prior_strength", f"a prior mean applies to --algorithm linucb with --graph clusters, "
                                                  f"got {self.algorithm!r} with {self.graph!r}.")
        if self.item_weight is not None and not (self.item_weight >= 0 and math.isfinite(self.item_weight)):
            raise SettingsError("item_weight", f"must be a non-negative number, got {self.item_weight}.")
        if self.listen_weight is not None and not 0 <= self.listen_weight <= 1:
            raise SettingsError("listen_weight", f"must be in [0, 1], got {self.listen_weight}.")
        if not 0 < self.item_share < 1:
            raise SettingsError("item_share", f"must be in (0, 1), got {self.item_share}.")
        for name in ("b_clip", "item_clip"):
            v = getattr(self, name)
            if not (0 < v <= 1 and math.isfinite(v)):
                raise SettingsError(name, f"must be in (0, 1] (a clip of contributions of norm <= 1), got {v}.")
        if self.privacy_unit is not None and self.privacy_unit not in PRIVACY_UNITS:
            raise SettingsError("privacy_unit", f"must be one of {PRIVACY_UNITS}, got {self.privacy_unit!r}.")
        if self.privacy_unit == "user" and self.baseline is not None:
            raise SettingsError("privacy_unit", f"the per-unit baselines ({self.algorithm}) are event level only; "
                                                f"use --privacy-unit event")
        if self.user_cap < 1 or (self.user_level and self.user_cap > self.tree_ticks):
            raise SettingsError("user_cap", f"must be in [1, {self.tree_ticks}] (the ticks of an epoch), got "
                                            f"{self.user_cap}.")
        if self.cap_policy not in CAP_POLICIES:
            raise SettingsError("cap_policy", f"must be one of {CAP_POLICIES}, got {self.cap_policy!r}.")
        if self.user_budget is not None and not self.user_budget > 0:  # NaN fails too
            raise SettingsError("user_budget", f"must be a positive epsilon or inf, got {self.user_budget}.")
        if self.privacy_unit == "user" and self.private and not self._user_level_mechanism:
            raise SettingsError("mechanism", f"user-level privacy needs a mechanism with a multi-participation "
                                             f"bound ({', '.join(USER_LEVEL_MECHANISMS)} and their user-* forms), got "
                                             f"{self.mechanism!r}; or use --privacy-unit event")
        if self.item_term and self.private and not self.mechanism.endswith("-exact"):
            raise SettingsError("mechanism", f"the item term composes two releases by exact Gaussian-DP accounting: "
                                             f"use an '-exact' mechanism or --item-weight 0, got {self.mechanism!r}.")
        if self.default_pool is not None:
            ids = [a.strip() for a in self.default_pool.split(",")]
            if not all(ids) or len(set(ids)) != len(ids) or len(ids) > MAX_DEFAULT_POOL:
                raise SettingsError("default_pool", f"must be 1 to {MAX_DEFAULT_POOL} distinct comma-separated arm "
                                                    f"ids, got {self.default_pool!r}.")
        if not self.namespace or any(c in self.namespace for c in "{}: \t\n*?[]"):
            raise SettingsError("namespace", f"must be a non-empty name without braces, colons, spaces or "
                                             f"glob characters, got {self.namespace!r}.")
        if self.kafka_security_protocol not in KAFKA_PROTOCOLS:
            raise SettingsError("kafka_security_protocol", f"must be one of {KAFKA_PROTOCOLS}, got "
                                                           f"{self.kafka_security_protocol!r}.")
        if self.kafka_sasl_mechanism not in KAFKA_SASL_MECHANISMS:
            raise SettingsError("kafka_sasl_mechanism", f"must be one of {KAFKA_SASL_MECHANISMS}, got "
                                                        f"{self.kafka_sasl_mechanism!r}.")
        if self.kafka_security_protocol.startswith("SASL") and not (self.kafka_sasl_username
                                                                    and self.kafka_sasl_password):
            raise SettingsError("kafka_sasl_username", f"{self.kafka_security_protocol} needs a user name and a "
                                                       f"password (PRIVREC_KAFKA_SASL_USERNAME, "
                                                       f"PRIVREC_KAFKA_SASL_PASSWORD).")
        if self.kafka_ssl_cafile is not None and not os.path.isfile(self.kafka_ssl_cafile):
            raise SettingsError("kafka_ssl_cafile", f"no such file: {self.kafka_ssl_cafile!r}.")
        if not 1 <= self.web_processes <= 64:
            raise SettingsError("web_processes", f"must be an integer in [1, 64], got {self.web_processes}.")
        if not self.batch_seconds > 0:
            raise SettingsError("batch_seconds", f"must be positive, got {self.batch_seconds}.")

    def _check_local(self) -> None:
        """The local mode's settings (checked whatever the mode, so a typo never waits for a mode switch)."""
        if self.local_algorithm not in LOCAL_ALGORITHMS:
            raise SettingsError("local_algorithm", f"must be one of {LOCAL_ALGORITHMS}, got {self.local_algorithm!r}.")
        from models.local.config import DEVICE_MECHANISMS

        if self.local_mechanism not in DEVICE_MECHANISMS:
            raise SettingsError("local_mechanism", f"must be one of {DEVICE_MECHANISMS} (a device releases its own "
                                                   f"vector: no user-* mixing), got {self.local_mechanism!r}.")
        if not 1 <= self.local_capacity <= (1 << 20):
            raise SettingsError("local_capacity", f"must be an integer in [1, {1 << 20}], got {self.local_capacity}.")
        if not 0 <= self.shuffle_batch <= 1_000_000:
            raise SettingsError("shuffle_batch", f"must be an integer in [0, 1000000] (0: no shuffler), got "
                                                 f"{self.shuffle_batch}.")
        if self.mode != "local":
            return
        if self.baseline is not None:
            raise SettingsError("algorithm", f"the local mode runs linucb, colin or goblin (devices report b_u), got "
                                             f"{self.algorithm!r}.")
        if math.isinf(self.epsilon):
            raise SettingsError("epsilon", "must be finite in local mode: a device that adds no noise would send its "
                                           "exact statistic (use --mode global --epsilon inf for a non-private run).")
        if self.privacy_unit == "user" and self.local_algorithm == "tree" and \
                self.local_mechanism not in USER_LEVEL_MECHANISMS:
            raise SettingsError("privacy_unit", f"user level on the device needs a device mechanism with a "
                                                f"multi-participation bound ({', '.join(USER_LEVEL_MECHANISMS)}), got "
                                                f"{self.local_mechanism!r}; or use --privacy-unit event")
        if self.local_codewords and not (self.shuffle_batch and 0 < self.local_codewords <= 4096
                                         and self.unit_in_force == "user"):
            raise SettingsError("local_codewords", f"must be in [1, 4096] with --shuffle-batch n > 0 at user level "
                                                   f"(the blanket's guarantee is central), got {self.local_codewords}.")
        if self.local_item_term not in (0, 1) or (self.local_item_term and not self.local_codewords):
            raise SettingsError("local_item_term", f"must be 0 or 1, and 1 needs --local-codewords set to the "
                                                   f"catalog's number of items, got {self.local_item_term}.")
        if self.local_codewords:  # the blanket's calibration must exist for this batch size (else: first report fails)
            from models.local.items import MAX_P, blanket_reaches, smallest_batch

            if not blanket_reaches(self.epsilon, self.delta, self.shuffle_batch, compositions=self.user_cap):
                need = smallest_batch(self.epsilon, self.delta, self.user_cap)
                raise SettingsError("shuffle_batch", f"{self.shuffle_batch} distinct users per batch are too few for "
                                                     f"--local-codewords: no blanket (fakes with probability up to "
                                                     f"{MAX_P:g}) makes {self.user_cap} batches (user_cap) of a "
                                                     f"device ({self.epsilon:g}, {self.delta:g})-DP; the smallest "
                                                     f"workable batch is {need} (or raise epsilon or delta, or lower "
                                                     f"user_cap).")
        if self.shuffle_batch and self.local_algorithm != "round":
            raise SettingsError("shuffle_batch", "shuffling applies to per-round reports: use --local-algorithm round "
                                                 "(a per-user continual release has no batch of one report per user)")

    def _resolve_local(self) -> None:
        """Local mode's protocol when unset: the variant that learns (:data:`LOCAL_DEFAULT`) — per-round reports,
        population-wide shuffled batches of at least 150 distinct users, listens as codewords of a public codebook of
        64 through a blanket of fakes, 2 reports per device and epoch (docs/local-protocol.md); the batch grows to the
        smallest the blanket can calibrate at the settings' epsilon. A synthetic world of fewer users than a batch
        keeps the per-user tree (nothing to hide among). Outside local mode: the device settings' old values (no
        shuffler, no codewords), which nothing reads."""
        local = self.mode == "local"
        # the synthetic world names its population: one too small to fill a shuffled batch keeps the per-user tree
        too_few = self.catalog == "synthetic" and self.n_users < LOCAL_DEFAULT["shuffle_batch"]
        if local and self.local_algorithm is None and too_few:
            object.__setattr__(self, "local_algorithm", "tree")
        default_variant = local and self.local_algorithm in (None, "round") and self.shuffle_batch is None \
            and self.local_codewords is None and self.privacy_unit in (None, "user") and self.private \
            and not too_few
        # privrec up makes the codebook the catalog itself (the item term) when the catalog has at most
        # MAX_CATALOG_CODEBOOK (1,024) items
        object.__setattr__(self, "local_defaulted", default_variant)
        if default_variant:
            if self.user_cap is None:
                object.__setattr__(self, "user_cap", LOCAL_DEFAULT["user_cap"])
            object.__setattr__(self, "local_codewords", LOCAL_DEFAULT["local_codewords"])
            batch = LOCAL_DEFAULT["shuffle_batch"]
            if 0 < self.delta < 1 and self.user_cap is not None and self.user_cap >= 1:
                from models.local.items import smallest_batch

                try:
                    batch = max(batch, smallest_batch(self.epsilon, self.delta, self.user_cap))
                except ValueError:
                    pass  # no batch can: the settings check below names the setting
            object.__setattr__(self, "shuffle_batch", batch)
            if self.catalog == "synthetic":
                object.__setattr__(self, "local_codewords", min(LOCAL_DEFAULT["local_codewords"], self.n_arms))
        if self.local_algorithm is None:
            object.__setattr__(self, "local_algorithm", "round" if local and default_variant else "tree")
        if self.shuffle_batch is None:
            object.__setattr__(self, "shuffle_batch", 0)
        if self.local_codewords is None:
            object.__setattr__(self, "local_codewords", 0)

    def _resolve_model(self) -> None:
        """Set ``model`` and ``user_cap`` when unset, and check that the model fits the other settings."""
        fits = (self.algorithm == "linucb" and self.graph == "clusters" and self.privacy_unit in (None, "user")
                and (self.mode == "global" or (self.mode == "local" and bool(self.local_codewords))))
        # a setting of the flat model's own (its mechanism, a fixed prior, the item term's weight) selects it
        flat_only = [name for name, on in (("mechanism", self.mechanism != DEFAULT_MECHANISM),
                                           ("prior_strength", bool(self.prior_strength)),
                                           ("item_weight", self.item_weight is not None)) if on]
        if self.model is None:
            object.__setattr__(self, "model", "hierarchy" if fits and not flat_only else "flat")
        elif self.model == "hierarchy" and flat_only:
            raise SettingsError(flat_only[0], f"applies to --model flat (the hierarchy brings its own mechanism, "
                                              f"prior and item rule: docs/hierarchy.md), got --model hierarchy")
        elif self.model not in MODELS:
            raise SettingsError("model", f"must be one of {MODELS}, got {self.model!r}.")
        elif self.model == "hierarchy" and not fits:
            raise SettingsError("model", f"the hierarchy serves linucb over model units (--graph clusters) at user "
                                         f"level in global mode, or local mode's population-wide codewords, got "
                                         f"algorithm {self.algorithm!r}, graph {self.graph!r}, mode {self.mode!r}, "
                                         f"privacy unit {self.privacy_unit!r}; use --model flat")
        if self.model == "hierarchy":
            if self.hierarchy_shares is not None:
                from models.streaming.hierarchy import parse_shares

                try:
                    parse_shares(self.hierarchy_shares)
                except ValueError as e:
                    raise SettingsError("hierarchy_shares", str(e)) from None
        elif self.hierarchy_shares is not None:
            raise SettingsError("hierarchy_shares", "applies to --model hierarchy")
        self._check_relation()
        if self.user_cap is None:
            cap = DEFAULT_CAPS[self.model] if self.mode != "local" else DEFAULT_CAPS["flat"]
            if self.model == "hierarchy" and self.mode == "global" and not self.private:
                cap = self.tree_ticks  # no noise: nothing to bound
            object.__setattr__(self, "user_cap", cap)

    def _check_relation(self) -> None:
        """``privacy_relation``: one of :data:`RELATIONS`; ``add-remove`` only where everything published can be
        calibrated under it (the hierarchy in global mode)."""
        if self.privacy_relation is None:
            return
        if self.privacy_relation not in RELATIONS:
            raise SettingsError("privacy_relation", f"must be one of {RELATIONS}, got {self.privacy_relation!r}.")
        if self.privacy_relation == "add-remove" and not (self.model == "hierarchy" and self.mode == "global"):
            why = ("the server sees which devices send reports" if self.mode == "local" else
                   "the flat model (and every federated site) publishes the exact Gram of the shown lists and each "
                   "unit's exact count, which change with whether a user took part")
            raise SettingsError("privacy_relation", f"add-remove needs the hierarchy in global mode (--model "
                                                    f"hierarchy, --mode global): {why}; use --privacy-relation "
                                                    f"replace (docs/privacy.md)")

    @property
    def relation(self) -> str:
        """The neighbouring relation in force: ``privacy_relation``, or when unset ``add-remove`` for the hierarchy in
        global mode (nothing it publishes depends on participation but through noise) and ``replace`` elsewhere."""
        if self.privacy_relation is not None:
            return self.privacy_relation
        return "add-remove" if self.model == "hierarchy" and self.mode == "global" else "replace"

    @property
    def add_remove(self) -> bool:
        return self.relation == "add-remove"

    @property
    def hierarchy(self) -> bool:
        return self.model == "hierarchy"

    def local_config(self, d: int) -> Any:
        """Local mode: the devices' public calibration (:class:`models.local.LocalConfig`) for contexts of length ``d``."""
        from models.local import LocalConfig

        return LocalConfig(algorithm=self.local_algorithm, d=d, epsilon=self.epsilon, delta=self.delta,
                           mechanism=self.local_mechanism, capacity=self.local_capacity,
                           shuffle_batch=self.shuffle_batch, unit=self.unit_in_force, cap=self.user_cap,
                           epoch_seconds=self.tree_ticks * self.tick_seconds, user_budget=self.lifetime_budget,
                           codewords=self.local_codewords)

    @property
    def default_pool_ids(self) -> list[str] | None:
        """The ``default_pool`` setting as a list of arm ids (``None``: the catalog's default)."""
        return None if self.default_pool is None else [a.strip() for a in self.default_pool.split(",")]

    @property
    def _user_level_mechanism(self) -> bool:
        return any(self.mechanism == m or self.mechanism == f"user-{m}" for m in USER_LEVEL_MECHANISMS)

    @property
    def unit_in_force(self) -> str:
        """``privacy_unit``, or when unset: ``user`` (in federated mode too: each site folds, caps and budgets its
        own users as the global mode does); ``event`` for the per-unit baselines and for mechanisms without a
        multi-participation bound (e.g. the papers' ``paper``; in local mode, the device's ``local_mechanism``)."""
        if self.privacy_unit is not None:
            return self.privacy_unit
        if self.model == "hierarchy":  # its own mechanism, with a multi-participation bound
            return "user"
        if self.mode == "local":  # the device's mechanism decides (a per-round report always composes)
            return "user" if self.local_algorithm == "round" or self.local_mechanism in USER_LEVEL_MECHANISMS \
                else "event"
        if self.baseline is not None or not self._user_level_mechanism:
            return "event"
        return "user"

    @property
    def user_level(self) -> bool:
        return self.unit_in_force == "user"

    @property
    def lifetime_budget(self) -> float:
        """``user_budget`` in force: as set, else :data:`DEFAULT_USER_BUDGET` at user level and ``inf`` (none) at
        event level — there a user's k interactions cost k times one (group privacy; a local-mode tree device at
        the default epsilon 2 would reach 10 after 3 reports), so a budget is the operator's explicit choice."""
        if self.user_budget is not None:
            return self.user_budget
        return DEFAULT_USER_BUDGET if self.user_level else math.inf

    @property
    def item_term_weight(self) -> float:
        """The item term's weight in force (0: off): ``item_weight``, or by catalog when unset.

        Off for the per-unit baselines (their own mechanisms), in federated mode (sites release the bandit
        statistic only) and for the hierarchy (its item level is released and weighed by its own rule).
        """
        if self.baseline is not None or self.mode in ("federated", "local") or self.model == "hierarchy":
            return 0.0  # (the hierarchy releases the item counts as a level of its own)
        if self.item_weight is not None:
            return self.item_weight
        # on wherever its release composes exactly with the bandit's (an '-exact' mechanism, or no noise)
        return 1.0 if self.mechanism.endswith("-exact") or not self.private else 0.0

    @property
    def item_term(self) -> bool:
        return self.item_term_weight > 0

    @property
    def listen_weight_in_force(self) -> float:
        if self.listen_weight is not None:
            return self.listen_weight
        return 1.0 if self.private else 0.2

    @property
    def clips(self) -> tuple[float, float]:
        """``(b_clip, item_clip)`` in force: the settings, or ``(1, 1)`` for the per-unit baselines."""
        if self.baseline is not None:
            return 1.0, 1.0
        return self.b_clip, self.item_clip

    def epsilons(self) -> tuple[float, float]:
        """``(bandit epsilon, item epsilon)``: the split of ``epsilon`` when the item term is on."""
        from models.accounting import split_epsilon

        if not self.item_term or not self.private:
            return self.epsilon, self.epsilon
        return split_epsilon(self.epsilon, self.delta, self.item_share)

    @property
    def private(self) -> bool:
        """Whether released statistics carry noise."""
        return not math.isinf(self.epsilon)

    @property
    def tree_ticks(self) -> int:
        return (1 << self.tree_levels) - 1

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, environ: Mapping[str, str] | None = None) -> Settings:
        """Build from explicit values (flags; ``None`` = unset) over environment variables over defaults."""
        env = os.environ if environ is None else environ
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            raw = values.get(f.name)
            if raw is None:
                raw = env.get(env_name(f.name))
            if raw is None:
                continue
            kwargs[f.name] = _convert(f.name, f.type, raw)
        return cls(**kwargs)

    @property
    def baseline(self) -> str | None:
        """The ``models.policies.baselines`` name of a baseline algorithm (``None`` for linucb / colin / goblin)."""
        return BASELINE_ALGORITHMS.get(self.algorithm)

    def model_config(self) -> dict[str, Any]:
        """The settings that define the model and its privacy (must match across workers).

        A baseline records its own mechanism (the ``mechanism`` setting does not apply to it).
        """
        d = dataclasses.asdict(self)
        out = {k: d[k] for k in MODEL_FIELDS}
        if self.baseline is not None:
            out["mechanism"] = self.baseline
        if self.graph == "clusters":  # the default, as namespaces made before the setting existed recorded it
            del out["graph"]
        if not self.local_codewords:  # likewise
            del out["local_codewords"]
        if not self.local_item_term:  # likewise
            del out["local_item_term"]
        if not self.prior_strength:  # likewise: no prior, and then its reward does not matter
            del out["prior_strength"], out["prior_reward"]
        if self.model == "flat":  # likewise (namespaces made before the hierarchy existed were flat)
            del out["model"]
        if self.hierarchy_shares is None:
            del out["hierarchy_shares"]
        out["privacy_relation"] = self.relation
        if out["privacy_relation"] == "replace":  # likewise (namespaces made before the setting existed)
            del out["privacy_relation"]
        return out

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


#: ``user_budget`` at user level when unset: epsilon over a user's whole history (docs/privacy.md: why 10).
DEFAULT_USER_BUDGET = 10.0

#: The most arms ``default_pool`` may name (one /recommend scores them all).
MAX_DEFAULT_POOL = 1000

MODEL_FIELDS = ("mode", "model", "hierarchy_shares", "privacy_relation", "local_algorithm", "local_mechanism", "local_capacity", "shuffle_batch", "local_codewords", "local_item_term", "sites", "topology", "fed_schedule", "consensus_kappa", "item_weight", "listen_weight",
                "item_share", "privacy_unit", "user_cap", "b_clip", "item_clip", "algorithm", "mechanism", "epsilon", "delta", "tree_levels", "catalog", "graph", "d", "n_users",
                "n_arms", "world_seed", "lambda_", "alpha", "noise_ridge", "prior_strength", "prior_reward", "partitions")


def _convert(name: str, typ: Any, raw: Any) -> Any:
    t = str(typ)
    try:
        if "float" in t:
            return float(raw)
        if "int" in t:
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            return int(raw)
    except (TypeError, ValueError):
        raise SettingsError(name, f"must be a number, got {raw!r}.") from None
    return str(raw)


#: What ``--help`` says beyond the environment variable and the default.
_HELP = {
    "default_pool": "comma-separated arm ids that /recommend ranks when a request names no candidates "
                    "(default: the catalog's 25 most often logged LastFM artists, or the first 25 synthetic arms)",
    "algorithm": "one of: linucb, colin, goblin (released through --mechanism); the other papers' private "
                 "LinUCB variants, per-unit, with their own mechanism and width (--mechanism does not apply): "
                 "ss-gaussian, ss-gaussian-tight, ss-wishart (Shariff & Sheffet, joint DP, contexts protected "
                 "too), dgs-laplace, dgs-gaussian (dynamic global sensitivity; claimed guarantee, not a proof)",
    "topology": "federated mode: star (a coordinator), ring, complete, or the path of an edge-list file "
                "(one 'i j' pair of sites per line)",
    "local_algorithm": "local mode: 'tree' (each device releases its own b_u through its own mechanism) or 'round' "
                       "(one noisy r x per interaction)",
    "prior_strength": "pseudo-observations of a public prior mean of theta (linucb; 0: off): the catalog's mean "
                      "context scaled to score --prior-reward; no privacy cost (docs/public-prior.md)",
    "prior_reward": "with --prior-strength: the expected reward of an average recommendation (LastFM: 1/25)",
    "model": "hierarchy (the default for linucb over units at user level in global mode: public prior -> pooled -> "
             "units -> items, docs/hierarchy.md) or flat (the papers' per-unit ridge regression with the item term)",
    "hierarchy_shares": "with --model hierarchy: shares of the budget (mu**2) as pool=0.05,items=0.95,units=0 "
                        "(default: a rule on the catalog's public size, docs/hierarchy.md)",
    "privacy_relation": "add-remove (the default with the hierarchy in global mode: whether a user took part at all is "
                        "protected, arrivals and counts included; the release schedule is one release per tick) or "
                        "replace (what a user did is protected, their arrivals public; the only relation of the flat "
                        "model, federated and local mode); docs/privacy.md",
    "user_cap": "user level: release ticks per epoch one user contributes to (default: 1 with the hierarchy, 8 with "
                "the flat model; local mode: reports per epoch of a device)",
    "local_codewords": "local mode with shuffling at user level: K > 0 sends listens as codewords of a public "
                       "codebook of K with a blanket of fakes, population-wide batches (docs/local-protocol.md)",
    "local_item_term": "local mode with codewords: 1 makes the codebook the catalog itself (--local-codewords = its "
                       "number of items, at most 4096): messages name items, and their histogram is also served as "
                       "the item term at no extra privacy cost (docs/local-protocol.md)",
    "shuffle_batch": "local mode with --local-algorithm round: n > 0 shuffles batches of n distinct users' reports; "
                     "--epsilon is then the central guarantee of a batch",
    "fed_schedule": "federated mode: share every release tick ('tick') or at ticks 1, 2, 4, ... ('doubling')",
    "catalog": "'synthetic', 'lastfm', or a catalog directory (items.csv, optional users.csv, edges.csv, "
               "events.csv; see docs/own-data.md)",
    "catalog_units": "catalog directory: clusters of edges.csv, or units of the public rule SHA-256(user) mod "
                     "units that also places every user the catalog does not list",
    "graph": "LastFM: 'clusters' (the 100 friend-graph clusters share models) or 'users' (a model per user, the "
             "friend graph as a sparse relation, solved matrix-free; global mode)",
    "mechanism": "continual-release mechanism of linucb/colin/goblin, one of: " + ", ".join(sorted(MECHANISMS))
                 + " (ignored by the ss-*/dgs-* algorithms)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one ``--flag`` per setting (default ``None``: fall back to the environment)."""
    for f in fields(Settings):
        flag = "--" + f.name.rstrip("_").replace("_", "-")
        about = _HELP.get(f.name)
        parser.add_argument(flag, dest=f.name, default=None, metavar=f.name.rstrip("_").upper(),
                            help=(f"{about} " if about else "") + f"(env {env_name(f.name)}; default {f.default!r})")
