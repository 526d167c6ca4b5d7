"""The MLflow model registry as the pipeline uses it: score the champion, register a version, set aliases.

Runs on the driver (the evaluate and register task processes). The evaluate step scores
the current champion on the challenger's test images (:func:`score_champion`; its accuracy recorded on
them when it still predicts as registered); the register
step packages the checkpoint as the self-contained model (:mod:`tasks.domain.model_package`),
registers it once per MLflow run, sets ``challenger`` and moves ``champion`` when
:func:`tasks.domain.promotion.decide_promotion` says so. Both accuracies, the margin and the
test data's md5 are kept as tags on the new version.

Example::

    champion = score_champion("fashion-mnist-resnet18", tracking_uri, images, labels, md5)
    comparison = Comparison(report, champion, md5, probe=probe_digest(network, images))
    registration = register_and_promote(training, comparison, card, "fashion-mnist-resnet18", tracking_uri,
                                        min_margin=0.002)
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import torch

import trainlib
from tasks.domain.champion import DATASET_TAG, alias_version, champion_version, check_same_data
from tasks.domain.classifier_network import build_network, forward_in_batches
from tasks.domain.dataset_registry import get_dataset_spec
from tasks.domain.evaluation import EvaluationReport, evaluate_model
from tasks.domain.gates import GateSettings, SliceScore, evaluate_gates
from tasks.domain.idx_files import load_fashion_mnist_split
from tasks.domain.image_spec import ImageSpec
from tasks.domain.model_package import IDX_SHAPE, ModelCard, describe, log_and_register, recorded_image
from tasks.domain.network import load_model, to_inputs
from tasks.domain.promotion import (
    ACCURACY_PER_CLASS_TAG,
    ACCURACY_TAG,
    CHALLENGER_ALIAS,
    CHAMPION_ALIAS,
    DEFAULT_MIN_MARGIN,
    PROBE_IMAGES,
    PROBE_TAG,
    TEST_DATA_MD5_TAG,
    TEST_IMAGES_TAG,
    ChampionScore,
    PromotionDecision,
    apply_gates,
    decide_promotion,
    parse_per_class,
    per_class_tag,
)
from tasks.domain.staging import StagedDataset, fetch_staged
from tasks.domain.training_run import TrainingOutcome


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Challenger and champion scored on the same test images in the same run (the evaluate step's result).

    Attributes:
        report: the challenger's evaluation.
        champion: the champion's accuracy on the same images (or why there is none).
        test_data_md5: md5s of the test files both were scored on.
        probe: :func:`probe_digest` of the challenger, recorded on its version (:data:`PROBE_TAG`); "" for none.
        newest_slice: the challenger on the newest batch's test images (None: no such batch).
    """

    report: EvaluationReport
    champion: ChampionScore
    test_data_md5: str
    probe: str = ""
    newest_slice: SliceScore | None = None


@dataclasses.dataclass(frozen=True)
class Registration:
    """The registered version and what happened to the aliases."""

    model_name: str
    version: str
    champion_version: str
    decision: PromotionDecision


def find_version_of_run(client: Any, model_name: str, run_id: str) -> str | None:
    """The version of ``model_name`` already registered from MLflow run ``run_id``, if any."""
    versions = client.search_model_versions(f"name = '{model_name}'")
    mine = [v for v in versions if v.run_id == run_id]
    return max(mine, key=lambda v: int(v.version)).version if mine else None


def score_champion(
    model_name: str,
    tracking_uri: str,
    images: torch.Tensor,
    labels: torch.Tensor,
    test_data_md5: str | None = None,
    dataset: str | None = None,
    num_classes: int | None = None,
) -> ChampionScore:
    """The current champion's accuracy on uint8 ``images [N, 28, 28]``, through its registered pyfunc model.

    The champion is loaded and predicts the first :data:`PROBE_IMAGES` images. When its version records an
    accuracy on the same test files (``test_data_md5``) and as many images, and the probe's labels are the
    ones it recorded at registration, that accuracy is taken (``recorded=True``): scoring every image again
    would give the same number, ~3.5 s later on 2 cores (its per-class accuracies are taken from its tags too,
    for the ``max_class_drop`` gate). Otherwise it predicts every image; when that gives the
    accuracy its tags record for these files, the probe's labels are recorded on it for the next run.
    A champion that cannot be loaded or cannot predict raw images (e.g. registered by an
    older pipeline, or its files damaged) gets ``accuracy=None`` and the reason in ``error``: it is then not
    replaced (:mod:`tasks.domain.champion`).

    Raises:
        ChampionMismatchError: the champion is a model of another data set (``dataset``), class list or input.
        DanglingAliasError, RegistryUnavailableError: the registry cannot say which version is the champion.
    """
    import mlflow
    from mlflow import MlflowClient

    from trainlib.mlflow import using_tracking_uri

    version = alias_version(MlflowClient(tracking_uri=tracking_uri), model_name)
    if version is None:
        return ChampionScore(version=None)
    if dataset is not None:
        check_same_data(model_name, str(version.version), dataset, version.tags.get(DATASET_TAG))
    try:
        with using_tracking_uri(tracking_uri):
            # No check of its pinned packages against this Python (MLflow scans every installed package for
            # it, ~1.7 s): the champion is scored here, not served; the scoring flow checks them.
            model = mlflow.pyfunc.load_model(f"models:/{model_name}/{version.version}", suppress_warnings=True)
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot be compared", with the reason kept
        return ChampionScore(version=str(version.version), error=_short_error(exc))
    if dataset is not None:
        recorded = model.metadata.metadata or {}
        check_same_data(
            model_name,
            str(version.version),
            dataset,
            None,
            get_dataset_spec(dataset).class_names,
            recorded.get("class_names"),
            describe(ImageSpec(class_names=get_dataset_spec(dataset).class_names, **IDX_SHAPE)),
            recorded_image(recorded),
        )
    try:
        probe = label_digest(torch.as_tensor(model.predict(images[:PROBE_IMAGES].numpy())["label"].to_numpy().copy()))
        recorded = recorded_accuracy(version.tags, test_data_md5, len(images), probe)
        recorded_classes = parse_per_class(version.tags.get(ACCURACY_PER_CLASS_TAG))
        if recorded is not None and recorded_classes is not None:
            return ChampionScore(
                version=str(version.version), accuracy=recorded, recorded=True, per_class_accuracy=recorded_classes
            )
        predicted = torch.as_tensor(model.predict(images.numpy())["label"].to_numpy().copy())
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot be compared", with the reason kept
        return ChampionScore(version=str(version.version), error=_short_error(exc))
    accuracy = float((predicted == labels).double().mean())
    _record_probe(version, test_data_md5, len(images), probe, accuracy, tracking_uri)
    per_class = per_class_accuracy(predicted, labels, num_classes or int(labels.max()) + 1)
    return ChampionScore(version=str(version.version), accuracy=accuracy, per_class_accuracy=per_class)


def per_class_accuracy(predicted: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[float, ...]:
    """Accuracy on each class's images, in label order (0 for a class with no image, as the report has it)."""
    counts = torch.bincount(labels, minlength=num_classes).double()
    right = torch.bincount(labels[predicted == labels], minlength=num_classes).double()
    return tuple(float(r / c) if c else 0.0 for r, c in zip(right.tolist(), counts.tolist(), strict=True))


def _short_error(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


def _record_probe(
    version: Any, test_data_md5: str | None, num_images: int, probe: str, accuracy: float, tracking_uri: str
) -> None:
    """Record ``probe`` on a champion just scored on every image to the accuracy its tags hold for these files.

    A champion registered before probes were recorded (or whose tag was lost) then takes the short path from
    the next run on. Best effort: without the tag the next run scores it on every image again.
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    # A tag that already holds this probe fails this too: those very tags gave no recorded accuracy.
    if recorded_accuracy({**version.tags, PROBE_TAG: probe}, test_data_md5, num_images, probe) != accuracy:
        return  # its tags are for other images, or not what it scores: they are not to be taken later
    try:
        MlflowClient(tracking_uri=tracking_uri).set_model_version_tag(version.name, version.version, PROBE_TAG, probe)
    except MlflowException:
        pass


def label_digest(labels: torch.Tensor) -> str:
    """The md5 of predicted class labels (0..255), in order: what :data:`PROBE_TAG` records."""
    return hashlib.md5(labels.to(torch.uint8).numpy().tobytes()).hexdigest()


def probe_digest(network: torch.nn.Module, images: torch.Tensor) -> str:
    """``network``'s labels for the first :data:`PROBE_IMAGES` of ``images``, as its registered model gives them."""
    logits = forward_in_batches(network, images[:PROBE_IMAGES], to_inputs, PROBE_IMAGES)
    return label_digest(logits.argmax(1))


def recorded_accuracy(tags: dict[str, str], test_data_md5: str | None, num_images: int, probe: str) -> float | None:
    """The accuracy a version's tags record for these test files and this many images, if its probe is ``probe``.

    Exact: ``k / num_images``, recovered from the 6-decimal tag, so a tie with a challenger stays a tie.
    """
    if not test_data_md5 or tags.get(TEST_DATA_MD5_TAG) != test_data_md5 or tags.get(PROBE_TAG) != probe:
        return None
    try:
        if int(tags.get(TEST_IMAGES_TAG, "")) != num_images:
            return None
        accuracy = float(tags[ACCURACY_TAG])
    except (KeyError, ValueError):
        return None
    if not 0.0 <= accuracy <= 1.0:
        return None
    return round(accuracy * num_images) / num_images


def test_split_md5(dataset: StagedDataset) -> str:
    """The md5s of the test split's files (``t10k-*``), joined: the identity of the images both models saw."""
    return ",".join(md5 for name, md5 in sorted(dataset.md5s.items()) if name.startswith("t10k-"))


def checkpoint_network(checkpoint_uri: str, architecture: str, spec: ImageSpec | None = None) -> torch.nn.Module:
    """The trained network in ``checkpoint_uri``, as the registered model's own class (no torchvision import).

    ``spec``: the classes and input channels of a network trained on a snapshot (None: the idx sets' 10, gray).
    """

    def build() -> torch.nn.Module:
        if spec is None:
            return build_network(architecture=architecture)
        return build_network(spec.num_classes, architecture, spec.channels)

    with trainlib.Checkpoint.from_uri(checkpoint_uri).as_directory() as folder:
        return load_model(folder, build=build)


def compare_with_champion(
    training: TrainingOutcome,
    dataset: StagedDataset,
    cache_dir: str,
    test_limit: int | None,
    model_name: str,
    tracking_uri: str,
) -> Comparison:
    """Score the trained checkpoint and the current champion on the same test images (the evaluate step)."""
    files = fetch_staged(dataset, cache_dir)
    images, labels = load_fashion_mnist_split(files.folder, train=False, limit=test_limit)
    network = checkpoint_network(training.checkpoint_uri, training.architecture)
    class_names = get_dataset_spec(dataset.name).class_names
    report = evaluate_model(network, images, labels, class_names)
    test_data_md5 = test_split_md5(dataset)
    champion = score_champion(
        model_name, tracking_uri, images, labels, test_data_md5, dataset=dataset.name, num_classes=len(class_names)
    )
    return Comparison(
        report=report, champion=champion, test_data_md5=test_data_md5, probe=probe_digest(network, images)
    )


def register_and_promote(
    training: TrainingOutcome,
    comparison: Comparison,
    card: ModelCard,
    model_name: str,
    tracking_uri: str,
    min_margin: float = DEFAULT_MIN_MARGIN,
    extra_tags: dict[str, str] | None = None,
    gates: GateSettings | None = None,
) -> Registration:
    """Register the model (once per run), tag it, set ``challenger`` and maybe ``champion``.

    The champion moves only if it is still the version the evaluate step scored; if another
    run moved it meanwhile, this run's challenger does not take it. Nor does it when one of ``gates``
    fails (:mod:`tasks.domain.gates`); every gate's outcome is a ``gate.<name>`` tag on the version.
    """
    from mlflow import MlflowClient

    if not training.mlflow_run_id:
        raise ValueError(
            "The training step has no MLflow run id, so there is no run to register the model from. "
            "Check the MLflow tracking URI of the pipeline."
        )
    report, champion = comparison.report, comparison.champion
    card = dataclasses.replace(card, test_accuracy=report.accuracy, architecture=training.architecture)
    client = MlflowClient(tracking_uri=tracking_uri)
    version = find_version_of_run(client, model_name, training.mlflow_run_id)
    current = champion_version(client, model_name)
    if current is not None and current == version:  # a retry after the aliases were set: already the champion
        decision = decide_promotion(report.accuracy, champion.accuracy, champion.version, min_margin, champion.error)
    elif current != champion.version:
        decision = PromotionDecision(
            False,
            report.accuracy,
            None,
            current,
            f"the champion moved from version {champion.version} to {current} during this run: champion kept "
            "(run the pipeline again to compare against the new champion)",
            min_margin,
        )
    else:
        decision = decide_promotion(report.accuracy, champion.accuracy, champion.version, min_margin, champion.error)
    challenger_classes = [report.per_class_accuracy[name] for name in report.class_names]
    decision = apply_gates(
        decision,
        evaluate_gates(
            gates or GateSettings(),
            challenger_classes,
            champion.per_class_accuracy,
            report.class_names,
            report.accuracy,
            comparison.newest_slice,
        ),
    )
    tags = {
        ACCURACY_TAG: f"{report.accuracy:.6f}",
        ACCURACY_PER_CLASS_TAG: per_class_tag(challenger_classes),
        "test_loss": f"{report.loss:.6f}",
        TEST_IMAGES_TAG: str(report.num_images),
        TEST_DATA_MD5_TAG: comparison.test_data_md5,
        "checkpoint": training.checkpoint_uri,
        **({PROBE_TAG: comparison.probe} if comparison.probe else {}),
        **decision.tags(),
        **(extra_tags or {}),
    }
    if version is None:  # the version is created with its tags
        version = log_and_register(
            checkpoint_network(training.checkpoint_uri, training.architecture, training.image_spec),
            card,
            model_name,
            training.mlflow_run_id,
            tracking_uri,
            tags=tags,
        ).version
    else:  # a retry: the version exists, perhaps without (all of) its tags
        for key, value in tags.items():
            client.set_model_version_tag(model_name, version, key, value)
    client.set_registered_model_alias(model_name, CHALLENGER_ALIAS, version)
    if decision.promote:
        client.set_registered_model_alias(model_name, CHAMPION_ALIAS, version)
    return Registration(
        model_name=model_name,
        version=version,
        champion_version=version if decision.promote or current == version else (current or ""),
        decision=decision,
    )


def record_gates_on_run(decision: PromotionDecision, run_id: str | None, tracking_uri: str) -> None:
    """Each gate's outcome as a ``gate.<name>`` tag on the training's MLflow run (beside the version's)."""
    from mlflow import MlflowClient

    if not run_id or not decision.gates:
        return
    client = MlflowClient(tracking_uri=tracking_uri)
    for gate in decision.gates:
        client.set_tag(run_id, *gate.tag())
    client.set_tag(run_id, "promotion_decision", "promoted" if decision.promote else "kept_champion")
