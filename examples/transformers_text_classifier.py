# Ray Train's "Get Started with Distributed Training using Hugging Face Transformers" example with `ray.train`
# replaced by `trainlib`, use_gpu=False (CPU machine), and, so that nothing is downloaded from the Hub, a tiny BERT
# built from a config (2 layers) and a small generated data set in place of bert-base-cased and yelp_review_full
# (and accuracy computed with numpy in place of `evaluate`), and use_cpu=True in TrainingArguments (without it,
# transformers on a machine without GPUs does not use the process group: each worker would train alone, in Ray
# Train as here). tests/parity/test_transformers.py runs it on 2 workers;
# bench/bench_frameworks.py runs it beside Ray Train, converting `trainlib` back to `ray.train`.
import os

import numpy as np
import torch
from transformers import (
    Trainer,
    TrainingArguments,
    BertConfig,
    AutoModelForSequenceClassification,
)

import trainlib.huggingface.transformers
from trainlib import ScalingConfig
from trainlib.torch import TorchTrainer

NUM_LABELS = 5
SEQUENCE_LENGTH = 32


class SmallReviews(torch.utils.data.Dataset):
    """Generated "reviews": token ids whose label is the review's most frequent token class."""

    def __init__(self, n, seed):
        generator = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(5, 100, (n, SEQUENCE_LENGTH), generator=generator)
        self.labels = (self.input_ids % NUM_LABELS).mode(dim=1).values

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {
            "input_ids": self.input_ids[i],
            "attention_mask": torch.ones(SEQUENCE_LENGTH, dtype=torch.long),
            "labels": self.labels[i],
        }


# [1] Encapsulate data preprocessing, training, and evaluation
# logic in a training function
# ============================================================
def train_func():
    # Datasets
    small_train_dataset = SmallReviews(64, seed=0)
    small_eval_dataset = SmallReviews(32, seed=1)

    # Model
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQUENCE_LENGTH,
        num_labels=NUM_LABELS,
    )
    model = AutoModelForSequenceClassification.from_config(config)

    # Evaluation Metrics
    def compute_metrics(eval_pred):
        logits, labels = eval_pred
        predictions = np.argmax(logits, axis=-1)
        return {"accuracy": float((predictions == labels).mean())}

    # Hugging Face Trainer
    training_args = TrainingArguments(
        output_dir="test_trainer",
        eval_strategy="epoch",
        save_strategy="epoch",
        report_to="none",
        use_cpu=True,
    )

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=small_train_dataset,
        eval_dataset=small_eval_dataset,
        compute_metrics=compute_metrics,
    )

    # [2] Report Metrics and Checkpoints to Ray Train
    # ===============================================
    callback = trainlib.huggingface.transformers.RayTrainReportCallback()
    trainer.add_callback(callback)

    # [3] Prepare Transformers Trainer
    # ================================
    trainer = trainlib.huggingface.transformers.prepare_trainer(trainer)

    # Start Training
    trainer.train()


# [4] Define a Ray TorchTrainer to launch `train_func` on all workers
# ===================================================================
ray_trainer = TorchTrainer(
    train_func,
    scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
    # [4a] For multi-node clusters, configure persistent storage that is
    # accessible across all worker nodes
    # run_config=trainlib.RunConfig(storage_path="s3://..."),
)
result: trainlib.Result = ray_trainer.fit()

# [5] Load the trained model
with result.checkpoint.as_directory() as checkpoint_dir:
    checkpoint_path = os.path.join(
        checkpoint_dir,
        trainlib.huggingface.transformers.RayTrainReportCallback.CHECKPOINT_NAME,
    )
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint_path)
