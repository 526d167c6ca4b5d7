"""The pipeline's domain code: data, network, training loop, scoring, plots, promotion, defaults.

Plain Python, PyTorch, fsspec and MLflow; never Prefect (a unit test pins that). Runs wherever
it is called: on the driver (flow and task processes) and, for the data and training-loop
modules, inside trainlib's worker actors. The Prefect task wrappers live one level up, in
``tasks/``.
"""
