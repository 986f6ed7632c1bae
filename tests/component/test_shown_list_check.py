"""The shown-list rule of ingest (pure code): which feedback events may enter the statistics."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.config.settings import Settings
from pipeline.ingestion.ingest import _reason_class
from pipeline.ingestion.shown_lists import NO_REC_ID, REASON_PREFIXES, rec_id_required, shown_refusal

SHOWN = ["0", "1", "2", "3"]
STORED = json.dumps({"rec_id": "r0", "user": "0", "items": SHOWN, "model_version": 3, "ts": 1.7e12}).encode()
GENUINE = {"event_id": "r0:fb", "user": "0", "arm": "2", "reward": 1, "rec_id": "r0", "shown": SHOWN}


@pytest.mark.parametrize("require", [True, False], ids=["required", "optional"])
def test_the_genuine_feedback_is_accepted(require: bool) -> None:
    assert shown_refusal(GENUINE, STORED, require_rec_id=require) is None


@pytest.mark.parametrize(("change", "stored", "prefix"), [
    ({"shown": ["2"]}, STORED, "shown list differs"),  # the forged one-item list: the Gram would name the choice
    ({"shown": ["3", "2", "1", "0"]}, STORED, "shown list differs"),  # order is part of what was shown
    ({"shown": SHOWN + ["4"]}, STORED, "shown list differs"),
    ({"shown": None}, STORED, "shown list missing"),
    ({"user": "1"}, STORED, "rec_id issued to another user"),
    ({"arm": "9", "shown": ["9"]}, STORED, "arm not in the recorded list"),
    ({}, None, "unknown rec_id"),  # never issued, or expired
    ({"rec_id": 7}, STORED, "unknown rec_id"),  # not a string: no key of the server's
], ids=["forged_one_item", "reordered", "extended", "missing", "other_user", "arm_outside", "unknown", "not_string"])
def test_a_list_the_server_did_not_record_is_refused(change: dict[str, Any], stored: bytes | None,
                                                     prefix: str) -> None:
    event = {k: v for k, v in (GENUINE | change).items() if v is not None}
    for require in (True, False):  # a named rec_id is checked whatever the model
        reason = shown_refusal(event, stored, require_rec_id=require)
        assert reason is not None and reason.startswith(prefix), reason
        assert _reason_class(reason) == prefix  # counted under its own label in the dead-letter ledger


def test_an_event_without_rec_id_is_refused_exactly_where_the_model_requires_one() -> None:
    raw = {"event_id": "e0", "user": "0", "arm": "0", "reward": 1, "shown": ["0"]}
    assert shown_refusal(raw, None, require_rec_id=True) == NO_REC_ID
    assert shown_refusal(raw | {"rec_id": None}, None, require_rec_id=True) == NO_REC_ID
    assert shown_refusal(raw, None, require_rec_id=False) is None
    assert _reason_class(NO_REC_ID) == "no server-issued rec_id"
    assert "POST /feedback" in NO_REC_ID and "exact Gram" in NO_REC_ID


@pytest.mark.parametrize(("values", "required"), [
    ({"model": "flat", "epsilon": "2"}, True),  # the exact Gram of shown lists is released
    ({"model": "flat", "epsilon": "2", "privacy_unit": "event"}, True),
    ({"model": "flat", "epsilon": "inf"}, False),  # no privacy: nothing to protect
    ({}, False),  # the default model, the hierarchy: no Gram released
    ({"epsilon": "inf"}, False),
    ({"algorithm": "colin", "epsilon": "2"}, True),  # the hierarchy does not fit colin: the flat model
], ids=["flat_private", "flat_event_level", "flat_no_privacy", "hierarchy", "hierarchy_no_privacy", "colin_flat"])
def test_rec_id_required_follows_the_model_in_force(values: dict[str, str], required: bool) -> None:
    s = Settings.from_mapping(values, environ={})
    assert s.hierarchy is (not values.get("model") == "flat" and values.get("algorithm") is None)
    assert rec_id_required(s) is required


def test_every_refusal_prefix_has_its_own_label() -> None:
    assert [_reason_class(p + ": x") for p in REASON_PREFIXES] == list(REASON_PREFIXES)
