"""The Ray backend: each ``vllm serve`` in its own Ray actor on the node its placement names, the load client in an
actor on the same node. The only module that imports Ray (``pip install -e .[ray]``); the runner loads it by name
when ``[cluster] backend = "ray"``, so the local backend never needs Ray.

Inside the actors run the same :class:`harness.run.server.VllmServer` and :class:`harness.run.load.LoadClient` as
locally (same readiness rule — a real completion —, same SIGTERM, grace, SIGKILL), with one addition: their process
groups carry a :mod:`harness.run.reaper`, so a killed actor or a lost node leaves no server behind. Logs and bench
results are written on the node and copied into the run directory (logs every second, results after each level),
so the run directory is the same whether the node shares the driver's disk or not.

Placement (Ray 2.60 scheduling): a node id → ``NodeAffinitySchedulingStrategy(node_id, soft=False)``; labels →
``label_selector``; a custom resource → ``resources={name: 0.001}``. Actors ask for ``num_cpus=0``: the server's
threads are vLLM's, pinned by ``VLLM_CPU_OMP_THREADS_BIND`` where the placement says so, not Ray's CPU slots.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from harness.run import cluster as cluster_info
from harness.run.load import LevelError, LoadClient
from harness.run.placement import Slot
from harness.run.plan import ArmPlan
from harness.run.server import ServerError, VllmServer, free_port

LOG_PULL_S = 1.0
HOST, PORT = "<node-address>", "<node-port>"   # placeholders in a server argv, filled in on its node
STOP_GRACE_S = 20.0


def _options(slot: Slot) -> dict[str, Any]:
    """Ray actor options that put an actor where ``slot`` says."""
    options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 4}
    if slot.node:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=slot.node, soft=False)
    if slot.label:
        options["label_selector"] = dict(slot.label)
    if slot.resource:
        options["resources"] = {slot.resource: 0.001}
    return options


def _here() -> dict[str, str]:
    return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address()}


def _version(*distributions: str) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@ray.remote(num_cpus=0)
def node_versions() -> dict[str, Any]:
    """Where this task ran and the versions installed there (Ray, vLLM, Python, torch)."""
    return {**_here(), "versions": {"ray": ray.__version__, "vllm": _version("vllm", "vllm-cpu"),
                                    "python": platform.python_version(), "torch": _version("torch")}}


class ServerHost:
    """A Ray actor that runs one ``vllm serve`` on its node (a :class:`VllmServer` with a watchdog)."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="dsa-bench-server-"))
        self.server: VllmServer | None = None

    def where(self) -> dict[str, str]:
        return _here()

    def start(self, argv: Sequence[str], served_model_name: str, env: Mapping[str, str], api_key: str | None,
              timeout_s: float) -> dict[str, Any]:
        """Start the server here — ``argv`` with :data:`HOST` / :data:`PORT` replaced by this node's address and a
        port free on it —; block until a real completion succeeds. Returns the base URL, seconds to ready and the
        peak memory, or ``{"error": message}``."""
        host, port = ray.util.get_node_ip_address(), free_port()
        argv = [{HOST: host, PORT: str(port)}.get(part, part) for part in argv]
        self.server = VllmServer(argv, env, port, served_model_name,
                                 self.folder / "server.log", api_key=api_key, host=host, watchdog=True)
        try:
            ready_s = self.server.start(timeout_s)
        except ServerError as error:
            return {"error": str(error)}
        return {"base_url": self.server.base_url, "ready_s": ready_s, "peak_rss_bytes": self.server.peak_rss_bytes,
                "peak_gpu_bytes": self.server.peak_gpu_bytes}

    def read_log(self, offset: int) -> bytes:
        """The server log's bytes from ``offset`` on (b"" before it exists)."""
        try:
            with open(self.folder / "server.log", "rb") as log:
                log.seek(offset)
                return log.read()
        except OSError:
            return b""

    def alive(self) -> bool:
        return self.server is not None and self.server.alive()

    def stop(self) -> None:
        """SIGTERM, grace, SIGKILL the server's process group (:func:`harness.run.procs.stop`)."""
        if self.server is not None:
            self.server.stop()


class LoadHost:
    """A Ray actor that keeps one :class:`LoadClient` on its node (vLLM imported once there, as locally). Each level
    runs as a call on it (an actor task on the node of the server it measures); results come back as text."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="dsa-bench-client-"))
        self.client = LoadClient(env, self.folder / "bench-client.log", watchdog=True)

    def run(self, argv: Sequence[str], result_name: str, timeout_s: float) -> dict[str, Any]:
        """Run one level with its ``--result-dir`` on this node; returns the reply, the result JSON and the log."""
        argv = list(argv)
        argv[argv.index("--result-dir") + 1] = str(self.folder)
        log = self.folder / "bench.log"
        log.write_bytes(b"")
        result = self.folder / result_name
        result.unlink(missing_ok=True)
        try:
            reply = self.client.run(argv, log, timeout_s)
        except LevelError as error:
            reply = {"ok": False, "error": str(error)}
        return {"reply": reply, "log": log.read_bytes(),
                "result": result.read_bytes() if result.is_file() else None}

    def close(self) -> None:
        self.client.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_ServerActor = ray.remote(ServerHost)
_LoadActor = ray.remote(LoadHost)


class RayLoadClient:
    """Driver side of a :class:`LoadHost`: the :class:`LoadClient` interface the runner uses."""

    def __init__(self, actor) -> None:
        self.actor = actor
        self.import_s = 0.0

    def run(self, argv: Sequence[str], log_path: Path, timeout_s: float,
            on_tick: Callable[[], None] | None = None) -> dict[str, Any]:
        """Run one level on the server's node; its log is appended to ``log_path`` and its result JSON written to
        the run directory's ``--result-dir``.

        Raises:
            LevelError: the actor died (its node was lost or it was killed) or the level ran past ``timeout_s``.
        """
        result_dir = Path(argv[list(argv).index("--result-dir") + 1])
        result_name = argv[list(argv).index("--result-filename") + 1]
        pending = self.actor.run.remote(list(argv), result_name, timeout_s)
        try:
            while not ray.wait([pending], timeout=1.0)[0]:
                if on_tick is not None:
                    on_tick()
            answer = ray.get(pending)
        except RayError as error:
            raise LevelError(f"the benchmark client's Ray actor died ({error.__class__.__name__})") from None
        with open(log_path, "ab") as log:
            log.write(answer["log"])
        if answer["result"] is not None:
            (result_dir / result_name).write_bytes(answer["result"])
        return answer["reply"]

    def close(self) -> None:
        try:
            ray.get(self.actor.close.remote(), timeout=30)
        except RayError:
            pass
        ray.kill(self.actor)


class RayServer:
    """Driver side of a :class:`ServerHost`: the server interface the runner uses (start, alive, stop, logs)."""

    def __init__(self, backend: "RayBackend", arm: ArmPlan, slot: Slot, env: Mapping[str, str], log_path: Path,
                 api_key: str | None):
        self.backend, self.arm, self.slot, self.env, self.api_key = backend, arm, slot, dict(env), api_key
        self.log_path = log_path
        self.served_model_name = arm.served_model_name
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = ""
        self.ready_s: float | None = None
        self.peak_rss_bytes = self.peak_gpu_bytes = 0
        self.node: dict[str, str] = {}
        self.load_client: RayLoadClient | None = None
        self.log_offset = 0
        self._pulled = 0
        self._pull_lock = threading.Lock()
        self._stop_pulling = threading.Event()
        self._puller: threading.Thread | None = None
        self.actor = None

    def start(self, timeout_s: float) -> float:
        """Place the actor, start the server in it and wait until it is ready. Returns seconds to ready.

        Raises:
            ServerError: no node fits the placement, the actor died, or the server failed to become ready.
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.actor = _ServerActor.options(**_options(self.slot)).remote()
        try:
            self.node = ray.get(self.actor.where.remote(), timeout=self.backend.placement_timeout_s)
        except GetTimeoutError:
            self.stop()
            raise ServerError(f"no Ray node took {self.arm.name}'s server within "
                              f"{self.backend.placement_timeout_s:.0f} s (placement {self.slot.describe()}); "
                              f"check the node id, label or resource against `ray status`") from None
        self._puller = threading.Thread(target=self._pull_logs, daemon=True)
        self._puller.start()
        try:
            argv = self.arm.server_argv(PORT, host=HOST)   # resolved here: the manifest's command is what ran
            answer = ray.get(self.actor.start.remote(argv, self.served_model_name, self.env, self.api_key, timeout_s))
        except RayError as error:
            self.stop()
            raise ServerError(f"{self.arm.name}'s server actor died while starting ({error.__class__.__name__}); "
                              f"log {self.log_path}") from None
        except BaseException:
            self.stop()
            raise
        if "error" in answer:
            self.stop()
            raise ServerError(answer["error"])
        self._pull_once()
        self.base_url, self.ready_s = answer["base_url"], answer["ready_s"]
        self.peak_rss_bytes, self.peak_gpu_bytes = answer["peak_rss_bytes"], answer["peak_gpu_bytes"]
        self.load_client = self.backend.load_client(self.node["node_id"])
        return self.ready_s

    def _pull_once(self) -> None:
        """Append what the node's log gained since the last pull to the run directory's log."""
        with self._pull_lock:
            try:
                chunk = ray.get(self.actor.read_log.remote(self._pulled), timeout=30)
            except RayError:
                return
            if chunk:
                with open(self.log_path, "ab") as log:
                    log.write(chunk)
                self._pulled += len(chunk)

    def _pull_logs(self) -> None:
        while not self._stop_pulling.wait(LOG_PULL_S):
            self._pull_once()

    def session_log(self) -> str:
        """What this session wrote to the run directory's copy of the log."""
        with open(self.log_path, "rb") as log:
            log.seek(self.log_offset)
            return log.read().decode("utf-8", errors="replace")

    def alive(self) -> bool:
        """Whether the actor answers and its server process runs."""
        if self.actor is None:
            return False
        try:
            return bool(ray.get(self.actor.alive.remote(), timeout=30))
        except RayError:
            return False

    def stop(self) -> None:
        """Stop the server in its actor (SIGTERM, grace, SIGKILL), copy the last log lines, then kill the actor.
        A dead actor's server is ended by its reaper."""
        if self.actor is None:
            return
        try:
            ray.get(self.actor.stop.remote(), timeout=STOP_GRACE_S + 30)
        except RayError:
            pass
        self._stop_pulling.set()
        if self._puller is not None:
            self._puller.join(timeout=LOG_PULL_S + 31)
        self._pull_once()
        ray.kill(self.actor)
        self.actor = None


class RayBackend:
    """The run's connection to a Ray cluster: places servers, keeps one load client per node, reads the nodes.

    Args:
        address: ``"local"`` (start a head inside this process), ``"auto"`` or an address for ``ray.init``.
        client_env: the load client's environment.
    """

    placement_timeout_s = 120.0

    def __init__(self, address: str, client_env: Mapping[str, str]):
        self.connected_here = not ray.is_initialized()
        if self.connected_here:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        self.client_env = dict(client_env)
        self.clients: dict[str, RayLoadClient] = {}

    def server(self, arm: ArmPlan, slot: Slot, env: Mapping[str, str], log_path: Path,
               api_key: str | None) -> RayServer:
        """A server for ``arm`` at ``slot`` (not started: call ``start``)."""
        return RayServer(self, arm, slot, env, log_path, api_key)

    def load_client(self, node_id: str) -> RayLoadClient:
        """The load client on ``node_id`` (started on first use)."""
        if node_id not in self.clients:
            strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            actor = _LoadActor.options(num_cpus=0, scheduling_strategy=strategy).remote(self.client_env)
            self.clients[node_id] = RayLoadClient(actor)
        return self.clients[node_id]

    def nodes(self) -> list[dict[str, Any]]:
        """Every alive node: its record (resources, labels) and the versions a task placed on it found."""
        alive = [node for node in ray.nodes() if node.get("Alive")]
        pending = [node_versions.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            node_id=node["NodeID"], soft=False)).remote() for node in alive]
        found = {}
        for ref in pending:
            try:
                answer = ray.get(ref, timeout=120)
                found[answer["node_id"]] = answer["versions"]
            except RayError:
                continue
        return [cluster_info.node_record(node, found.get(node["NodeID"])) for node in alive]

    def close(self) -> None:
        """Close the load clients and, when this run started the head, shut Ray down."""
        for client in self.clients.values():
            client.close()
        self.clients.clear()
        if self.connected_here:
            ray.shutdown()
