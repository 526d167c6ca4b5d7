"""Hugging Face integrations: ``trainlib.huggingface.transformers`` (Ray Train's ``ray.train.huggingface``)."""
