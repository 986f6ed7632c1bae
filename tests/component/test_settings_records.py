"""Pipeline settings and the strict event parser (pure code, no services)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipeline.data.catalog import SyntheticCatalog, load_catalog
from pipeline.data.records import MalformedEvent, dead_letter_value, parse_interaction
from pipeline.config.settings import Settings, SettingsError


def test_flags_override_environment_over_defaults() -> None:
    env = {"PRIVREC_EPSILON": "5", "PRIVREC_ALGORITHM": "goblin", "KAFKA_BOOTSTRAP": "h:1", "REDIS_URL": "redis://x"}
    s = Settings.from_mapping({"epsilon": "0.5", "algorithm": None}, environ=env)
    assert s.epsilon == 0.5 and s.algorithm == "goblin" and s.kafka == "h:1" and s.redis_url == "redis://x"
    assert Settings.from_mapping({}, environ={}).mechanism == "user-blt-exact"
    assert not Settings.from_mapping({"epsilon": "inf"}, environ={}).private


@pytest.mark.parametrize(
    ("values", "setting"),
    [
        ({"mode": "hybrid"}, "mode"),
        ({"mode": "local", "epsilon": "inf"}, "epsilon"),
        ({"mode": "local", "local_algorithm": "tree", "shuffle_batch": "10"}, "shuffle_batch"),
        ({"local_algorithm": "gossip"}, "local_algorithm"),
        ({"mode": "local", "algorithm": "ss-gaussian"}, "algorithm"),
        ({"algorithm": "ucb"}, "algorithm"),
        ({"mechanism": "magic"}, "mechanism"),
        ({"epsilon": "0"}, "epsilon"),
        ({"epsilon": "nan"}, "epsilon"),
        ({"epsilon": "two"}, "epsilon"),
        ({"delta": "1"}, "delta"),
        ({"tick_seconds": "0"}, "tick_seconds"),
        ({"tree_levels": "0"}, "tree_levels"),
        ({"catalog": "movielens"}, "catalog"),
        ({"graph": "friends"}, "graph"),
        ({"graph": "users"}, "graph"),  # the synthetic catalog: every user is a unit already
        ({"graph": "users", "catalog": "lastfm", "mode": "federated", "privacy_unit": "event"}, "graph"),
        ({"graph": "users", "catalog": "lastfm", "algorithm": "ss-gaussian"}, "graph"),
        ({"d": "0"}, "d"),
        ({"partitions": "2.5"}, "partitions"),
        ({"lambda_": "-1"}, "lambda_"),
        ({"alpha": "-0.1"}, "alpha"),
        ({"namespace": "a:b"}, "namespace"),
        ({"default_pool": "1,,2"}, "default_pool"),
        ({"default_pool": "1,2,1"}, "default_pool"),
        ({"default_pool": ",".join(map(str, range(1001)))}, "default_pool"),
    ],
)
def test_invalid_settings_name_the_setting(values: dict[str, str], setting: str) -> None:
    with pytest.raises(SettingsError) as exc:
        Settings.from_mapping(values, environ={})
    assert exc.value.setting == setting
    assert f"`{setting}`" in str(exc.value)


def test_invalid_environment_variable_is_named_too() -> None:
    with pytest.raises(SettingsError, match=r"PRIVREC_TICK_SECONDS"):
        Settings.from_mapping({}, environ={"PRIVREC_TICK_SECONDS": "-3"})


def test_default_pool_is_configurable_and_checked_against_the_catalog() -> None:
    base = {"d": "3", "n_users": "2", "n_arms": "30"}
    assert list(load_catalog(Settings.from_mapping(base, environ={})).default_pool) == [str(a) for a in range(25)]
    s = Settings.from_mapping({**base, "default_pool": " 7, 3 ,29"}, environ={})
    assert list(load_catalog(s).default_pool) == ["7", "3", "29"]
    with pytest.raises(SettingsError, match=r"`default_pool`.*unknown arm '30'") as exc:
        load_catalog(Settings.from_mapping({**base, "default_pool": "7,30"}, environ={}))
    assert exc.value.setting == "default_pool"


@pytest.fixture(scope="module")
def cat() -> SyntheticCatalog:
    return SyntheticCatalog(n_users=3, d=4, n_arms=10, seed=0)


def _ev(**kw: object) -> bytes:
    base: dict[str, object] = {"event_id": "e", "user": "1", "arm": "3", "reward": 0.5}
    base.update(kw)
    return json.dumps(base).encode()


def test_valid_events_parse_with_catalog_or_explicit_context(cat: SyntheticCatalog) -> None:
    p = parse_interaction(_ev(), cat)
    assert p.unit == 1 and p.reward == 0.5 and p.user == "1"
    np.testing.assert_array_equal(p.context, cat.feature_matrix[3])
    q = parse_interaction(_ev(context=[3.0, 4.0, 0.0, 0.0], arm="new-item"), cat)
    np.testing.assert_allclose(q.context, [0.6, 0.8, 0.0, 0.0])  # clipped to norm 1
    r = parse_interaction(_ev(context=[0.1, 0.0, 0.0, 0.0]), cat)
    np.testing.assert_array_equal(r.context, [0.1, 0.0, 0.0, 0.0])  # inside the bound: unchanged
    assert parse_interaction(_ev(reward=1), cat).reward == 1.0 and parse_interaction(_ev(reward=0), cat).reward == 0.0


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{oops", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"17", "not a JSON object"),
        (json.dumps({"user": "1", "arm": "3", "reward": 1}).encode(), "missing field(s): event_id"),
        (_ev(user=""), "field 'user' must be a non-empty string"),
        (_ev(user=7), "field 'user' must be a non-empty string"),
        (_ev(reward=True), "reward must be a number"),
        (_ev(reward="1"), "reward must be a number"),
        (b'{"event_id": "e", "user": "1", "arm": "3", "reward": Infinity}', "is not finite"),
        (_ev(reward=-0.1), "outside [0, 1]"),
        (_ev(reward=2), "outside [0, 1]"),
        (_ev(user="99"), "unknown user '99'"),
        (_ev(arm="zzz"), "unknown arm 'zzz'"),
        (_ev(context=[1, 2]), "context has 2 values, expected d = 4"),
        (_ev(context=[1, "a", 0, 0]), "context must be a list of numbers"),
        (_ev(context=[1, True, 0, 0]), "context must be a list of numbers"),
        (b'{"event_id": "e", "user": "1", "arm": "3", "reward": 1, "context": [NaN, 0, 0, 0]}', "NaN or infinite"),
        (_ev(ts="yesterday"), "ts must be a finite number"),
        (_ev(user="1" * 129), "field 'user' has 129 characters, at most 128 (MAX_ID_CHARS)"),
        (_ev(arm="3" * 10_000), "field 'arm' has 10000 characters, at most 128"),
        (_ev(rec_id="r" * 129), "field 'rec_id' has 129 characters, at most 128"),
    ],
)
def test_malformed_events_are_refused_with_a_reason(raw: bytes, reason: str, cat: SyntheticCatalog) -> None:
    with pytest.raises(MalformedEvent) as exc:
        parse_interaction(raw, cat)
    assert reason in str(exc.value)


def test_id_limit_is_the_stacks_one_at_ingest_and_on_the_devices(cat: SyntheticCatalog) -> None:
    """Ingest takes an id of exactly MAX_ID_CHARS characters as far as the id rule goes (here: an unknown user);
    local reports carry the same limit (models cannot import the pipeline: a second constant, pinned here)."""
    from models.local.reports import MAX_ID_CHARS as REPORT_LIMIT
    from pipeline.data.records import MAX_ID_CHARS

    assert REPORT_LIMIT == MAX_ID_CHARS == 128
    with pytest.raises(MalformedEvent, match="unknown user"):
        parse_interaction(_ev(user="1" * MAX_ID_CHARS, rec_id="r" * MAX_ID_CHARS), cat)


def test_dead_letter_value_keeps_the_original_bytes() -> None:
    d = json.loads(dead_letter_value(b"\xff\x00", "not JSON", "interactions", 2, 40))
    assert d["original_encoding"] == "base64" and d["partition"] == 2 and d["offset"] == 40
    t = json.loads(dead_letter_value(b'{"a": 1}', "missing", "interactions", 0, 1))
    assert t["original"] == '{"a": 1}' and t["original_encoding"] == "utf-8" and not math.isnan(t["offset"])


def test_kafka_security_settings_reach_every_client(tmp_path) -> None:
    """SASL/TLS settings: validated, and turned into aiokafka options (pipeline.config.kafkaconn)."""
    from pipeline.config.kafkaconn import client_kwargs, faust_credentials

    with pytest.raises(SettingsError, match="needs a user name and a password"):
        Settings(kafka="k:9093", kafka_security_protocol="SASL_SSL")
    with pytest.raises(SettingsError, match="kafka_security_protocol"):
        Settings(kafka_security_protocol="TLS")
    with pytest.raises(SettingsError, match="no such file"):
        Settings(kafka_ssl_cafile=str(tmp_path / "missing.pem"))
    s = Settings(kafka="k:9093", kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="SCRAM-SHA-512",
                 kafka_sasl_username="u", kafka_sasl_password="p")
    kw = client_kwargs(s)
    assert kw["security_protocol"] == "SASL_SSL" and kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kw["sasl_plain_username"] == "u" and kw["ssl_context"] is not None
    assert faust_credentials(s).mechanism.value == "SCRAM-SHA-512"
    assert faust_credentials(Settings()) is None
