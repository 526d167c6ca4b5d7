"""The champion/challenger promotion rule for registered models. Runs wherever the register task runs.

A new version always becomes the ``challenger``; it takes ``champion`` only when its test
accuracy beats the current champion's on the same test images, by at least ``min_margin``
(the evaluate step scores both, or takes the champion's accuracy recorded on those images when it
still predicts as it did: :func:`tasks.domain.champion_comparison.score_champion`). A tie or a smaller win keeps the
champion, so a re-run of the same model never churns the alias. No Prefect, no MLflow here.

Example::

    decision = decide_promotion(challenger_accuracy=0.91, champion_accuracy=0.89, champion_version="3",
                                min_margin=0.005)
    decision.promote  # True
"""

from __future__ import annotations

import dataclasses
import json
import math

from tasks.domain.gates import GateResult

CHALLENGER_ALIAS = "challenger"
CHAMPION_ALIAS = "champion"
ACCURACY_TAG = "test_accuracy"
ACCURACY_PER_CLASS_TAG = "test_accuracy_per_class"  # JSON list, in label order, on the same images
TEST_IMAGES_TAG = "test_images"  # how many test images ACCURACY_TAG was measured on
TEST_DATA_MD5_TAG = "test_data_md5"  # the md5s of the test files it was measured on
# A version's labels for the first PROBE_IMAGES test images, as registered: a later run whose probe of the
# loaded champion gives the same labels on the same test files takes its recorded accuracy (champion_comparison).
PROBE_TAG = "test_probe_labels_md5"
PROBE_IMAGES = 256
DEFAULT_MIN_MARGIN = 0.0  # the challenger must be strictly better; raise it to ignore noise-sized wins


@dataclasses.dataclass(frozen=True)
class ChampionScore:
    """The current champion scored by the evaluate step on the challenger's test images.

    Attributes:
        version: the champion's version, or None when there is no champion.
        accuracy: its accuracy on those images; None when there is no champion or it could not be scored.
        error: why it could not be scored (e.g. a version registered in an old format), else None.
        recorded: ``accuracy`` is the one recorded when the champion was registered, on the same test files and
            as many images, taken because the loaded champion gave its recorded labels for the probe images;
            False when it was scored on every image now.
        per_class_accuracy: its accuracy on each class's images, in label order (None with ``accuracy``).
    """

    version: str | None
    accuracy: float | None = None
    error: str | None = None
    recorded: bool = False
    per_class_accuracy: tuple[float, ...] | None = None


@dataclasses.dataclass(frozen=True)
class PromotionDecision:
    """Whether the new version takes ``champion``, and why (as a sentence and as version tags)."""

    promote: bool
    challenger_accuracy: float
    champion_accuracy: float | None
    champion_version: str | None
    reason: str
    min_margin: float = DEFAULT_MIN_MARGIN
    gates: tuple[GateResult, ...] = ()

    @property
    def margin(self) -> float | None:
        """Challenger accuracy minus champion accuracy (None without a scored champion)."""
        return None if self.champion_accuracy is None else self.challenger_accuracy - self.champion_accuracy

    def tags(self) -> dict[str, str]:
        """Tags recording the decision on the new model version."""
        return {
            "promotion_decision": "promoted" if self.promote else "kept_champion",
            "promotion_reason": self.reason,
            "previous_champion_version": self.champion_version or "none",
            "previous_champion_test_accuracy": "none"
            if self.champion_accuracy is None
            else f"{self.champion_accuracy:.6f}",
            "promotion_margin": "none" if self.margin is None else f"{self.margin:.6f}",
            "promotion_min_margin": f"{self.min_margin:.6f}",
            **dict(gate.tag() for gate in self.gates),
        }

    def failed_gates(self) -> list[str]:
        """The names of the enforced gates that failed."""
        return [gate.name for gate in self.gates if gate.enforced and not gate.passed]


def margin_gate(decision: PromotionDecision) -> GateResult:
    """The margin rule's outcome as a gate (``decide_promotion`` made it)."""
    return GateResult("margin", decision.promote, decision.reason.rsplit(": ", 1)[0])


def apply_gates(decision: PromotionDecision, gates: list[GateResult]) -> PromotionDecision:
    """``decision`` with the margin gate and ``gates`` recorded; any enforced gate that failed keeps the champion.

    The reason names every failed gate with its numbers, e.g. ``refused by gate max_class_drop (largest drop:
    class 'Shirt' ...)``.
    """
    margin = margin_gate(decision)
    failed = [gate for gate in gates if gate.enforced and not gate.passed]
    if not decision.promote or not failed:
        return dataclasses.replace(decision, gates=(margin, *gates))
    refused = "; ".join(f"refused by gate {gate.name} ({gate.detail})" for gate in failed)
    kept = "champion kept" if decision.champion_version else "no champion set"
    return dataclasses.replace(
        decision, promote=False, reason=f"{margin.detail}; {refused}: {kept}", gates=(margin, *gates)
    )


def per_class_tag(per_class: tuple[float, ...] | list[float]) -> str:
    """The :data:`ACCURACY_PER_CLASS_TAG` value: accuracies in label order, 6 decimals."""
    return json.dumps([round(float(a), 6) for a in per_class])


def parse_per_class(text: str | None) -> tuple[float, ...] | None:
    """A :data:`ACCURACY_PER_CLASS_TAG` value back as accuracies, or None when missing or malformed."""
    try:
        values = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(values, list) or not all(parse_accuracy(str(v)) is not None for v in values):
        return None
    return tuple(float(v) for v in values)


def decide_promotion(
    challenger_accuracy: float,
    champion_accuracy: float | None,
    champion_version: str | None = None,
    min_margin: float = DEFAULT_MIN_MARGIN,
    champion_error: str | None = None,
) -> PromotionDecision:
    """Decide whether a challenger with ``challenger_accuracy`` replaces the champion.

    Args:
        challenger_accuracy: the new version's test accuracy, in [0, 1].
        champion_accuracy: the current champion's accuracy on the same test images, or None
            when there is no champion (or it could not be scored: then it is kept).
        champion_version: the current champion's version, for the record.
        min_margin: how much higher (absolute accuracy, e.g. 0.005 = half a point) the
            challenger must score; a win below it, or a tie, keeps the champion.
        champion_error: why the champion could not be scored: the challenger is then not promoted.

    Raises:
        ValueError: an accuracy outside [0, 1] or not a number; a margin outside [0, 1).
    """
    _check_accuracy("challenger_accuracy", challenger_accuracy)
    if isinstance(min_margin, bool) or not isinstance(min_margin, (int, float)) or not 0 <= min_margin < 1:
        raise ValueError(f"min_margin={min_margin!r} must be a number in [0, 1), e.g. 0.005 for half a point.")
    if champion_accuracy is None and champion_error and champion_version is not None:
        # Fails closed: a champion that cannot be loaded or scored (a storage outage, damaged files) is kept.
        return PromotionDecision(
            False,
            challenger_accuracy,
            None,
            champion_version,
            f"champion version {champion_version} could not be scored ({champion_error}): champion kept, the "
            "challenger is not promoted",
            min_margin,
        )
    if champion_accuracy is None:
        if champion_version is None:
            reason = "no champion yet"
        else:
            reason = f"champion version {champion_version} has no test accuracy"
        return PromotionDecision(
            True,
            challenger_accuracy,
            None,
            champion_version,
            f"{reason}: the challenger ({challenger_accuracy:.4f}) becomes champion",
            min_margin,
        )
    _check_accuracy("champion_accuracy", champion_accuracy)
    margin = challenger_accuracy - champion_accuracy
    versus = (
        f"test accuracy {challenger_accuracy:.4f} vs champion version {champion_version}'s "
        f"{champion_accuracy:.4f} on the same images (margin {margin:+.4f}, required > 0 and >= {min_margin:.4f})"
    )
    # A small tolerance: accuracies are ratios of counts, so equal counts must compare equal.
    if margin > 1e-12 and margin >= min_margin - 1e-12:
        return PromotionDecision(
            True, challenger_accuracy, champion_accuracy, champion_version, f"{versus}: promoted", min_margin
        )
    return PromotionDecision(
        False, challenger_accuracy, champion_accuracy, champion_version, f"{versus}: champion kept", min_margin
    )


def parse_accuracy(text: str | None) -> float | None:
    """A tag value as an accuracy, or None when missing or not a number in [0, 1]."""
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    if value is None or math.isnan(value) or not 0.0 <= value <= 1.0:
        return None
    return value


def _check_accuracy(field: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not 0 <= value <= 1:
        raise ValueError(f"{field}={value!r} must be an accuracy between 0 and 1.")
