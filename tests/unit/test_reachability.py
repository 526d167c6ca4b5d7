"""Guard rails for clusters with nodes on other hosts (tasks.reachability), on fake node lists."""

from __future__ import annotations

import pytest

from tasks.domain.reachability import UnreachableFromClusterError, check_reachable, local_addresses, remote_nodes

LOCAL = {"127.0.0.1", "::1", "192.168.7.10"}  # this machine, as the check sees it
GOOD = {
    "prefect_api_url": "http://192.168.7.10:4200/api",
    "mlflow_tracking_uri": "http://mlflow.internal:5000",
    "storage_path": "s3://team-bucket/runs",
}


def refusal(node_ips, **settings) -> str:
    with pytest.raises(UnreachableFromClusterError) as info:
        check_reachable(node_ips, local=LOCAL, **{**GOOD, **settings})
    return str(info.value)


def test_loopback_nodes_of_this_machine_are_not_refused():
    # 127.0.0.2 / 127.0.0.3 nodes (the test cluster) and this machine's own IP can reach 127.0.0.1.
    check_reachable(
        ["127.0.0.2", "127.0.0.3", "192.168.7.10"],
        local=LOCAL,
        prefect_api_url="http://127.0.0.1:4200/api",
        mlflow_tracking_uri="sqlite:////tmp/mlflow.db",
        storage_path="/tmp/runs",
    )
    assert remote_nodes(["127.0.0.2", "192.168.7.10", "::1"], LOCAL) == []


def test_remote_node_refuses_loopback_prefect_url():
    message = refusal(["127.0.0.2", "10.0.3.7"], prefect_api_url="http://127.0.0.1:4200/api")
    assert "10.0.3.7" in message and "PREFECT_API_URL='http://127.0.0.1:4200/api'" in message
    assert "--host 0.0.0.0" in message
    assert "localhost" in refusal(["10.0.3.7"], prefect_api_url="http://localhost:4200/api")


def test_remote_node_refuses_sqlite_and_local_mlflow_stores():
    message = refusal(["10.0.3.7"], mlflow_tracking_uri="sqlite:////home/me/mlflow.db")
    assert "mlflow_tracking_uri='sqlite:////home/me/mlflow.db'" in message and "mlflow server" in message
    assert "MLflow server" in refusal(["10.0.3.7"], mlflow_tracking_uri="/home/me/mlruns")
    assert "loopback" in refusal(["10.0.3.7"], mlflow_tracking_uri="http://127.0.0.1:5000")


def test_remote_node_refuses_plain_local_storage_path_but_not_shared_urls():
    message = refusal(["10.0.3.7"], storage_path="/home/me/runs")
    assert "storage_path='/home/me/runs'" in message and "s3://" in message and "file:///mnt/shared/runs" in message
    for shared in ("s3://bucket/runs", "file:///mnt/nfs/runs", "gs://b/r"):
        check_reachable(["10.0.3.7"], local=LOCAL, **{**GOOD, "storage_path": shared})


def test_every_problem_is_listed_at_once():
    message = refusal(
        ["10.0.3.7", "10.0.3.8"],
        prefect_api_url="http://127.0.0.1:4200/api",
        mlflow_tracking_uri="sqlite:///mlflow.db",
        storage_path="runs",
    )
    assert message.count("\n- ") == 3 and "10.0.3.8" in message


def test_this_machine_addresses_include_loopback():
    assert {"127.0.0.1"} <= local_addresses()


def test_remote_node_refuses_local_mirror_folders():
    message = refusal(["10.0.3.7"], mirrors=["/data/fashion-mnist", "https://mirror.example/fmnist/"])
    assert "mirrors='/data/fashion-mnist'" in message and "https://mirror.example" not in message
