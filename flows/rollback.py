"""Roll the champion back: ``python -m flows.rollback --model NAME --to-version N --reason "..."``.

Runs in a person's shell. Moves the ``champion`` alias of a registered model to an earlier version
and records who (``--by``, default the OS user) and why on both versions and on the registered
model (:mod:`tasks.domain.rollback`). The MLflow store is the pipeline's (``$MLFLOW_TRACKING_URI``,
else the pipeline home's), or ``--tracking-uri``. The next pipeline run compares its challenger
with the restored champion.

Exit status: 0 done, 2 a bad option (the message says which and the fix).
"""

from __future__ import annotations

import argparse
import getpass
import sys

from tasks.domain.home import PipelineHome
from tasks.domain.rollback import RollbackError, rollback_champion
from tasks.domain.urls import mask_url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.rollback", description=__doc__.split("\n\n")[1])
    parser.add_argument("--model", required=True, help="The registered model, e.g. fashion-mnist-resnet18.")
    parser.add_argument("--to-version", required=True, help="The version that becomes champion again.")
    parser.add_argument("--reason", required=True, help="Why (recorded on the versions and the model).")
    parser.add_argument("--by", default=None, help="Who rolls back (default: the OS user).")
    parser.add_argument(
        "--tracking-uri", default=None, help="The MLflow store (default: $MLFLOW_TRACKING_URI, else the home's)."
    )
    args = parser.parse_args(argv)
    tracking_uri = args.tracking_uri or PipelineHome.resolve().mlflow_tracking_uri
    try:
        record = rollback_champion(tracking_uri, args.model, args.to_version, args.reason, args.by or getpass.getuser())
    except RollbackError as exc:
        print(f"python -m flows.rollback: error: {exc}", file=sys.stderr)
        return 2
    print(f"Rolled back in {mask_url(tracking_uri)}: {record.sentence()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
