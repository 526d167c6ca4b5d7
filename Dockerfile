# The pipeline image: one image for the Ray head and worker pods (KubeRay), the Prefect Kubernetes
# worker's flow-run pods and `ray job submit` drivers. Same Python, Ray, torch and code everywhere.
#
#   docker build -t trainlib-pipeline:0.1.0 .
#
# NOT BUILT OR RUN in this repository's CI (no container runtime there); tests/unit/test_deployment_manifests.py
# checks that it agrees with pyproject.toml, prefect.yaml and deployments/kubernetes/.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRAINLIB_HOME=/var/lib/trainlib

WORKDIR /opt/trainlib

# CPU wheels of the torch release pyproject.toml allows (swap the index for a CUDA build on GPU nodes).
RUN pip install torch==2.14.1 torchvision==0.29.1 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY trainlib ./trainlib
COPY tasks ./tasks
COPY flows ./flows
COPY deployments ./deployments
COPY prefect.yaml ./
# A regular (non-editable) install: trainlib, tasks and flows import from any working directory. Ray is
# pinned to the RayCluster's rayVersion: every node and driver must run the same Ray.
RUN pip install . "ray[default]==2.60.0" && mkdir -p "$TRAINLIB_HOME"

# Ray's default ports: GCS, Ray Client, dashboard (Ray Jobs), and the worker's metrics.
EXPOSE 6379 10001 8265 8080

CMD ["python", "-m", "flows.main", "--help"]
