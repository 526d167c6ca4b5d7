"""The validation step's work: decode each new file once, say what the data holds, keep bad files out. Runs on a node.

Before any training, :func:`validate_snapshot` checks a snapshot against itself and the champion's:
corrupt, empty and non-image files and images smaller than ``min_size`` are named and left out;
duplicate content is reported (a test image also in training is kept out of training, repeated
copies within a split are kept once); classes that appeared or vanished against the champion's
snapshot stop the run unless allowed; counts per class and split, and their change, are tabled.
What a file is (size, channels, or why it is no image) is cached by content hash, so a file is
decoded once, ever, on a node. The result carries the snapshot to train on and its ImageSpec.

Example::

    result = validate_snapshot(snapshot, SnapshotReader(snapshot, cache), FactsCache(cache), champion, settings)
    result.snapshot, result.spec, result.report.markdown()
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sqlite3
from collections.abc import Iterable

from tasks.domain.data_source import PARAMETER
from tasks.domain.image_decode import ImageFacts, inspect_image
from tasks.domain.image_spec import ImageSpec
from tasks.domain.snapshot import Snapshot
from tasks.domain.snapshot_files import SnapshotReader
from tasks.domain.urls import expand_path, mask_url
from tasks.domain.validation_report import ClassCount, FileProblem, ValidationReport

FACTS_DB = "image_facts.sqlite"
SHOWN_PROBLEMS = 20  # files named in an error message; the report names all


class DataValidationError(ValueError):
    """The data fails validation (too many bad files, a class change not allowed, an empty split)."""


@dataclasses.dataclass(frozen=True)
class ValidationSettings:
    """Thresholds of the validation step.

    Attributes:
        max_bad_fraction: the share of unusable files (corrupt, empty, not images, too small) above which the
            run fails; below it they are only left out.
        min_size: the smallest width and height accepted, in pixels.
        allow_class_changes: train even when classes appeared or vanished against the champion's snapshot.
        image_size: the size images are resized to (square); None: the data's most common size.
    """

    max_bad_fraction: float = 0.05
    min_size: int = 8
    allow_class_changes: bool = False
    image_size: int | None = None


@dataclasses.dataclass(frozen=True)
class ValidatedData:
    """The snapshot to train on (bad files and training copies of test images left out), its spec and the report."""

    snapshot: Snapshot
    spec: ImageSpec
    report: ValidationReport


class FactsCache:
    """:class:`ImageFacts` by content hash, in ``<folder>/image_facts.sqlite``: each file is decoded once on a node."""

    def __init__(self, folder: str):
        os.makedirs(expand_path(folder), exist_ok=True)
        self.path = os.path.join(expand_path(folder), FACTS_DB)
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS facts (sha256 TEXT PRIMARY KEY, width INT, height INT, channels INT, "
                "error TEXT)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60)

    def get(self, hashes: Iterable[str]) -> dict[str, ImageFacts]:
        wanted = set(hashes)
        with self._connect() as db:
            rows = db.execute("SELECT sha256, width, height, channels, error FROM facts").fetchall()
        return {r[0]: ImageFacts(r[1], r[2], r[3], r[4]) for r in rows if r[0] in wanted}

    def put(self, facts: dict[str, ImageFacts]) -> None:
        with self._connect() as db:
            db.executemany(
                "INSERT OR REPLACE INTO facts VALUES (?, ?, ?, ?, ?)",
                [(sha, f.width, f.height, f.channels, f.error) for sha, f in facts.items()],
            )


def image_facts(snapshot: Snapshot, reader: SnapshotReader, cache: FactsCache) -> tuple[dict[str, ImageFacts], int]:
    """sha256 -> facts of every file of ``snapshot``, decoding only those ``cache`` lacks; and how many were decoded."""
    from concurrent.futures import ThreadPoolExecutor

    facts = cache.get(snapshot.hashes)
    first = {}
    for e in snapshot.entries:
        if e.sha256 not in facts:
            first.setdefault(e.sha256, e)
    todo = list(first.values())

    def decode(entry):  # a file that vanished or changed is unusable too, with its reason
        try:
            return entry.sha256, inspect_image(reader.read(entry))
        except OSError as exc:
            return entry.sha256, ImageFacts(error=str(exc).split(": ", 1)[-1][:200])

    with ThreadPoolExecutor(min(8, (os.cpu_count() or 1) * 2)) as pool:
        fresh = dict(pool.map(decode, todo))
    cache.put({sha: f for sha, f in fresh.items() if "cannot be read" not in f.error})
    facts.update(fresh)
    return facts, len(todo)


def derive_spec(snapshot: Snapshot, facts: dict[str, ImageFacts], image_size: int | None) -> ImageSpec:
    """Channels (3 if any image is color), size (``image_size`` square, else the most common) and sorted classes."""
    channels = 3 if any(facts[e.sha256].channels == 3 for e in snapshot.entries) else 1
    if image_size:
        height = width = image_size
    else:
        sizes = collections.Counter((facts[e.sha256].height, facts[e.sha256].width) for e in snapshot.entries)
        height, width = max(sizes.items(), key=lambda kv: (kv[1], kv[0]))[0]
    return ImageSpec(channels=channels, height=height, width=width, class_names=snapshot.class_names)


def validate_snapshot(
    snapshot: Snapshot,
    reader: SnapshotReader,
    cache: FactsCache,
    champion: Snapshot | None,
    settings: ValidationSettings,
) -> ValidatedData:
    """Check ``snapshot`` (see the module's docstring); return what to train on.

    Raises:
        DataValidationError: more unusable files than ``max_bad_fraction`` allows (all named), classes changed
            against the champion's snapshot without ``allow_class_changes``, or a class or split left empty.
    """
    facts, decoded = image_facts(snapshot, reader, cache)
    unusable = []
    for e in snapshot.entries:
        f = facts[e.sha256]
        if not f.ok:
            unusable.append(FileProblem(e.path, e.label, e.split, f.error))
        elif min(f.width, f.height) < settings.min_size:
            unusable.append(
                FileProblem(e.path, e.label, e.split, f"too small: {f.width}x{f.height} (minimum {settings.min_size})")
            )
    shown = mask_url(snapshot.source)
    if unusable and len(unusable) > settings.max_bad_fraction * len(snapshot.entries):
        listed = "\n".join(f"  - {p.path}: {p.reason}" for p in unusable[:SHOWN_PROBLEMS])
        more = f"\n  ... and {len(unusable) - SHOWN_PROBLEMS} more" if len(unusable) > SHOWN_PROBLEMS else ""
        raise DataValidationError(
            f"{PARAMETER}={shown!r}: {len(unusable)} of {len(snapshot.entries)} files are unusable "
            f"({len(unusable) / len(snapshot.entries):.1%}, more than max_bad_fraction={settings.max_bad_fraction}):\n"
            f"{listed}{more}\nFix: remove or replace these files, or raise max_bad_fraction to leave them out."
        )
    usable = snapshot.without(p.path for p in unusable)
    duplicates = _duplicates(usable)
    kept = usable.without(p.path for p in duplicates)
    _check_classes(kept, shown)

    new = tuple(sorted(set(kept.class_names) - set(champion.class_names))) if champion else ()
    vanished = tuple(sorted(set(champion.class_names) - set(kept.class_names))) if champion else ()
    if (new or vanished) and not settings.allow_class_changes:
        raise DataValidationError(
            f"{PARAMETER}={shown!r}: the classes changed against the champion's snapshot "
            f"({champion.digest[:12]}): new {list(new) or 'none'}, vanished {list(vanished) or 'none'}. A model with "
            "other classes cannot be compared with the champion. Fix: restore the classes, or pass "
            "allow_class_changes=true to train a model with the new classes."
        )
    now, before = kept.counts(), (champion.counts() if champion else {})
    counts = tuple(
        ClassCount(
            label,
            now.get(label, {}).get("train", 0),
            now.get(label, {}).get("test", 0),
            before[label]["train"] if label in before else None,
            before[label]["test"] if label in before else None,
        )
        for label in sorted(set(now) | set(before))
    )
    spec = derive_spec(kept, facts, settings.image_size)
    report = ValidationReport(
        source=snapshot.source,
        digest=kept.digest,
        files=len(snapshot.entries),
        decoded=decoded,
        unusable=tuple(unusable),
        duplicates=duplicates,
        new_classes=new,
        vanished_classes=vanished,
        counts=counts,
        champion_digest=champion.digest if champion else None,
        spec=spec,
    )
    return ValidatedData(snapshot=kept, spec=spec, report=report)


def _duplicates(snapshot: Snapshot) -> tuple[FileProblem, ...]:
    """Entries to leave out: training copies of test images, and repeated copies within a split (first kept)."""
    by_hash: dict[str, list] = collections.defaultdict(list)
    for e in sorted(snapshot.entries, key=lambda e: e.path):
        by_hash[e.sha256].append(e)
    out = []
    for group in by_hash.values():
        if len(group) < 2:
            continue
        tests = [e for e in group if e.split == "test"]
        for split in ("train", "test"):
            copies = [e for e in group if e.split == split]
            for e in copies[1:] if not (split == "train" and tests) else copies:
                if split == "train" and tests:
                    reason = f"same content as test image {tests[0].path}: kept out of training"
                else:
                    reason = f"same content as {copies[0].path} ({split}): kept once"
                if e.label != copies[0].label or (tests and e.label != tests[0].label):
                    reason += f"; labels differ ({e.label} vs {(tests or copies)[0].label})"
                out.append(FileProblem(e.path, e.label, e.split, reason))
    return tuple(out)


def _check_classes(snapshot: Snapshot, shown: str) -> None:
    for label, per_split in snapshot.counts().items():
        if per_split["train"] == 0:
            raise DataValidationError(
                f"{PARAMETER}={shown!r}: class {label!r} has no usable training image. Fix: add training images "
                "of it, or remove the class."
            )
    if not snapshot.split("test"):
        raise DataValidationError(
            f"{PARAMETER}={shown!r}: no usable test image. Fix: add images under test/, or leave the splits out "
            "(a share of the images then goes to the test split by content)."
        )
    if len(snapshot.class_names) < 2:
        raise DataValidationError(
            f"{PARAMETER}={shown!r}: only {len(snapshot.class_names)} class has usable images. Fix: at least two."
        )
