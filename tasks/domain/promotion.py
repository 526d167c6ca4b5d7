"""The champion/challenger promotion rule for registered models. Runs wherever the register task runs.

A new version always becomes the ``challenger``; it takes ``champion`` only when
its test accuracy is strictly higher than the current champion's (ties keep the
champion, so a re-run of the same model never churns the alias). Runs wherever
the register task runs; no Prefect, no MLflow here.

Example::

    decision = decide_promotion(challenger_accuracy=0.91, champion_accuracy=0.89, champion_version="3")
    decision.promote  # True
"""

from __future__ import annotations

import dataclasses
import math

CHALLENGER_ALIAS = "challenger"
CHAMPION_ALIAS = "champion"
ACCURACY_TAG = "test_accuracy"


@dataclasses.dataclass(frozen=True)
class PromotionDecision:
    """Whether the new version takes ``champion``, and why (as a sentence and as version tags)."""

    promote: bool
    challenger_accuracy: float
    champion_accuracy: float | None
    champion_version: str | None
    reason: str

    def tags(self) -> dict[str, str]:
        """Tags recording the decision on the new model version."""
        return {
            "promotion_decision": "promoted" if self.promote else "kept_champion",
            "promotion_reason": self.reason,
            "previous_champion_version": self.champion_version or "none",
            "previous_champion_test_accuracy": "none" if self.champion_accuracy is None
            else f"{self.champion_accuracy:.6f}",
        }


def decide_promotion(challenger_accuracy: float, champion_accuracy: float | None,
                     champion_version: str | None = None) -> PromotionDecision:
    """Decide whether a challenger with ``challenger_accuracy`` replaces the champion.

    Args:
        challenger_accuracy: the new version's test accuracy, in [0, 1].
        champion_accuracy: the current champion's test accuracy, or None when there is
            no champion yet (or its accuracy is unknown: then the challenger wins).
        champion_version: the current champion's version, for the record.

    Raises:
        ValueError: an accuracy outside [0, 1] or not a number.
    """
    _check_accuracy("challenger_accuracy", challenger_accuracy)
    if champion_accuracy is None:
        reason = ("no champion yet" if champion_version is None else
                  f"champion version {champion_version} has no recorded test accuracy")
        return PromotionDecision(True, challenger_accuracy, None, champion_version,
                                 f"{reason}: the challenger ({challenger_accuracy:.4f}) becomes champion")
    _check_accuracy("champion_accuracy", champion_accuracy)
    if challenger_accuracy > champion_accuracy:
        reason = (f"test accuracy {challenger_accuracy:.4f} beats champion version {champion_version}'s "
                  f"{champion_accuracy:.4f}")
        return PromotionDecision(True, challenger_accuracy, champion_accuracy, champion_version, reason)
    reason = (f"test accuracy {challenger_accuracy:.4f} does not beat champion version {champion_version}'s "
              f"{champion_accuracy:.4f}: champion kept")
    return PromotionDecision(False, challenger_accuracy, champion_accuracy, champion_version, reason)


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
