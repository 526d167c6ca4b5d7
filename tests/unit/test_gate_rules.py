"""Promotion gates as pure functions: each gate's outcome, and a failed gate turning a promotion into a refusal."""

from __future__ import annotations

import pytest

from tasks.domain.gates import GateSettings, SliceScore, class_drop_gate, evaluate_gates, floor_gate, newest_slice_gate
from tasks.domain.promotion import apply_gates, decide_promotion, parse_per_class, per_class_tag

NAMES = ("a", "b", "c")


def test_class_drop_names_the_worst_class_and_fails_only_beyond_the_limit():
    gate = class_drop_gate([0.9, 0.5, 0.9], [0.8, 0.8, 0.8], NAMES, max_drop=0.1)
    assert not gate.passed and gate.tag()[0] == "gate.max_class_drop"
    assert "class 'b' 50.00% vs champion's 80.00%" in gate.detail and "drop +0.3000" in gate.detail
    assert class_drop_gate([0.7, 0.7, 0.7], [0.8, 0.8, 0.8], NAMES, max_drop=0.1).passed  # exactly the limit
    assert class_drop_gate([0.1, 0.1, 0.1], None, NAMES, max_drop=0.0).passed  # no champion to compare
    assert not class_drop_gate([0.9, 0.9], [0.8, 0.8, 0.8], NAMES[:2], max_drop=0.5).passed  # other classes


def test_floor_and_newest_slice():
    assert floor_gate(0.85, 0.85).passed and not floor_gate(0.84, 0.85).passed
    reported = newest_slice_gate(SliceScore("week-3", 0.2, 40), None)
    assert (
        reported.passed and reported.outcome == "reported" and "20.00% on 40 test images of week-3" in reported.detail
    )
    gated = newest_slice_gate(SliceScore("week-3", 0.2, 40), 0.5)
    assert not gated.passed and gated.outcome == "failed"
    assert newest_slice_gate(None, 0.5).passed  # no newest batch: nothing to hold against the model


def test_a_failed_gate_refuses_a_promotion_the_margin_allowed_and_names_itself():
    margin = decide_promotion(0.90, 0.85, champion_version="3", min_margin=0.01)
    assert margin.promote
    gates = evaluate_gates(GateSettings(max_class_drop=0.05), [0.95, 0.6, 0.95], [0.85, 0.85, 0.85], NAMES, 0.90)
    decision = apply_gates(margin, gates)
    assert not decision.promote and decision.failed_gates() == ["max_class_drop"]
    assert "refused by gate max_class_drop" in decision.reason and decision.reason.endswith("champion kept")
    tags = decision.tags()
    assert tags["gate.margin"].startswith("passed: test accuracy 0.9000 vs champion version 3's 0.8500")
    assert tags["gate.max_class_drop"].startswith("failed: largest drop: class 'b'")
    assert tags["gate.newest_slice"].startswith("reported: no newest batch")
    assert tags["promotion_decision"] == "kept_champion"


def test_gates_that_pass_leave_the_decision_and_the_margin_still_decides():
    passing = evaluate_gates(GateSettings(max_class_drop=0.05, min_accuracy=0.5), [0.9] * 3, [0.88] * 3, NAMES, 0.9)
    promoted = apply_gates(decide_promotion(0.90, 0.88, "1"), passing)
    assert promoted.promote and [g.name for g in promoted.gates] == [
        "margin",
        "max_class_drop",
        "min_accuracy",
        "newest_slice",
    ]
    kept = apply_gates(decide_promotion(0.80, 0.88, "1"), passing)
    assert not kept.promote and kept.tags()["gate.margin"].startswith("failed:")


def test_a_first_version_below_the_floor_is_not_made_champion():
    decision = apply_gates(
        decide_promotion(0.3, None), evaluate_gates(GateSettings(min_accuracy=0.5), [0.3], None, "a", 0.3)
    )
    assert not decision.promote and decision.reason.endswith("no champion set") and "min_accuracy" in decision.reason


def test_settings_and_tags_are_checked():
    with pytest.raises(ValueError, match="max_class_drop=1.5 must be unset or a fraction"):
        GateSettings(max_class_drop=1.5)
    assert parse_per_class(per_class_tag([0.5, 1 / 3])) == (0.5, 0.333333)
    assert parse_per_class("not json") is None and parse_per_class("[2.0]") is None and parse_per_class(None) is None
