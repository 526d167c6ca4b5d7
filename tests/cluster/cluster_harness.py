"""A real Ray cluster started the way an operator starts one, for the cluster tests (test process only).

``ray start --head`` on 127.0.0.2 and ``ray start --address=...`` for more nodes on
127.0.0.3, 127.0.0.4...: each node is its own raylet with its own node IP, started
from the CLI as on a real machine, with token authentication (Ray 2.60 turns it on
at ``ray start --head``): every node and driver runs with ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN_PATH`` naming the cluster's own token file, written here, so a
fresh machine needs no ~/.ray/auth_token and this machine's is never read or
written. Every port is chosen free, the cluster has its own short temp dir, and
it is stopped by killing its own process groups, never with ``ray stop`` (that
would stop every Ray on this machine). ``ray start`` rewrites
/tmp/ray/ray_current_cluster, so drivers always pass the address.

A node started ``without_code`` cannot import trainlib, tasks or flows: its
raylet (and so every worker process it starts) runs in a private mount
namespace where the repository and every folder the venv's editable install
points at are empty tmpfs mounts (the venv itself is bound back in place), with
no PYTHONPATH and ``/`` as its working directory. The files are not there, so
neither a stray ``sys.path`` entry nor Ray's habit of adding the driver's working
directory to the workers' path can find them; only what the job ships
(``runtime_env`` ``py_modules``, or code pickled by value) reaches that node.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import glob
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from conftest import free_port

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
HEAD_IP = "127.0.0.2"
NODE_START_TIMEOUT_S = 120.0
PROJECT_PACKAGES = ("trainlib", "tasks", "flows", "deployments")


def _free_ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


def hidden_folders() -> list[str]:
    """Folders to hide from a node without the code: the repo and every editable-install target."""
    folders = {REPO_ROOT}
    for pth in glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "*.pth")):
        with open(pth) as f:
            for line in f:
                line = line.strip()
                if (
                    line
                    and not line.startswith(("#", "import"))
                    and os.path.isdir(line)
                    and any(os.path.isdir(os.path.join(line, p)) for p in PROJECT_PACKAGES)
                ):
                    folders.add(os.path.abspath(line))
    # setuptools' strict editable installs map packages in a finder module instead of a .pth path;
    # a clone sharing another checkout's venv imports the project from that checkout.
    for finder in glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "__editable__*finder.py")):
        with open(finder) as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if any(getattr(t, "id", None) == "MAPPING" for t in targets):
                for package, folder in ast.literal_eval(node.value).items():
                    if package in PROJECT_PACKAGES:
                        folders.add(os.path.dirname(os.path.abspath(folder)))
    return sorted(folders)


def can_hide_code() -> str | None:
    """None when this machine can start a node without the code (mount namespaces), else why not."""
    if not shutil.which("unshare"):
        return "`unshare` (util-linux) is not installed"
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /mnt"]
    if os.geteuid() != 0:
        cmd[1:1] = ["--user", "--map-root-user"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot create a private mount namespace here ({done.stderr.strip()[:200]})"
    return None


@dataclasses.dataclass
class RayNode:
    """One `ray start`ed node: its IP, the process group of its daemons and whether it has the repo."""

    ip: str
    pgid: int
    log_path: str
    with_code: bool
    node_id: str = ""

    def processes(self) -> list[Any]:
        """The node's daemons (its process group) and every process they started (Ray's workers)."""
        import psutil

        found = {}
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error, OSError):  # gone meanwhile
                if os.getpgid(proc.pid) == self.pgid:
                    found[proc.pid] = proc
                    for child in proc.children(recursive=True):
                        found[child.pid] = child
        return list(found.values())

    def alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
            return True
        except ProcessLookupError:
            return False


class LocalRayCluster:
    """A head node on 127.0.0.2 (dashboard, Ray Client server) plus nodes added with :meth:`add_node`.

    Args:
        node_env: environment for every node (e.g. S3 endpoint and credentials, which a real
            cluster's nodes get from their operator).
        dashboard: start the dashboard on the head (needed by ``ray job submit``).
    """

    def __init__(self, node_env: dict[str, str] | None = None, dashboard: bool = True):
        self.root = tempfile.mkdtemp(prefix="trc", dir="/tmp")  # short: Unix socket paths are <108 chars
        self.node_env = dict(node_env or {})
        self.dashboard = dashboard
        self.nodes: list[RayNode] = []
        self.port = self.dashboard_port = self.client_port = 0
        self.token_path = os.path.join(self.root, "auth_token")
        with open(os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(32))  # as `ray get-auth-token --generate`

    @property
    def auth_env(self) -> dict[str, str]:
        """What every node and driver of this cluster needs to authenticate: token mode and the token's file."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.token_path}

    # -- addresses -------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """The GCS address drivers and nodes use (``ray.init(address=...)``)."""
        return f"{HEAD_IP}:{self.port}"

    @property
    def client_address(self) -> str:
        return f"ray://{HEAD_IP}:{self.client_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://{HEAD_IP}:{self.dashboard_port}"

    def driver_env(self, **extra: str) -> dict[str, str]:
        """Environment for a driver process: token auth on, no inherited Ray address or Prefect/MLflow."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "PREFECT_", "MLFLOW_"))}
        env.update(self.auth_env, RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=REPO_ROOT)
        env.update(extra)
        return env

    # -- lifecycle -------------------------------------------------------------------------------

    def start_head(self, num_cpus: int = 1) -> RayNode:
        self.port, self.dashboard_port, self.client_port = _free_ports(3)
        args = [
            "--head",
            "--port",
            str(self.port),
            "--ray-client-server-port",
            str(self.client_port),
            "--temp-dir",
            self.root,
        ]
        if self.dashboard:
            args += [
                "--include-dashboard",
                "true",
                "--dashboard-host",
                HEAD_IP,
                "--dashboard-port",
                str(self.dashboard_port),
            ]
        else:
            args += ["--include-dashboard", "false"]
        return self._start(HEAD_IP, num_cpus, args, with_code=True)

    def add_node(
        self, ip: str, num_cpus: int = 1, with_code: bool = False, resources: dict[str, float] | None = None
    ) -> RayNode:
        """Start another node at ``ip``; ``with_code=False`` hides the repository from it."""
        args = ["--address", self.address]
        if resources:
            args += ["--resources", json.dumps(resources)]
        return self._start(ip, num_cpus, args, with_code=with_code)

    def _start(self, ip: str, num_cpus: int, args: list[str], with_code: bool) -> RayNode:
        agent, agent_grpc, metrics, runtime_env_agent, node_manager, object_manager = _free_ports(6)
        cmd = [
            f"{BIN}/ray",
            "start",
            "--node-ip-address",
            ip,
            "--num-cpus",
            str(num_cpus),
            *args,
            "--object-store-memory",
            str(200 * 1024 * 1024),
            "--disable-usage-stats",
            "--dashboard-agent-listen-port",
            str(agent),
            "--dashboard-agent-grpc-port",
            str(agent_grpc),
            "--metrics-export-port",
            str(metrics),
            "--runtime-env-agent-port",
            str(runtime_env_agent),
            "--node-manager-port",
            str(node_manager),
            "--object-manager-port",
            str(object_manager),
            "--min-worker-port",
            "0",
            "--max-worker-port",
            "0",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "PREFECT_", "MLFLOW_"))}
        # The venv is active on every node, as an operator's node has it: `python` is its Python.
        env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
        env.update(
            self.node_env,
            **self.auth_env,
            RAY_USAGE_STATS_ENABLED="0",
            # A stopped node is declared dead in ~3 s instead of ~15 s.
            RAY_health_check_period_ms="1000",
            RAY_health_check_failure_threshold="3",
        )
        cwd = REPO_ROOT
        if with_code:
            env["PYTHONPATH"] = REPO_ROOT
        else:
            env.pop("PYTHONPATH", None)
            cwd = "/"
            cmd = self._without_code(cmd)
        log_path = os.path.join(self.root, f"node-{ip}.log")
        with open(log_path, "wb") as log:
            # Its own session, so the node's daemons share one process group we can kill.
            process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
            )
        node = RayNode(ip=ip, pgid=process.pid, log_path=log_path, with_code=with_code)
        self.nodes.append(node)
        try:
            returncode = process.wait(timeout=NODE_START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            returncode = None
        if returncode != 0:
            raise RuntimeError(f"`ray start` for node {ip} failed ({returncode}):\n{self.log_tail(node)}")
        node.node_id = self._wait_registered(ip)
        return node

    def _without_code(self, cmd: list[str]) -> list[str]:
        """Wrap ``cmd`` in a mount namespace where the repo (and its editable targets) are empty."""
        keep = os.path.join(self.root, "keep-venv")
        lines = ["set -e"]
        hidden = hidden_folders()
        venv_hidden = any(sys.prefix == h or sys.prefix.startswith(h + os.sep) for h in hidden)
        if venv_hidden:
            lines += [f"mkdir -p {shlex.quote(keep)}", f"mount --bind {shlex.quote(sys.prefix)} {shlex.quote(keep)}"]
        lines += [f"mount -t tmpfs tmpfs {shlex.quote(h)}" for h in hidden]
        if venv_hidden:
            lines += [
                f"mkdir -p {shlex.quote(sys.prefix)}",
                f"mount --bind {shlex.quote(keep)} {shlex.quote(sys.prefix)}",
            ]
        lines += ["cd /", "exec " + " ".join(shlex.quote(c) for c in cmd)]
        script = os.path.join(self.root, f"hide-code-{len(self.nodes)}.sh")
        with open(script, "w") as f:
            f.write("\n".join(lines) + "\n")
        wrapper = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:
            wrapper += ["--user", "--map-root-user"]
        return [*wrapper, "bash", script]

    def _wait_registered(self, ip: str) -> str:
        """Wait until the GCS lists an alive node at ``ip``; return its node id."""
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while time.monotonic() < deadline:
            for node in self.list_nodes():
                if node["NodeManagerAddress"] == ip and node["Alive"]:
                    return node["NodeID"]
            time.sleep(0.5)
        raise RuntimeError(f"node {ip} did not register with the GCS at {self.address}")

    @contextlib.contextmanager
    def token_auth_here(self):
        """This process's Ray client sends the cluster's token inside the block; its settings come back after."""
        from unittest import mock

        try:
            with mock.patch.dict(os.environ, self.auth_env):  # restores the variables after the block
                self._reload_auth()
                yield
        finally:
            self._reload_auth()

    @staticmethod
    def _reload_auth() -> None:
        import ray._raylet

        # Re-read RAY_AUTH_MODE (read at import) and drop the cached token, as ray.init does for a new cluster.
        ray._raylet.Config.initialize("")
        ray._raylet.AuthenticationTokenLoader.instance().reset_cache()

    def list_nodes(self) -> list[dict[str, Any]]:
        """The GCS's node table, read by a short driver process (this process keeps its own Ray)."""
        code = (
            "import json, ray; ray.init(address=%r, log_to_driver=False, logging_level='ERROR'); "
            "print('NODES=' + json.dumps([{k: n[k] for k in ('NodeID', 'NodeManagerAddress', 'Alive', "
            "'Resources')} for n in ray.nodes()]))" % self.address
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env=self.driver_env(),
            cwd=self.root,
        )
        for line in done.stdout.splitlines():
            if line.startswith("NODES="):
                return json.loads(line[len("NODES=") :])
        raise RuntimeError(f"could not list the nodes of {self.address}:\n{done.stderr[-3000:]}")

    def kill_node(self, node: RayNode, sig: int = signal.SIGKILL) -> None:
        """Stop a node abruptly (its raylet and every worker it started), as a lost machine would."""
        import psutil

        for proc in node.processes():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)

    def stop(self) -> None:
        """Stop every node by process group (workers included), then anything still running from our temp dir."""
        import psutil

        for node in reversed(self.nodes):
            self.kill_node(node, signal.SIGTERM)
        # A test cluster keeps nothing worth a graceful stop; a node killed by a test leaves zombies
        # in its process group that would hold a longer wait to its end.
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and any(n.alive() for n in self.nodes):
            time.sleep(0.2)
        for node in self.nodes:
            self.kill_node(node)
        # Every daemon of every node names the session folder under self.root on its command line.
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if any(self.root in arg for arg in proc.info["cmdline"] or []):
                    proc.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def session_log_tails(self, pattern: str, n: int = 3000) -> str:
        """The tails of the head's Ray session logs named like ``pattern`` (a glob), for a failure message: the
        cluster's folder is removed when the module ends."""
        tails = []
        for path in sorted(glob.glob(os.path.join(self.root, "session_latest", "logs", pattern))):
            with open(path, errors="replace") as f:
                tails.append(f"--- {os.path.basename(path)}:\n{f.read()[-n:]}")
        return "\n".join(tails) or f"(no session log named {pattern} under {self.root})"

    def log_tail(self, node: RayNode, n: int = 4000) -> str:
        try:
            with open(node.log_path, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return "(no log)"
