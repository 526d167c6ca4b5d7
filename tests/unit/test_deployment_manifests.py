"""The container and Kubernetes path, checked on paper: Dockerfile, deployments/kubernetes/, prefect.yaml.

Nothing here builds the image or applies the manifests (no container runtime or cluster in CI).
These tests check that the files parse and agree with each other and with the code: one image
name and tag, one Ray version, one namespace and secrets, the same flow entrypoint as the root
prefect.yaml, parameters that the flow's own model accepts, and addresses that the pipeline's
reach guard would accept on a multi-host cluster.
"""

from __future__ import annotations

import importlib
import json
import os
import re

import pytest
import yaml

from flows.params import PipelineParams
from tasks.domain.reachability import check_reachable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "deployments", "kubernetes")


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


@pytest.fixture(scope="module")
def files():
    pyproject = _read("pyproject.toml")
    return {
        "dockerfile": _read("Dockerfile"),
        "pyproject": pyproject,
        "version": re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1),
        "raycluster": yaml.safe_load(_read("deployments", "kubernetes", "raycluster.yaml")),
        "k8s_prefect": yaml.safe_load(_read("deployments", "kubernetes", "prefect.yaml")),
        "root_prefect": yaml.safe_load(_read("prefect.yaml")),
        "work_pool": json.loads(_read("deployments", "kubernetes", "work-pool.json")),
    }


def _containers(raycluster: dict) -> list[dict]:
    groups = [raycluster["spec"]["headGroupSpec"], *raycluster["spec"]["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def _deployment(files) -> dict:
    [deployment] = files["k8s_prefect"]["deployments"]
    return deployment


def test_one_image_everywhere(files):
    image = f"trainlib-pipeline:{files['version']}"
    assert f"docker build -t {image} ." in files["dockerfile"]
    assert {c["image"] for c in _containers(files["raycluster"])} == {image}
    assert _deployment(files)["work_pool"]["job_variables"]["image"] == image
    assert files["work_pool"]["variables"]["properties"]["image"]["default"] == image


def test_dockerfile_installs_what_pyproject_declares(files):
    docker = files["dockerfile"]
    python = re.search(r"^FROM python:(\d+)\.(\d+)", docker, re.M)
    minimum = re.search(r'requires-python = ">=(\d+)\.(\d+)"', files["pyproject"])
    assert python and (int(python[1]), int(python[2])) >= (int(minimum[1]), int(minimum[2]))
    for package in ("torch", "torchvision"):
        pinned = re.search(rf"{package}==([\d.]+)", docker)[1]
        assert f'"{package}>=' in files["pyproject"] and f"<={pinned}" in files["pyproject"], package
    packages = re.search(r"include = \[([^\]]+)\]", files["pyproject"])[1]
    for name in re.findall(r'"(\w+)\*"', packages):
        assert re.search(rf"^COPY {name} \./{name}$", docker, re.M), f"the image lacks the package {name}"
    assert re.search(r"^RUN pip install \. ", docker, re.M)  # a regular install, importable anywhere
    ray_pin = re.search(r'"ray\[default\]==([\d.]+)"', docker)[1]
    assert files["raycluster"]["spec"]["rayVersion"] == ray_pin


def test_image_home_and_working_directory_match_the_deployment(files):
    docker = files["dockerfile"]
    workdir = re.search(r"^WORKDIR (\S+)", docker, re.M)[1]
    [pull] = files["k8s_prefect"]["pull"]
    assert pull["prefect.deployments.steps.set_working_directory"]["directory"] == workdir
    home = re.search(r"TRAINLIB_HOME=(\S+)", docker)[1]
    assert _deployment(files)["work_pool"]["job_variables"]["env"]["TRAINLIB_HOME"] == home
    assert files["work_pool"]["variables"]["properties"]["env"]["default"]["TRAINLIB_HOME"] == home


def test_same_flow_as_the_process_deployment(files):
    # The training deployment of the root prefect.yaml (score-images beside it runs another flow).
    [process] = [d for d in files["root_prefect"]["deployments"] if d["entrypoint"].startswith("flows.pipeline:")]
    k8s = _deployment(files)
    assert k8s["entrypoint"] == process["entrypoint"]
    module, name = k8s["entrypoint"].split(":")
    flow = getattr(importlib.import_module(module), name)
    assert flow.name == "training-pipeline"
    assert k8s["enforce_parameter_schema"] is True
    assert k8s["schedules"][0]["cron"] == process["schedules"][0]["cron"]


def test_parameters_are_valid_and_reach_from_another_host(files):
    params = PipelineParams.parse(_deployment(files)["parameters"]["params"])
    meta = files["raycluster"]["metadata"]
    assert params.ray_address == f"{meta['name']}-head-svc.{meta['namespace']}.svc.cluster.local:6379"
    # What the pipeline's guard checks before any work on a cluster with nodes on other hosts.
    check_reachable(
        ["10.42.0.7", "10.42.1.3"],
        local={"127.0.0.1"},
        prefect_api_url="http://prefect-server.trainlib.svc.cluster.local:4200/api",
        mlflow_tracking_uri=params.mlflow_tracking_uri,
        storage_path=params.storage_path,
        mirrors=params.mirrors or (),
    )


def test_namespace_token_auth_and_secrets_agree(files):
    namespace = files["raycluster"]["metadata"]["namespace"]
    job_variables = _deployment(files)["work_pool"]["job_variables"]
    assert job_variables["namespace"] == namespace
    assert files["work_pool"]["variables"]["properties"]["namespace"]["default"] == namespace
    pod = files["work_pool"]["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]
    for container in _containers(files["raycluster"]):
        assert {"name": "RAY_AUTH_MODE", "value": "token"} in container["env"]
        assert container["envFrom"] == pod["envFrom"]  # the same token and S3 secrets on nodes and drivers
    assert job_variables["env"]["RAY_AUTH_MODE"] == "token"


def test_work_pool_template_declares_every_variable(files):
    template = json.dumps(files["work_pool"]["job_configuration"])
    used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", template))
    declared = set(files["work_pool"]["variables"]["properties"])
    assert used <= declared, used - declared
    assert set(_deployment(files)["work_pool"]["job_variables"]) <= declared
