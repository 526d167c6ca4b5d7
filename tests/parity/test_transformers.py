"""Ray Train's Hugging Face Transformers getting-started example, on a tiny BERT built from a config and a small
generated data set (examples/transformers_text_classifier.py), runs with only its imports changed, on 2 workers of a
fresh process; prepare_trainer feeds a Ray Data shard to transformers.Trainer batch by batch."""

from __future__ import annotations

import os

import pytest
from conftest import REPO_ROOT, run_script

EXAMPLE = os.path.join(REPO_ROOT, "examples", "transformers_text_classifier.py")

# Appended after the example's last step, to check what it produced.
CHECK = """
import ray.data as _rd
assert result.error is None, result.error
# 64 examples, 2 workers, batches of 8: 4 steps per epoch, 3 epochs; a report (and checkpoint) per epoch.
assert result.metrics["epoch"] == 3.0 and result.metrics["step"] == 12, result.metrics
assert "eval_accuracy" in result.metrics and "eval_loss" in result.metrics, result.metrics
assert len(result.metrics_dataframe) == 3 and model.config.num_hidden_layers == 2


def _ray_data_func():
    # prepare_trainer: a Ray Data shard's torch batches as train_dataset.
    import torch
    import trainlib.huggingface.transformers
    shard = trainlib.get_dataset_shard("train")
    model = AutoModelForSequenceClassification.from_config(BertConfig(
        vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=SEQUENCE_LENGTH, num_labels=NUM_LABELS))
    args = TrainingArguments(output_dir="ray_data_trainer", max_steps=3, report_to="none", save_strategy="no",
                             use_cpu=True)
    batches = shard.iter_torch_batches(batch_size=8, dtypes={"input_ids": torch.long, "labels": torch.long})
    trainer = trainlib.huggingface.transformers.prepare_trainer(Trainer(model=model, args=args, train_dataset=batches))
    assert type(trainer).__name__ == "RayTransformersTrainer"
    trainer.train()
    trainlib.report({"steps": trainer.state.global_step})


_rows = [{"input_ids": list(range(5, 5 + SEQUENCE_LENGTH)), "labels": i % NUM_LABELS} for i in range(48)]
_result = TorchTrainer(_ray_data_func, scaling_config=ScalingConfig(num_workers=2),
                       datasets={"train": _rd.from_items(_rows)}).fit()
assert _result.metrics["steps"] == 3, _result.metrics
print("TRANSFORMERS_OK")
"""


def test_example_is_ray_trains_with_imports_changed():
    with open(EXAMPLE) as f:
        text = f.read()
    body = text[text.index("import os") :]
    assert "import ray" not in body and "ray.train" not in body  # nothing of Ray Train is left
    assert "trainlib.huggingface.transformers.prepare_trainer(trainer)" in body


@pytest.mark.long
def test_transformers_example_runs_on_two_workers(tmp_path):
    with open(EXAMPLE) as f:
        proc = run_script(tmp_path, f.read() + CHECK)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "TRANSFORMERS_OK" in proc.stdout
