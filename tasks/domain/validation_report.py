"""The validation step's report: files left out, duplicates, class changes, counts per class. Runs anywhere.

Plain data built by :func:`tasks.domain.data_validation.validate_snapshot`; ``rows()`` is the per-class table
(a Prefect table artifact, an MLflow table), ``markdown()`` the summary a person reads in one glance.
"""

from __future__ import annotations

import dataclasses

from tasks.domain.image_spec import ImageSpec
from tasks.domain.urls import mask_url


@dataclasses.dataclass(frozen=True)
class FileProblem:
    """A file left out, and why."""

    path: str
    label: str
    split: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ClassCount:
    """One class's images per split now and in the champion's snapshot (None: no champion)."""

    label: str
    train: int
    test: int
    champion_train: int | None
    champion_test: int | None

    def change(self) -> str:
        if self.champion_train is None:
            return "new" if self.champion_test is not None else ""
        return f"{self.train - self.champion_train:+d} train, {self.test - (self.champion_test or 0):+d} test"


@dataclasses.dataclass(frozen=True)
class ValidationReport:
    """What the validation step found, for the run's log, Prefect and MLflow."""

    source: str
    digest: str
    files: int
    decoded: int
    unusable: tuple[FileProblem, ...]
    duplicates: tuple[FileProblem, ...]
    new_classes: tuple[str, ...]
    vanished_classes: tuple[str, ...]
    counts: tuple[ClassCount, ...]
    champion_digest: str | None
    spec: ImageSpec

    def rows(self) -> list[dict[str, object]]:
        """The per-class table: one row per class (Prefect table artifact, MLflow table)."""
        return [
            {
                "class": c.label,
                "train": c.train,
                "test": c.test,
                "champion train": "" if c.champion_train is None else c.champion_train,
                "champion test": "" if c.champion_test is None else c.champion_test,
                "change": c.change(),
            }
            for c in self.counts
        ]

    def problem_rows(self) -> list[dict[str, str]]:
        """Every file left out or reported, with the reason."""
        return [dataclasses.asdict(p) for p in self.unusable + self.duplicates]

    def markdown(self) -> str:
        s = self.spec
        lines = [
            f"# Data validation: {mask_url(self.source)}",
            "",
            f"* snapshot digest `{self.digest}`; {self.files} files, {self.decoded} decoded now (new)",
            f"* images: {s.channels} channel(s), resized to {s.height}x{s.width}, {s.num_classes} classes",
            f"* left out: {len(self.unusable)} unusable file(s); {len(self.duplicates)} duplicate(s) reported",
            f"* against the champion's snapshot {('`' + self.champion_digest[:12] + '`') if self.champion_digest else '(none)'}: "
            f"new classes {list(self.new_classes) or 'none'}, vanished {list(self.vanished_classes) or 'none'}",
            "",
            "| class | train | test | champion train | champion test | change |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['class']} | {r['train']} | {r['test']} | {r['champion train']} | {r['champion test']} | {r['change']} |"
            for r in self.rows()
        ]
        if self.unusable or self.duplicates:
            lines += ["", "| file | class | split | what |", "|---|---|---|---|"]
            lines += [f"| {p.path} | {p.label} | {p.split} | {p.reason} |" for p in self.unusable + self.duplicates]
        return "\n".join(lines) + "\n"
