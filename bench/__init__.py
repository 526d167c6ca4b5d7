"""trainlib's benchmarks: ``python -m bench`` lists them, ``python -m bench NAME [ARGS...]`` runs one (bench/__main__.py).

Each benchmark writes one latest result, ``bench/results/NAME.{json,md}`` (``results_files.py``); docs/benchmarks.md
holds the method, the current figures and the decisions they support.
"""
