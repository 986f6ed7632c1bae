"""Settings of a privrec pipeline, from flags and environment variables.

Every setting has a flag (``--epsilon``) and an environment variable
(``PRIVREC_EPSILON``); flags win. The Kafka and Redis endpoints also read
the conventional ``KAFKA_BOOTSTRAP`` and ``REDIS_URL``. Invalid settings fail
at start with a message naming the setting (:class:`SettingsError`).

Each setting is declared once, as a field of :class:`Settings` made by
:func:`pipeline.config.fields.setting`: its type, default, group, help and
whether it defines the model. The flags (:func:`add_arguments`),
:data:`MODEL_FIELDS` and the generated files (``privrec settings --write``:
``deploy/privrec.env.example``, ``deploy/k8s/configmap.yaml``,
``docs/settings.md``, the table of every setting) all come from that declaration.

The settings that define the model and its privacy (:data:`MODEL_FIELDS`:
algorithm, mechanism, epsilon, delta, tree size, catalog, dimensions, lambda,
alpha, ...) are stored in Redis when a namespace is first used; a worker
started later with different values is refused, since mixing them would break
the privacy accounting.

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
from models.mechanisms.participation import B_CLIP, ITEM_CLIP, USER_LEVEL_MECHANISMS

from . import fields as declaration
from .fields import env_name, setting

__all__ = ["Settings", "SettingsError", "add_arguments", "env_name", "MODEL_FIELDS", "DEFAULT_USER_BUDGET",
           "DEFAULT_MECHANISM", "DEFAULT_NOISE_RIDGE", "ALGORITHMS", "BASELINE_ALGORITHMS"]

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
#: The setting behind each parameter of :class:`models.local.LocalConfig` (:meth:`Settings.local_config`), so that
#: its errors name the setting.
LOCAL_PARAMETERS = {"algorithm": "local_algorithm", "d": "d", "epsilon": "epsilon", "delta": "delta",
                    "mechanism": "local_mechanism", "capacity": "local_capacity", "shuffle_batch": "shuffle_batch",
                    "unit": "privacy_unit", "cap": "user_cap", "epoch_seconds": "tick_seconds",
                    "user_budget": "user_budget", "codewords": "local_codewords"}


class SettingsError(ValueError):
    """A setting is invalid; the message names it (flag and environment variable)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"setting `{name}` ({env_name(name)}): {message}")
        self.setting = name


@dataclass(frozen=True)
class Settings:
    """All pipeline settings, each declared once below (see the module docstring for sources and checks).

    ``docs/settings.md`` is the table of them all, generated from these declarations. Settings left unset
    (``None``) are resolved when the object is made (``model``, ``user_cap``, the local protocol); the
    properties below give the values in force where a rule decides (:attr:`unit_in_force`,
    :attr:`relation`, :attr:`lifetime_budget`, :attr:`item_term_weight`, ...).
    """

    # --- connections ---------------------------------------------------------------------------------------------
    namespace: str = setting(
        "privrec", group="connections",
        help="prefix of every Redis key and part of the consumer-group names")
    kafka: str | None = setting(
        None, group="connections", secret=True, example="kafka:9092", example_set=True,
        help="bootstrap host:port of the Kafka cluster, or a comma-separated list (unset: the embedded broker of "
             "privrec up)")
    kafka_security_protocol: str = setting(
        "PLAINTEXT", group="connections", choices=KAFKA_PROTOCOLS,
        help="Kafka security, for every Kafka client of the pipeline (pipeline.config.kafkaconn); the embedded "
             "broker is plaintext on loopback")
    kafka_sasl_mechanism: str = setting(
        "PLAIN", group="connections", choices=KAFKA_SASL_MECHANISMS,
        help="SASL mechanism, used with the SASL_* protocols")
    kafka_sasl_username: str | None = setting(
        None, group="connections", secret=True,
        help="SASL user name (required with SASL_*, e.g. privrec)")
    kafka_sasl_password: str | None = setting(
        None, group="connections", secret=True,
        help="SASL password (required with SASL_*; keep it in a secret, not in a settings file)")
    kafka_ssl_cafile: str | None = setting(
        None, group="connections",
        help="CA bundle that signs the brokers' certificates (SSL, SASL_SSL; e.g. /etc/ssl/certs/kafka-ca.pem; "
             "unset: the system's)")
    redis_url: str | None = setting(
        None, group="connections", secret=True, example="redis://redis:6379/0", example_set=True,
        help="Redis, with appendonly persistence; AUTH and TLS go in the URL (rediss://user:password@host:port/0); "
             "unset: the embedded redis-server of privrec up")
    partitions: int = setting(
        4, group="connections", model=True,
        help="partitions of the `interactions` topic: create the topic with exactly this many; run at most this "
             "many workers (each needs a partition)")

    # --- the model and its privacy -------------------------------------------------------------------------------
    mode: str = setting(
        "global", group="model", model=True, choices=MODES,
        help="trust model: global (the server adds the noise), federated (sites keep their users' raw data and "
             "share only releases, see pipeline.modes.federated) or local (each user's device adds the noise and "
             "sends only reports, docs/local-protocol.md)")
    model: str | None = setting(
        None, group="model", model=True, choices=MODELS, example="hierarchy",
        help="the serving model: hierarchy (the default for linucb over units at user level in global mode: public "
             "prior -> pooled -> units -> items, docs/hierarchy.md) or flat (the papers' per-unit ridge regression "
             "with the item term)",
        notes="The hierarchy releases a pooled block, the item counts and, where the population is large enough, "
              "each unit's block, and is served by models.streaming.hierarchy.solve_hierarchy; it is also local "
              "mode's model with population-wide codewords. The flat model is released through `mechanism` and "
              "serves every other algorithm, mode and graph. Unset: the hierarchy wherever it fits and no setting "
              "of the flat model's own (`mechanism`, `prior_strength`, `item_weight`) is set.")
    hierarchy_shares: str | None = setting(
        None, group="model", model=True, example="",
        help="with --model hierarchy: the blocks' shares of the budget (mu**2) as pool=0.05,items=0.95,units=0 "
             "(unset: the rule of models.streaming.hierarchy.default_shares, from the catalog's public size)")
    algorithm: str = setting(
        "linucb", group="model", model=True, choices=ALGORITHMS,
        help="linucb (one model per unit), colin or goblin, released through --mechanism; or one of the other "
             "papers' private LinUCB variants, per-unit, with their own mechanism and width (--mechanism does not "
             "apply): ss-gaussian, ss-gaussian-tight, ss-wishart (Shariff & Sheffet, joint DP, contexts protected "
             "too), dgs-laplace, dgs-gaussian (dynamic global sensitivity; claimed guarantee, not a proof)",
        notes="ss-gaussian / ss-gaussian-tight run a Gaussian tree over the augmented Gram matrix (paper / exact "
              "calibration), ss-wishart a shifted Wishart tree; the dgs-* variants add noise to theta. Their stored "
              "model config records the baseline's own mechanism (BASELINE_ALGORITHMS).")
    mechanism: str = setting(
        DEFAULT_MECHANISM, group="model", model=True, choices=tuple(sorted(MECHANISMS)),
        help="continual-release mechanism of linucb / colin / goblin (ignored by the ss-* / dgs-* algorithms, "
             "which bring their own); the default was the best measured in privrec experiment mechanisms; paper is "
             "the papers' calibration, not a valid proof")
    epsilon: float = setting(
        2.0, group="model", model=True,
        help="privacy of every released statistic (per user and epoch at user level, per interaction at event "
             "level); inf switches noise off (the non-private baseline)")
    delta: float = setting(
        1e-5, group="model", model=True,
        help="the delta of (epsilon, delta)-DP, in (0, 1)")
    tree_levels: int = setting(
        14, group="model", model=True,
        help="levels of each release tree: a tree covers 2**tree_levels - 1 ticks, then a new epoch starts",
        notes="Baselines: each unit's tree is sized for 2**tree_levels - 1 of that unit's own releases, with the "
              "paper's level count for that many leaves.")
    catalog: str = setting(
        "synthetic", group="model", model=True,
        help="synthetic (the paper's synthetic users and arms), lastfm, or a catalog directory (items.csv, optional "
             "users.csv, edges.csv, events.csv; docs/own-data.md), stored absolute so every process reads the same")
    catalog_units: int = setting(
        100, group="model",
        help="catalog directory: clusters of edges.csv, or units of the public rule SHA-256(user) mod units that "
             "also places every user the catalog does not list")
    graph: str = setting(
        "clusters", group="model", model=True, choices=GRAPHS,
        help="LastFM: clusters (the 100 friend-graph clusters share models; a dense dN x dN solve at N = 100) or "
             "users (a model per user, 1,892 of them, the friend graph as a sparse relation, solved matrix-free; "
             "global mode, linucb / colin / goblin)",
        notes="With `users`, CoLin's relation is the column-normalised A + I and GOB.Lin's I + L, solved by "
              "conjugate gradients (models.streaming.sparse).")
    data_dir: str | None = setting(
        None, group="model", example="/data/lastfm-2k",
        help="LastFM data directory (HetRec 2011 files; non-commercial terms: mount it, never bake it in; unset: "
             "the default next to the repo)")
    d: int = setting(
        25, group="model", model=True,
        help="synthetic catalog: context dimension (LastFM fixes d = 25 and 100 user clusters)")
    n_users: int = setting(
        10, group="model", model=True,
        help="synthetic catalog: users")
    n_arms: int = setting(
        1000, group="model", model=True,
        help="synthetic catalog: arms")
    world_seed: int = setting(
        0, group="model", model=True,
        help="synthetic catalog: the public seed of its construction")
    lambda_: float = setting(
        1.0, group="model", model=True,
        help="ridge weight of the serving models")
    alpha: float = setting(
        0.3, group="model", model=True,
        help="exploration width of the serving models (ss-* use Shariff & Sheffet's own per-unit width, Prop. 4; "
             "dgs-* use the constant alpha, their papers' practice)")
    noise_ridge: float = setting(
        DEFAULT_NOISE_RIDGE, group="model", model=True,
        help="kappa of the noise-scaled ridge (linucb / colin / goblin): serving models are solved with "
             "lambda + kappa * s, s the release's noise std (public); 0 keeps lambda fixed; no effect without noise",
        notes="Tuned on held-out seeds by `privrec experiment mechanisms`.")
    prior_strength: float = setting(
        0.0, group="model", model=True,
        help="pseudo-observations of a public prior mean of theta (linucb; 0: off): the catalog's mean context "
             "scaled to score --prior-reward; no privacy cost (docs/public-prior.md: 10000 chosen on held-out "
             "LastFM events)",
        notes="Serving models are M = (G + (lambda + kappa * noise_std + s) I)^-1, theta = M (b + s theta_0) "
              "(models.streaming.solve.public_prior): post-processing of the public catalog.")
    prior_reward: float = setting(
        0.04, group="model", model=True,
        help="with --prior-strength: the expected reward of an average recommendation (LastFM's one item of 25: "
             "0.04)")
    item_weight: float | None = setting(
        None, group="model", model=True,
        help="the flat model's item term: each candidate's score gets item_weight / (1 + (s / 2)**2) * pop_a, "
             "pop_a the item's privately released reward sum, s that release's noise std (unset: 1 with an -exact "
             "mechanism or no noise, else 0; 0 releases no item sums and gives the bandit the whole budget)",
        notes="The item sums are released through blt-exact beside the bandit statistic. The hierarchy weighs its "
              "item level by the release's own noise instead; the baselines, federated and local mode have no item "
              "term.")
    listen_weight: float | None = setting(
        None, group="model", model=True,
        help="weight in [0, 1] of an organic listen (POST /listen) in the bandit statistic; it always counts in "
             "the item sums (unset: 1 with noise, 0.2 without, chosen on held-out LastFM events)")
    item_share: float = setting(
        0.5, group="model", model=True,
        help="with the item term: the bandit's share of the budget (of mu**2 in Gaussian DP); the item sums get "
             "the rest; together exactly (epsilon, delta)-DP (exact mechanisms only)")
    privacy_unit: str | None = setting(
        None, group="model", model=True, choices=PRIVACY_UNITS,
        help="user (each user's history per epoch is protected; the default for linucb / colin / goblin with a "
             "mechanism that has a multi-participation bound, in every mode) or event (each interaction alone; a "
             "user with k interactions gets the group bound; the per-unit baselines are event level only)",
        notes="At user level each user's interactions within one release tick are summed and clipped (b to norm "
              "b_clip, the item rewards to item_clip) before they enter the statistics, each user contributes to at "
              "most user_cap ticks per epoch, and the noise is calibrated so that a capped user's whole history in "
              "an epoch is (epsilon, delta)-DP (models.mechanisms.participation). Federated mode: each site folds "
              "its own users' ticks, caps them and keeps their ledger and lifetime budget. Local mode: each device "
              "makes at most user_cap reports per epoch (tree_levels and tick_seconds), calibrates its noise to them "
              "and stops at user_budget (models.local.LocalConfig, docs/local-protocol.md).")
    privacy_relation: str | None = setting(
        None, group="model", model=True, choices=RELATIONS,
        help="add-remove (the default with the hierarchy in global mode: whether a user took part at all is "
             "protected, arrivals and counts included; the release schedule is one release per tick) or replace "
             "(what a user did is protected, their arrivals public; the only relation of the flat model, federated "
             "and local mode); docs/privacy.md",
        notes="Under add-remove nothing published depends on participation but through noise: one release per "
              "tick whatever arrived, the released count is the pool block's noisy one, and the exact figures "
              "(counts, offsets, the ledger's summary) go to the operator's key only; the noise is calibrated to the "
              "larger of the add/remove and the replace difference, so the stated (epsilon, delta) holds for both.")
    user_cap: int | None = setting(
        None, group="model", model=True,
        help="user level: release ticks per epoch one user may contribute to (unset: 1 with the hierarchy, 8 with "
             "the flat model, none without noise for the hierarchy; local mode: reports per epoch of a device)")
    b_clip: float = setting(
        B_CLIP, group="model", model=True,
        help="the clip of one privacy unit's tick (a user's tick, or one interaction at event level) of the reward "
             "statistic b, in (0, 1]; the noise is calibrated to the difference of two replacing contributions, "
             "2 x b_clip",
        notes="The defaults of b_clip and item_clip (sensitivities 2 and sqrt(2)) earned slightly more than "
              "clipping to half on held-out LastFM events at every user-level epsilon (docs/privacy.md, \"Privacy "
              "guarantees\"). The per-unit baselines calibrate their own noise to whole interactions and clip at 1.")
    item_clip: float = setting(
        ITEM_CLIP, group="model", model=True,
        help="the clip of one privacy unit's tick of item rewards, in (0, 1]; calibrated to sqrt(2) x item_clip "
             "(the item rewards are nonnegative)")
    cap_policy: str = setting(
        "ignore", group="model", choices=CAP_POLICIES,
        help="user level, a user at the cap: ignore (still served and logged, no longer learned from) or reject "
             "(/feedback and /listen answer 403)")
    user_budget: float | None = setting(
        None, group="model",
        help="lifetime budget of one user: epsilon at the stack's delta over the user's whole history, every epoch "
             "(inf: none); then not learned from (unset: 10 at user level, in every mode; none at event level)",
        notes="User level, the fold stops learning from a user whose spent budget would exceed it (their events "
              "are counted as \"not learned (budget)\"); local mode, the device stops reporting before it would "
              "exceed it and the server refuses its reports past it; federated mode, each site's fold stops "
              "learning from its own users. At event level k interactions cost k times one, so a budget there is "
              "the operator's explicit choice (docs/privacy.md, \"A lifetime budget per user\").")

    # --- local mode ----------------------------------------------------------------------------------------------
    local_algorithm: str | None = setting(
        None, group="local", model=True, choices=LOCAL_ALGORITHMS,
        help="local mode: tree (each device releases its own b_u through its own continual-release mechanism, "
             "LDP-CoLin / LDP-GOBLin) or round (one noisy r x per interaction, the LDP bandits paper's reduction); "
             "unset in local mode: round with population-wide shuffled codewords, the variant that learns "
             "(docs/local-protocol.md), or tree for a synthetic world too small to fill a batch")
    local_mechanism: str = setting(
        "blt-exact", group="local", model=True,
        help="local mode, tree: the devices' continual-release mechanism (any mechanism name without user-: a "
             "device releases its own vector)")
    local_capacity: int = setting(
        1023, group="local", model=True,
        help="local mode, tree: reports per epoch of a device's mechanism")
    shuffle_batch: int | None = setting(
        None, group="local", model=True,
        help="local mode, round: n > 0 shuffles batches of n distinct users' reports, stripped of who sent them "
             "(0: no shuffler); epsilon is then the central guarantee of a batch (Feldman, McMillan & Talwar)")
    local_codewords: int | None = setting(
        None, group="local", model=True,
        help="local mode with shuffling at user level: K > 0 sends each listen as its codeword in a public codebook "
             "of K codewords of the catalog's features, with a blanket of fake codewords, in population-wide "
             "batches (0: Laplace reports per unit; docs/local-protocol.md)")
    local_item_term: int = setting(
        0, group="local", model=True, choices=(0, 1),
        help="local mode with codewords: 1 makes the codebook the catalog itself (--local-codewords = its number of "
             "items, at most 4096): messages name items, and their histogram is also served as the item term at no "
             "extra privacy cost (docs/local-protocol.md)")

    # --- federated mode ------------------------------------------------------------------------------------------
    sites: int = setting(
        1, group="federated", model=True,
        help="federated mode: the number of sites M, in [1, 64]; unit u belongs to site u mod M (public and stable)")
    site: int | None = setting(
        None, group="federated",
        help="federated mode: which site this worker is (privrec up sets it per site worker; unset for the web "
             "process and the coordinator)")
    topology: str = setting(
        "star", group="federated", model=True,
        help="federated mode: star (a coordinator sums the sites' releases and serves everyone), ring or complete "
             "(decentralized: each site mixes its neighbours' states and serves its own users), or the path of an "
             "edge-list file (one 'i j' pair of sites per line)")
    fed_schedule: str = setting(
        "tick", group="federated", model=True, choices=FED_SCHEDULES,
        help="federated mode: share every release tick (tick) or at ticks 1, 2, 4, 8, ... (doubling, the federated "
             "paper's schedule)")
    consensus_kappa: float = setting(
        0.5, group="federated", model=True,
        help="decentralized federated mode: step kappa of the mixing matrix P = I - (kappa / d_max) L, in (0, 1] "
             "(0.5 converges on every graph)")

    # --- operations ----------------------------------------------------------------------------------------------
    tick_seconds: float = setting(
        1.0, group="operations",
        help="release period of the leader timer, in seconds (local mode: the leader looks every "
             "min(tick_seconds, 0.25) s and releases each folded batch then, at no privacy cost)")
    batch_size: int = setting(
        2000, group="operations",
        help="ingest batching: at most this many events per poll")
    batch_seconds: float = setting(
        0.05, group="operations",
        help="ingest batching: wait at most this long for a batch, in seconds")
    web_processes: int = setting(
        1, group="operations",
        help="processes of the HTTP server, all on one port (SO_REUSEPORT; the kernel spreads the connections), in "
             "[1, 64]; they share nothing but Redis and Kafka")
    default_pool: str | None = setting(
        None, group="operations", example="",
        help="comma-separated arm ids that /recommend ranks when a request names no candidates, e.g. 289,89,190 "
             "(unset: the catalog's 25 most often logged LastFM artists, or the first 25 synthetic arms); checked "
             "against the catalog when the web server starts")

    def __post_init__(self) -> None:
        """Check every setting and resolve the unset ones, in this order: each setting alone (its choices, then its
        range), then the rules between settings, mode by mode."""
        self._check_choices()
        self._check_federated()
        self._resolve_local()
        self._resolve_model()
        self._check_local()
        self._check_numbers()
        self._check_privacy()
        self._check_connections()

    def _check_choices(self) -> None:
        """Every setting declared with ``choices`` holds one of them (or is unset)."""
        for f, meta in declaration.declared(type(self)):
            value = getattr(self, f.name)
            if meta.choices is not None and value is not None and value not in meta.choices:
                raise SettingsError(f.name, f"must be one of {meta.choices}, got {value!r}.")

    def _check_federated(self) -> None:
        """The federated mode's settings (checked whatever the mode) and the algorithms it runs."""
        if not 1 <= self.sites <= 64:
            raise SettingsError("sites", f"must be an integer in [1, 64], got {self.sites}.")
        if self.site is not None and not 0 <= self.site < self.sites:
            raise SettingsError("site", f"must be in [0, {self.sites - 1}] (setting `sites` is {self.sites}), "
                                        f"got {self.site}.")
        if self.topology not in TOPOLOGIES and not os.path.isfile(self.topology):
            raise SettingsError("topology", f"must be one of {TOPOLOGIES} or the path of an edge-list file, "
                                            f"got {self.topology!r} (no such file).")
        if not 0 < self.consensus_kappa <= 1:
            raise SettingsError("consensus_kappa", f"must be in (0, 1], got {self.consensus_kappa}.")
        if self.mode == "federated" and self.baseline is not None:
            raise SettingsError("algorithm", f"the federated mode runs linucb, colin or goblin (a site shares its "
                                             f"released statistics), got {self.algorithm!r}.")

    def _check_local(self) -> None:
        """The local mode's settings: each alone whatever the mode (so a typo never waits for a mode switch); in local
        mode, the devices' calibration as :class:`models.local.LocalConfig` checks it, its errors naming the setting
        (:data:`LOCAL_PARAMETERS`)."""
        from models.local.config import DEVICE_MECHANISMS, LocalConfigError

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
        try:
            self.local_config(self.d).check_runnable()
        except LocalConfigError as e:
            raise SettingsError(LOCAL_PARAMETERS[e.parameter], str(e)) from None
        if self.local_item_term and not self.local_codewords:
            raise SettingsError("local_item_term", f"must be 0 or 1, and 1 needs --local-codewords set to the "
                                                   f"catalog's number of items, got {self.local_item_term}.")

    def _check_numbers(self) -> None:
        """The model's numeric settings, each in its range, and the catalog and graph that fit them."""
        if math.isnan(self.epsilon) or self.epsilon <= 0:
            raise SettingsError("epsilon", f"must be positive or inf, got {self.epsilon}.")
        if not 0 < self.delta < 1:
            raise SettingsError("delta", f"must be in (0, 1), got {self.delta}.")
        if not (self.tick_seconds > 0 and math.isfinite(self.tick_seconds)):
            raise SettingsError("tick_seconds", f"must be a positive number of seconds, got {self.tick_seconds}.")
        if not 1 <= self.tree_levels <= 40:
            raise SettingsError("tree_levels", f"must be in [1, 40], got {self.tree_levels}.")
        self._check_catalog()
        for name in ("d", "n_users", "n_arms", "partitions", "batch_size"):
            if getattr(self, name) < 1:
                raise SettingsError(name, f"must be a positive integer, got {getattr(self, name)}.")
        for name, low in (("lambda_", "positive"), ("alpha", "non-negative"), ("noise_ridge", "non-negative")):
            v = getattr(self, name)
            if not ((v > 0 if low == "positive" else v >= 0) and math.isfinite(v)):
                raise SettingsError(name, f"must be {low}, got {v}.")
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

    def _check_catalog(self) -> None:
        """``catalog``: a name or a directory (made absolute, the same for every process); ``graph = users`` only where
        it gives a model per user that the catalog does not already."""
        if self.catalog not in CATALOGS:
            if not os.path.isdir(self.catalog):
                raise SettingsError("catalog", f"must be one of {CATALOGS} or a catalog directory (holding "
                                               f"items.csv), got {self.catalog!r} (no such directory).")
            object.__setattr__(self, "catalog", os.path.abspath(self.catalog))
        if not 1 <= self.catalog_units <= 1_000_000:
            raise SettingsError("catalog_units", f"must be an integer in [1, 1000000], got {self.catalog_units}.")
        if self.graph == "users":
            if self.catalog != "lastfm":
                raise SettingsError("graph", "'users' applies to the LastFM catalog (the synthetic catalog already "
                                             "gives every user a model of their own).")
            if self.mode != "global":
                raise SettingsError("graph", f"'users' runs in global mode only, got mode {self.mode!r}.")
            if self.baseline is not None:
                raise SettingsError("graph", f"'users' runs linucb, colin or goblin, got {self.algorithm!r}.")

    def _check_privacy(self) -> None:
        """The privacy unit, its cap and budget, and the mechanism that can give them."""
        if self.privacy_unit == "user" and self.baseline is not None:
            raise SettingsError("privacy_unit", f"the per-unit baselines ({self.algorithm}) are event level only; "
                                                f"use --privacy-unit event")
        if self.user_cap < 1 or (self.user_level and self.user_cap > self.tree_ticks):
            raise SettingsError("user_cap", f"must be in [1, {self.tree_ticks}] (the ticks of an epoch), got "
                                            f"{self.user_cap}.")
        if self.user_budget is not None and not self.user_budget > 0:  # NaN fails too
            raise SettingsError("user_budget", f"must be a positive epsilon or inf, got {self.user_budget}.")
        if self.privacy_unit == "user" and self.private and not self._user_level_mechanism:
            raise SettingsError("mechanism", f"user-level privacy needs a mechanism with a multi-participation "
                                             f"bound ({', '.join(USER_LEVEL_MECHANISMS)} and their user-* forms), got "
                                             f"{self.mechanism!r}; or use --privacy-unit event")
        if self.item_term and self.private and not self.mechanism.endswith("-exact"):
            raise SettingsError("mechanism", f"the item term composes two releases by exact Gaussian-DP accounting: "
                                             f"use an '-exact' mechanism or --item-weight 0, got {self.mechanism!r}.")

    def _check_connections(self) -> None:
        """The namespace, the Kafka security, the serving pool and the processes."""
        if self.default_pool is not None:
            ids = [a.strip() for a in self.default_pool.split(",")]
            if not all(ids) or len(set(ids)) != len(ids) or len(ids) > MAX_DEFAULT_POOL:
                raise SettingsError("default_pool", f"must be 1 to {MAX_DEFAULT_POOL} distinct comma-separated arm "
                                                    f"ids, got {self.default_pool!r}.")
        if not self.namespace or any(c in self.namespace for c in "{}: \t\n*?[]"):
            raise SettingsError("namespace", f"must be a non-empty name without braces, colons, spaces or "
                                             f"glob characters, got {self.namespace!r}.")
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
        # MAX_CATALOG_CODEBOOK (4,096) items
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

#: The settings that define the model and its privacy (declared with ``model=True``): stored with the namespace,
#: and a worker with other values is refused (:meth:`Settings.model_config`).
MODEL_FIELDS = tuple(f.name for f, meta in declaration.declared(Settings) if meta.model)


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


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Add one ``--flag`` per setting, with its declared help (default ``None``: fall back to the environment)."""
    declaration.add_arguments(parser, Settings)
