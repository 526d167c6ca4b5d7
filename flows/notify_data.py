"""Tell the retraining deployment that new data arrived: ``python -m flows.notify_data SOURCE [--always]``.

Runs wherever new files land (an upload script, a cron job, a CI step), with ``PREFECT_API_URL`` set.
It lists ``SOURCE`` (a folder or manifest, local or an fsspec URL; content hashes are cached, so this is
a listing, not a training) and emits the Prefect event ``trainlib.data.arrived`` with the source in its
resource when the snapshot's digest differs from the last one it emitted for that source (kept in a
Prefect variable, so every machine that notifies shares it); ``--always`` emits anyway. The retraining
deployment in ``prefect.yaml`` has a trigger on that event; its concurrency limit of 1 queues a burst.

Exit status: 0 (the line printed says whether an event was emitted), 2 a bad source.
"""

from __future__ import annotations

import argparse
import hashlib
import sys

from tasks.domain.data_source import DataSourceError, check_source
from tasks.domain.home import PipelineHome
from tasks.domain.snapshot import take_snapshot
from tasks.domain.urls import mask_url
from tasks.events import emit_data_arrived

VARIABLE_PREFIX = "trainlib_data_digest_"


def digest_variable(source: str) -> str:
    """The Prefect variable that holds the last digest emitted for ``source`` (names allow [a-z0-9_])."""
    return VARIABLE_PREFIX + hashlib.sha256(source.encode()).hexdigest()[:16]


def notify(source: str, always: bool = False, cache_dir: str | None = None) -> bool:
    """List ``source``; emit ``trainlib.data.arrived`` when its digest changed (or ``always``). True: emitted."""
    from prefect.events.worker import EventsWorker
    from prefect.variables import Variable

    check_source(source)
    snapshot = take_snapshot(source, cache_dir=cache_dir or PipelineHome.resolve().data_cache)
    shown = mask_url(source)
    name = digest_variable(shown)
    if not always and Variable.get(name, default=None) == snapshot.digest:
        print(f"{shown}: unchanged (digest {snapshot.digest[:12]}, {len(snapshot.entries)} images): no event")
        return False
    emit_data_arrived(shown, snapshot.digest, len(snapshot.entries))
    EventsWorker.drain_all(timeout=30)  # sent before this process exits
    Variable.set(name, snapshot.digest, overwrite=True)
    print(f"{shown}: digest {snapshot.digest[:12]}, {len(snapshot.entries)} images: emitted trainlib.data.arrived")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.notify_data", description=__doc__.split("\n\n")[1])
    parser.add_argument("source", help="The folder or manifest source (local path or fsspec URL).")
    parser.add_argument("--always", action="store_true", help="Emit even when the digest is the last one emitted.")
    parser.add_argument("--cache-dir", default=None, help="The hash cache (default: the pipeline home's data cache).")
    args = parser.parse_args(argv)
    try:
        notify(args.source, args.always, args.cache_dir)
    except DataSourceError as exc:
        print(f"python -m flows.notify_data: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
