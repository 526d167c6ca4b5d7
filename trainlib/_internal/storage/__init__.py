"""The run folder on fsspec: run storage, checkpoint commits, retention, the run record. Driver and workers."""
