"""``python -m trainlib SCRIPT [ARGS...]``: run a training script with trainlib's local Ray started before its
imports, so the workers import torch while the script does (trainlib/_internal/startup/launch.py)."""

import sys

from trainlib._internal.startup.launch import main

if __name__ == "__main__":
    sys.exit(main())
