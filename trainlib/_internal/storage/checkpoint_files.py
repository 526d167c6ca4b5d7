"""The files of a local checkpoint folder, with its symlinks checked. Runs in worker actors (and the driver).

A symlink is never followed out of the checkpoint folder: a link to a file outside it (say
``/etc/passwd`` or a credentials file) would copy that file into run storage, so report()
refuses it, as it refuses a link to any folder (whose walk could leave the folder or loop).
A link to a file inside the folder is stored as a regular copy of that file: its content is
part of the checkpoint anyway, and object stores have no links.
"""

from __future__ import annotations

import dataclasses
import os

from trainlib._internal.storage.commits import COMMIT_MARKER


@dataclasses.dataclass(frozen=True)
class CheckpointFile:
    """One file to store: its path relative to the checkpoint folder (``/``-separated) and on local disk."""

    rel: str
    local_path: str
    size: int


def checkpoint_files(folder: str) -> list[CheckpointFile]:
    """Every file under ``folder`` to store, links checked; the commit marker of a copied checkpoint left out.

    Raises:
        ValueError: a symlink leads out of the folder, or to a folder.
    """
    root = os.path.realpath(folder)
    out: list[CheckpointFile] = []
    for current, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            path = os.path.join(current, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            if os.path.islink(path):
                _check_link(folder, root, path, rel)
            if name in files and rel != COMMIT_MARKER:
                out.append(CheckpointFile(rel=rel, local_path=path, size=os.path.getsize(path)))
    return out


def _check_link(folder: str, root: str, path: str, rel: str) -> None:
    target = os.readlink(path)
    resolved = os.path.realpath(path)
    if os.path.isdir(resolved):
        raise ValueError(
            f"trainlib.report(): the checkpoint folder {folder} holds a symlink to a folder, {rel!r} -> {target!r}; "
            "links to folders are not stored (they could lead out of the checkpoint). Copy that folder's files into "
            "the checkpoint folder instead of linking them."
        )
    if os.path.commonpath([root, resolved]) != root:
        raise ValueError(
            f"trainlib.report(): the checkpoint folder {folder} holds a symlink leading out of it, {rel!r} -> "
            f"{target!r} ({resolved}); trainlib never follows links out of a checkpoint, so that no file outside it "
            "reaches run storage. If the checkpoint needs that file, copy it into the folder."
        )
    if not os.path.exists(resolved):
        raise ValueError(
            f"trainlib.report(): the symlink {rel!r} -> {target!r} in the checkpoint folder {folder} "
            "is broken (its target does not exist): remove it or copy the file in."
        )
