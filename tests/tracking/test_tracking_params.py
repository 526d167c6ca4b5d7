"""Unit tests of the tracker-independent helpers: flattening, secrets, truncation, the spool. No servers."""

from __future__ import annotations

import subprocess
import sys

from trainlib._internal.tracking.params import flatten, params_for_logging, truncate
from trainlib._internal.tracking.spool import Spool, describe_records
from trainlib._internal.util.masking import REDACTED, redact_text, redact_url


def test_flatten_nested_config_into_dotted_keys():
    assert flatten({"a": {"b": {"c": 1}, "d": [1, 2]}, "e": "x", "f": {}}) == {
        "a.b.c": 1,
        "a.d": [1, 2],
        "e": "x",
        "f": {},
    }


def test_secret_keys_are_redacted_at_any_depth_and_other_values_kept():
    params = params_for_logging(
        {
            "": {
                "lr": 0.1,
                "s3": {"aws_secret_access_key": "abc", "endpoint_url": "http://x"},
                "api_token": "t",
                "db_password": "p",
                "Credentials": {"x": 1},
                "layers": [64, 32],
            },
            "scaling_config": {"num_workers": 2},
        },
        250,
        6000,
    )
    assert params == {
        "lr": "0.1",
        "s3.aws_secret_access_key": REDACTED,
        "s3.endpoint_url": "http://x",
        "api_token": REDACTED,
        "db_password": REDACTED,
        "Credentials.x": REDACTED,
        "layers": "[64, 32]",
        "scaling_config.num_workers": "2",
    }


def test_secret_looking_values_are_redacted_whatever_the_key():
    text = redact_text("id AKIAIOSFODNN7EXAMPLE url https://bob:hunter2@db.example.com/x")
    assert "AKIAIOSFODNN7EXAMPLE" not in text and "hunter2" not in text
    assert "https://bob:[REDACTED]@db.example.com/x" in text
    assert redact_url("http://u:pw@127.0.0.1:5000") == "http://u:[REDACTED]@127.0.0.1:5000"
    assert redact_url("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_long_values_and_keys_are_cut_to_the_limit_and_marked():
    assert truncate("abc", 5) == "abc"
    cut = truncate("x" * 100, 50)
    assert len(cut) == 50 and cut.endswith("...[truncated]")
    params = params_for_logging({"": {"k" * 300: "v", "note": "y" * 7000}}, 250, 6000)
    assert all(len(k) <= 250 for k in params) and len(params["note"]) == 6000


def test_spool_appends_reads_rewrites_and_describes(tmp_path):
    spool = Spool(str(tmp_path / "s" / "spool.jsonl"))
    for step in (2, 3, 4, 7):
        spool.append({"kind": "metrics", "run_id": "r", "step": step, "metrics": {"loss": 1.0}})
    spool.append({"kind": "artifacts", "run_id": "r", "artifact_path": "checkpoints/checkpoint_000007"})
    spool.append({"kind": "status", "run_id": "r", "status": "FINISHED"})
    assert len(spool) == 6
    assert describe_records(spool.read()) == (
        "metrics loss at steps 2-4, 7; artifacts checkpoints/checkpoint_000007; the final status FINISHED"
    )
    spool.rewrite(spool.read()[4:])
    assert [r["kind"] for r in spool.read()] == ["artifacts", "status"]
    spool.rewrite([])
    assert not (tmp_path / "s" / "spool.jsonl").exists()


def test_import_trainlib_does_not_import_mlflow():
    code = "import sys, trainlib, trainlib.torch; assert 'mlflow' not in sys.modules, 'mlflow imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
