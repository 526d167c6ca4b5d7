"""Promotion gates beyond the margin: no class much worse than the champion's, an absolute floor, the newest data.

Runs wherever the register step runs. Each gate is a small function returning a :class:`GateResult`;
:func:`evaluate_gates` runs the configured ones and :func:`tasks.domain.promotion.apply_gates` turns a
failed one into "registered, not promoted" with the gate named. No Prefect, no MLflow here.

=================  ========================================================  =====================
gate               passes when                                               configured by
=================  ========================================================  =====================
``margin``         test accuracy beats the champion's by ``min_margin``      ``min_margin``
``max_class_drop`` no class's accuracy is lower than the champion's on that  ``max_class_drop``
                   class by more than this (both on the same test images)
``min_accuracy``   test accuracy is at least this                            ``min_accuracy``
``newest_slice``   accuracy on the newest batch's test images is at least    ``newest_slice_min_accuracy``
                   this (unset: reported, not a gate)
=================  ========================================================  =====================

Example::

    results = evaluate_gates(GateSettings(max_class_drop=0.05), report.per_class_accuracy_list(), champion_classes,
                             report.class_names, report.accuracy)
    [r.tag() for r in results]  # ("gate.max_class_drop", "failed: class 'Shirt' 41.0% vs champion's 80.0% ...")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

GATE_TAG_PREFIX = "gate."
# Accuracies come back from 6-decimal tags: a drop equal to the limit must not fail by rounding.
TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class GateSettings:
    """Which gates run besides the margin, and their thresholds (None: the gate is off).

    Attributes:
        max_class_drop: the most any one class's accuracy may fall below the champion's (absolute, e.g. 0.05).
        min_accuracy: the lowest test accuracy a version may have to become champion.
        newest_slice_min_accuracy: the lowest accuracy on the newest batch's test images; None reports it only.
    """

    max_class_drop: float | None = None
    min_accuracy: float | None = None
    newest_slice_min_accuracy: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_class_drop", "min_accuracy", "newest_slice_min_accuracy"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not 0 <= value <= 1):
                raise ValueError(f"{name}={value!r} must be unset or a fraction in [0, 1], e.g. 0.05.")


@dataclasses.dataclass(frozen=True)
class SliceScore:
    """The challenger's accuracy on one slice of the test data (the newest batch's test images).

    Attributes:
        name: which slice, e.g. the batch's name.
        accuracy: fraction right; images: how many were scored.
    """

    name: str
    accuracy: float
    images: int


@dataclasses.dataclass(frozen=True)
class GateResult:
    """One gate's outcome.

    Attributes:
        name: the gate (``margin``, ``max_class_drop``, ``min_accuracy``, ``newest_slice``).
        passed: whether it passed (a report-only gate always passes).
        detail: the numbers, in a sentence.
        enforced: False for a report-only check, which never blocks a promotion.
    """

    name: str
    passed: bool
    detail: str
    enforced: bool = True

    @property
    def outcome(self) -> str:
        """``passed``, ``failed`` or ``reported``."""
        if not self.enforced:
            return "reported"
        return "passed" if self.passed else "failed"

    def tag(self) -> tuple[str, str]:
        """The model-version tag recording it: ``gate.<name>`` = ``<outcome>: <detail>``."""
        return f"{GATE_TAG_PREFIX}{self.name}", f"{self.outcome}: {self.detail}"


def class_drop_gate(
    challenger: Sequence[float], champion: Sequence[float] | None, class_names: Sequence[str], max_drop: float
) -> GateResult:
    """No class's accuracy more than ``max_drop`` below the champion's on the same images (passes without one)."""
    if champion is None:
        return GateResult("max_class_drop", True, f"no champion per-class accuracy to compare (limit {max_drop:.4f})")
    if len(champion) != len(challenger):
        return GateResult(
            "max_class_drop",
            False,
            f"the champion has {len(champion)} classes and the challenger {len(challenger)}: not comparable",
        )
    drops = [(old - new, name, new, old) for name, new, old in zip(class_names, challenger, champion, strict=True)]
    drop, name, new, old = max(drops)
    numbers = f"class {name!r} {new:.2%} vs champion's {old:.2%} (drop {drop:+.4f}, limit {max_drop:.4f})"
    if drop > max_drop + TOLERANCE:
        return GateResult("max_class_drop", False, f"largest drop: {numbers}")
    return GateResult("max_class_drop", True, f"largest drop: {numbers}")


def floor_gate(accuracy: float, min_accuracy: float) -> GateResult:
    """Test accuracy at least ``min_accuracy``."""
    passed = accuracy >= min_accuracy - TOLERANCE
    return GateResult("min_accuracy", passed, f"test accuracy {accuracy:.2%} (floor {min_accuracy:.2%})")


def newest_slice_gate(newest: SliceScore | None, min_accuracy: float | None) -> GateResult:
    """The newest batch's test images: reported, and a gate when ``min_accuracy`` is set."""
    enforced = min_accuracy is not None
    floor = f" (floor {min_accuracy:.2%})" if enforced else " (reported, not a gate)"
    if newest is None:
        return GateResult("newest_slice", True, f"no newest batch with test images{floor}", enforced)
    passed = not enforced or newest.accuracy >= min_accuracy - TOLERANCE
    detail = f"{newest.accuracy:.2%} on {newest.images} test images of {newest.name}{floor}"
    return GateResult("newest_slice", passed, detail, enforced)


def evaluate_gates(
    settings: GateSettings,
    challenger_per_class: Sequence[float],
    champion_per_class: Sequence[float] | None,
    class_names: Sequence[str],
    accuracy: float,
    newest: SliceScore | None = None,
) -> list[GateResult]:
    """The configured gates besides the margin, in a fixed order; the newest slice is always reported."""
    results = []
    if settings.max_class_drop is not None:
        results.append(class_drop_gate(challenger_per_class, champion_per_class, class_names, settings.max_class_drop))
    if settings.min_accuracy is not None:
        results.append(floor_gate(accuracy, settings.min_accuracy))
    results.append(newest_slice_gate(newest, settings.newest_slice_min_accuracy))
    return results
