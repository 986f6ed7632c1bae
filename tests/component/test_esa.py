"""Encode-shuffle-analyze without services: sealing, envelopes, contents, the sealed shuffler, the analyzer's opening.

The Python/WebCrypto interoperability is in ``tests/browser/test_seal_interop.py``; the parties against the real
broker, redis-server and processes in ``tests/integration/test_local_shuffler.py``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from models.local import LocalConfig, LocalReport, ReportError
from models.local.esa import (SealedBatch, SealedShuffler, parse_content, parse_envelope, report_content,
                              seal_report)
from models.local.seal import OVERHEAD, POINT_BYTES, AnalyzerKey, SealError, b64decode, b64encode, seal
from pipeline.modes.local.esa import open_batch, parties

KEY = AnalyzerKey.generate()
PK = KEY.public_bytes()


def _report(user: str = "7", version: int = 1, m: tuple[float, ...] = (0.5, -1.25)) -> LocalReport:
    return LocalReport(user, version, "round", f"r-{user}-{version}", list(m))


def test_seal_round_trip_and_every_ciphertext_differs() -> None:
    plain = report_content(_report())
    a, b = seal(PK, plain), seal(PK, plain)
    assert a != b and a[:POINT_BYTES] != b[:POINT_BYTES]  # a fresh ephemeral key per message
    assert len(a) == len(plain) + OVERHEAD
    assert KEY.open(a) == KEY.open(b) == plain
    assert plain not in a  # the content is not in the clear


@pytest.mark.parametrize("where", ["point", "nonce", "ciphertext", "tag"])
def test_a_changed_byte_anywhere_fails_authentication(where: str) -> None:
    sealed = bytearray(seal(PK, b'{"m": [1.0]}'))
    at = {"point": 40, "nonce": POINT_BYTES + 3, "ciphertext": POINT_BYTES + 12 + 2, "tag": len(sealed) - 1}[where]
    sealed[at] ^= 0x01
    with pytest.raises(SealError, match="authentication failed|not a point of P-256"):
        KEY.open(bytes(sealed))


def test_another_key_or_truncated_bytes_are_refused_with_the_reason() -> None:
    sealed = seal(PK, b"x" * 10)
    with pytest.raises(SealError, match="authentication failed"):
        AnalyzerKey.generate().open(sealed)
    with pytest.raises(SealError, match="must be more than"):
        KEY.open(sealed[:OVERHEAD])
    with pytest.raises(SealError, match="public key"):
        seal(PK[:-1], b"x")
    assert AnalyzerKey.from_pem(KEY.to_pem()).open(sealed) == b"x" * 10  # the PEM round trip keeps the key


def test_envelope_carries_identity_and_sealed_content_only() -> None:
    env = seal_report(_report(), PK)
    body = env.to_dict()
    assert set(body) == {"schema", "user", "version", "rec_id", "sealed"}
    assert "0.5" not in json.dumps(body)  # the vector is not in the clear
    back = parse_envelope(env.to_json())
    assert back == env
    assert parse_content(KEY.open(back.sealed), d=2, algorithm="round").tolist() == [0.5, -1.25]


def test_a_user_level_envelope_carries_the_reports_epoch_in_the_clear() -> None:
    import dataclasses

    env = seal_report(dataclasses.replace(_report(), epoch=7), PK)
    assert env.to_dict()["epoch"] == 7  # the shuffler checks the cap per epoch from it
    assert parse_envelope(env.to_json()) == env


@pytest.mark.parametrize("change, parameter", [
    ({"epoch": -1}, "epoch"),
    ({"epoch": "7"}, "epoch"),
    ({"epoch": True}, "epoch"),
    ({"sealed": None}, "sealed"),
    ({"sealed": "***"}, "sealed"),
    ({"sealed": b64encode(b"\x04" + b"\x00" * 100)}, "sealed"),  # the ephemeral "point" is not on the curve
    ({"sealed": b64encode(b"short")}, "sealed"),
    ({"m": [0.5, 1.0]}, "m"),  # the contents in the clear
    ({"reward": 1}, "reward"),
    ({"shown": ["a"]}, "shown"),  # added by the shuffler, never by a device
    ({"version": 0}, "version"),
    ({"user": ""}, "user"),
    ({"schema": "privrec.LocalReport/2"}, "schema"),
])
def test_malformed_envelopes_name_the_field(change: dict[str, object], parameter: str) -> None:
    body = {**seal_report(_report(), PK).to_dict(), **change}
    with pytest.raises(ReportError) as err:
        parse_envelope(json.dumps(body))
    assert err.value.parameter == parameter


@pytest.mark.parametrize("content, parameter", [
    ({"schema": "privrec.ReportContent/1", "algorithm": "round", "m": [1.0, 2.0], "user": "7"}, "user"),
    ({"schema": "privrec.ReportContent/1", "algorithm": "round", "m": [1.0, 2.0], "rec_id": "r"}, "rec_id"),
    ({"schema": "privrec.ReportContent/1", "algorithm": "round", "m": [1.0]}, "m"),
    ({"schema": "privrec.ReportContent/1", "algorithm": "tree", "m": [1.0, 2.0]}, "algorithm"),
    ({"schema": "privrec.ReportContent/1", "algorithm": "round", "m": [1.0, float("nan")]}, "m"),
    ({"schema": "other", "algorithm": "round", "m": [1.0, 2.0]}, "schema"),
])
def test_contents_that_would_link_or_are_malformed_are_refused(content: dict[str, object], parameter: str) -> None:
    with pytest.raises(ReportError) as err:
        parse_content(json.dumps(content).encode(), d=2, algorithm="round")
    assert err.value.parameter == parameter


def test_the_sealed_shuffler_batches_distinct_users_and_strips_identity() -> None:
    cfg = LocalConfig(algorithm="round", d=2, epsilon=2.0, shuffle_batch=3)
    sh = SealedShuffler(cfg)
    envs = [seal_report(_report(u, v, (float(i), 1.0)), PK).with_shown((f"i{i}", f"j{i}"))
            for i, (u, v) in enumerate([("a", 1), ("a", 2), ("b", 1), ("c", 1), ("b", 2), ("d", 1)])]
    out = []
    for e in envs:
        out += sh.add_envelope(e, unit=4)
    # a's second report waits for batch 2 (one report per user per batch), which b's second and d's close
    assert len(out) == 2 and sh.open_users(4) == []
    assert [e.user for e in sh.just_closed] == ["a", "b", "c", "a", "b", "d"]
    for batch, members in zip(out, ([0, 2, 3], [1, 4, 5])):
        assert Counter(batch.sealed) == Counter(envs[i].sealed for i in members)
        assert Counter(batch.items) == Counter(a for i in members for a in envs[i].shown)
    batch = out[0]
    text = batch.to_json().decode()
    assert all(f'"{k}"' not in text for k in ("user", "version", "rec_id"))
    assert SealedBatch.parse(batch.to_json()) == batch


def test_the_analyzer_opens_a_batch_and_dead_letters_what_does_not_open() -> None:
    cfg = LocalConfig(algorithm="round", d=2, epsilon=2.0, shuffle_batch=4)
    good = [seal(PK, report_content(_report(str(i), m=(float(i), 2.0)))) for i in range(2)]
    raw = SealedBatch(2, 1, ["a", "b"], good, 2.0, 1e-5).to_json()
    opened = open_batch(raw, KEY, cfg)
    assert opened.batch is not None and opened.batch.n == 2 and opened.batch.unit == 2 and opened.failed == []
    assert sorted(opened.batch.vectors) == [[0.0, 2.0], [1.0, 2.0]]
    wrong_key = seal(AnalyzerKey.generate().public_bytes(), report_content(_report("x")))
    linking = seal(PK, json.dumps({"schema": "privrec.ReportContent/1", "algorithm": "round", "m": [1.0, 1.0],
                                   "user": "9"}).encode())
    raw = SealedBatch(2, 1, ["a", "b", "c", "d"], [good[0], wrong_key, good[1], linking], 2.0, 1e-5).to_json()
    opened = open_batch(raw, KEY, cfg)
    assert opened.batch is None  # all or nothing: which items were the failed contents' cannot be told
    reasons = dict(opened.failed)
    assert len(opened.failed) == 4 and set(reasons) == {good[0], good[1], wrong_key, linking}
    assert "authentication failed" in reasons[wrong_key] and "user" in reasons[linking]
    assert all("not counted: 2 of the 4 contents of batch 1 of unit 2 did not open" in reasons[g] for g in good)
    with pytest.raises(ValueError, match="sealed batch"):
        open_batch(b'{"schema": "privrec.SealedBatch/1", "unit": -1}', KEY, cfg)


def test_each_partys_guarantee() -> None:
    cfg = LocalConfig(algorithm="round", d=25, epsilon=2.0, shuffle_batch=200)
    sep = parties(cfg, separate=True)
    assert sep["analyzer_operator"]["epsilon"] == 2.0 and sep["analyzer_operator"]["delta"] == 1e-5
    assert sep["colluding"]["epsilon"] == pytest.approx(cfg.epsilon0) and cfg.epsilon0 > 2.0
    assert sep["shuffler_operator"]["epsilon"] == 0.0 and "no content" in sep["shuffler_operator"]["kind"]
    inside = parties(cfg, separate=False)
    assert inside["analyzer_operator"]["epsilon"] == pytest.approx(cfg.epsilon0)
    assert np.isclose(inside["everyone_else"]["epsilon"], 2.0)


def test_the_stacks_key_is_made_once_owner_only_and_kept(tmp_path: Path) -> None:
    from pipeline.modes.local.esa import analyzer_key, create_keys, public_description

    priv, pub = create_keys(tmp_path, shuffler_url="http://127.0.0.1:1")
    assert priv.stat().st_mode & 0o077 == 0 and priv.parent.stat().st_mode & 0o077 == 0
    first = analyzer_key({"PRIVREC_ANALYZER_KEY": str(priv)})
    assert first is not None
    create_keys(tmp_path, shuffler_url="http://127.0.0.1:2")  # a restart: the key stays, the URL is new
    again = analyzer_key({"PRIVREC_ANALYZER_KEY": str(priv)})
    assert again is not None and again.public_bytes() == first.public_bytes()
    desc = public_description({"PRIVREC_ESA_PUBLIC": str(pub)})
    assert desc is not None and desc["shuffler"] == "http://127.0.0.1:2/submit"
    assert b64decode(desc["public_key"]) == first.public_bytes()
    assert analyzer_key({}) is None and public_description({}) is None


def test_a_tampered_content_adds_nothing_to_the_aggregate_not_even_its_shown_items() -> None:
    """Three devices' lists of distinct items; the shuffler's batch carries all their items (one multiset) and
    their sealed contents, one of them tampered in transit. The aggregate must not take the tampered report's
    list into its Gram (before the fix it did: a list with no vector behind it, as if rewarded 0 noise-free)."""
    from models.local.analyzer import Analyzer, Batches

    cfg = LocalConfig(algorithm="round", d=2, epsilon=2.0, shuffle_batch=3)
    contexts = {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [0.6, 0.8], "e": [0.8, -0.6], "f": [-1.0, 0.0], "g": [0, -1.0]}
    shown = [("a", "b"), ("c", "e"), ("f", "g")]
    sh = SealedShuffler(cfg)
    envs = [seal_report(_report(u, 1, (float(i), 1.0)), PK).with_shown(lists)
            for i, (u, lists) in enumerate(zip("xyz", shown))]
    (batch,) = [b for e in envs for b in sh.add_envelope(e, unit=0)]
    tampered = bytearray(envs[1].sealed)
    tampered[-1] ^= 1  # the GCM tag no longer matches
    blobs = [bytes(tampered) if s == envs[1].sealed else s for s in batch.sealed]
    raw = SealedBatch(batch.unit, batch.seq, batch.items, blobs, batch.epsilon, batch.delta).to_json()
    opened = open_batch(raw, KEY, cfg)
    an = Analyzer(cfg, 1, lambda items: np.array([contexts[i] for i in items]))
    agg = an.init_state()
    if opened.batch is not None:
        agg, _ = an.step(agg, Batches([(0, opened.batch)]))
    failed_list = np.array([contexts[i] for i in shown[1]])
    counted = int(agg.count[0])
    # whatever counts, the Gram holds exactly the lists of the counted contents, never the tampered one's
    assert counted < 3
    counted_lists = [np.array([contexts[i] for i in lst]) for lst in shown if lst != shown[1]] if counted else []
    expected = sum((X.T @ X for X in counted_lists), np.zeros((2, 2)))
    np.testing.assert_allclose(agg.gram[0], expected, rtol=0, atol=1e-12)
    assert not np.allclose(agg.gram[0], expected + failed_list.T @ failed_list)
    reasons = dict(opened.failed)
    assert "authentication failed" in reasons[bytes(tampered)] and len(reasons) == 3
