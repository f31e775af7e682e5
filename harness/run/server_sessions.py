"""The server sessions of a run: start (or connect to) each arm's ``vllm serve``, attest what it runs, record where it
runs, and keep, stop or restart it per session block. A mixin of :class:`harness.run.runner.Runner`, which owns the
state it reads and writes.

A session is the unit of replication: :meth:`ServerSessions._server_for` gives a level of session block ``b`` the
arm's server for that block — a fresh one per block where :meth:`~harness.run.scenario.Scenario.fresh_session_per_block`
— and records each new session in the manifest (start-up times, placement, attestation, GPUs before it). The host
class sets ``plan``, ``store``, ``options``, ``console``, ``writer``, ``timing``, ``servers``, ``server_round``,
``server_slot``, ``slots``, ``cluster``, ``node_versions``, ``dead_arms``, ``arms_plan`` and ``manifest``, and defines
``_save()`` and ``_parity(arm, server)`` (the greedy outputs every new session gives first).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

from rich.markup import escape

from dsa_route.inject import ENV_INJECT
from harness.run import attest, builds, cluster as cluster_info, gpu_idle, procs
from harness.run.placement import Slot, slot_for, start_together
from harness.run.plan import ArmPlan, multi_node
from harness.run.server import RemoteServer, ServerError, VllmServer, free_port
from harness.run.start import now
from harness.run.startup import startup_from_log
from harness.rundir import schema

__all__ = ["ServerSessions"]


class ServerSessions:
    """The arms' server sessions (module docstring): record, start, attest, place, connect, reuse or stop."""

    def _new_session(self, arm: str, ready_s: float, base_url: str, startup: dict[str, float | None] | None = None,
                     gpus: dict[str, Any] | None = None) -> None:
        """Record a server session of ``arm``: the levels measured from now on belong to it. ``gpus``:
        :func:`gpu_idle.before_session` of its GPUs."""
        self.writer.add_session(arm, started_at=now(), server_start_s=round(ready_s, 2), base_url=base_url,
                                startup=startup, gpus_before=(gpus or {}).get("gpus"), gpu_note=(gpus or {}).get("note"))

    def _session(self, arm: str) -> int | None:
        sessions = self.writer.arm(arm).sessions
        return sessions[-1].index if sessions else None

    def _server_env(self, arm: ArmPlan) -> dict[str, str]:
        inherited = {k: v for k, v in os.environ.items() if k != ENV_INJECT}  # injections only where declared
        return {**inherited, **arm.server_env}

    def _start_server(self, arm: ArmPlan, block: int, tries: int = 3) -> VllmServer:
        """Start the arm's server for session block ``block`` on its slot there. A port found free can be taken by
        another process before vLLM binds it (tens of seconds later on a loaded host), or by the other arm's server
        starting at the same time: on "Address already in use" (vLLM's bind) or "is already in use" (the check before
        the spawn) a local server starts again on a new port, ``tries`` times."""
        slot = slot_for(block, arm.name, self.slots, self.plan.scenario.cluster.swap_nodes)
        env, log_path = {**self._server_env(arm), **slot.env()}, self.store.log_path(f"{arm.name}-server.log")
        gpus = gpu_idle.before_session(env)
        if self.cluster is not None:
            server = self.cluster.server(arm, slot, env, log_path, os.environ.get("VLLM_API_KEY"))
        else:
            port = free_port()
            server = VllmServer(arm.server_argv(port), env, port, arm.served_model_name, log_path,   # a watchdog:
                                api_key=os.environ.get("VLLM_API_KEY"), watchdog=True)   # nothing outlives a SIGKILL
        self.console.print(f"[bold]{arm.name}[/]: starting vllm serve ({slot.describe()}, block {block}; "
                           f"log {log_path})")
        try:
            ready_s = server.start(self.plan.scenario.serve.ready_timeout_s)
        except ServerError as error:
            if self.cluster is None and tries > 1 and "already in use" in str(error):
                self.console.print(f"[yellow]{arm.name}: the port was taken before vLLM bound it; new port[/]")
                return self._start_server(arm, block, tries - 1)
            raise
        measured = {**startup_from_log(server.session_log()), "ready_s": round(ready_s, 2),
                    "peak_rss_gib": round(server.peak_rss_bytes / 2**30, 3) if server.peak_rss_bytes else None,
                    "peak_gpu_gib": round(server.peak_gpu_bytes / 2**30, 3) if server.peak_gpu_bytes else None}
        log_text = server.log_path.read_text(encoding="utf-8", errors="replace")
        with self.writer.lock:   # servers started together record from their threads (:meth:`_open`)
            self.timing["server_start_s"] += ready_s
            self._new_session(arm.name, ready_s, server.base_url, measured, gpus)
            self.writer.place(arm.name, self._placement(arm.name, server, slot, block, log_text))
            mismatches = self._attest(arm, attest.observe_from_log(log_text))
            self._save()
        self.console.print(f"[bold]{arm.name}[/]: ready in {ready_s:.1f} s"
                           + (f" — [red]path mismatch: {escape('; '.join(mismatches))}[/]" if mismatches else ""))
        return server

    def _attest(self, arm: ArmPlan, observed: schema.Observation) -> list[str]:
        """Record what the arm's server log showed and how it differs from the intended path, the arm's declared
        build and (unless ``cluster.allow_version_skew``) its other nodes' versions; returns the mismatches."""
        entry = self.writer.arm(arm.name)
        mismatches = attest.compare_paths(arm.intended, observed) + builds.mismatch(entry.build, observed)
        if not self.plan.scenario.cluster.allow_version_skew:
            nodes = [session.placement.node for session in entry.sessions
                     if session.placement and session.placement.node]
            mismatches += cluster_info.version_skew(arm.name, nodes, self.node_versions)
        self.writer.update_arm(arm.name, observed=observed,
                               attestation=schema.Attestation(valid=not mismatches, mismatches=tuple(mismatches)))
        return mismatches

    def _placement(self, arm_name: str, server, slot: Slot, block: int, log_text: str) -> schema.Placement:
        """The session's placement (harness.run.cluster.session_placement); a NET/Socket note on GPUs."""
        nodes = [node.model_dump() for node in (self.manifest.cluster.nodes if self.manifest.cluster else ())]
        placement = schema.Placement.model_validate(cluster_info.session_placement(
            self.plan.scenario, slot, block, getattr(server, "node", {}) or {}, log_text, nodes))
        note = cluster_info.transport_note(arm_name, placement.nccl_transport, self.plan.machine.name,
                                           multi_node(self.plan.scenario))
        if note:
            self.writer.add_note(note)
        return placement

    def _connect_remote(self, arm: ArmPlan, url: str) -> RemoteServer:
        """Connect to a server started by other tooling; attest what its endpoints expose."""
        server = RemoteServer(url, None, os.environ.get("VLLM_API_KEY"))
        self.console.print(f"[bold]{arm.name}[/]: using the running server at {url} (dsa-bench starts nothing)")
        ready_s = server.connect(self.plan.scenario.serve.ready_timeout_s)
        observed = attest.observe_remote(server)
        self._new_session(arm.name, ready_s, url)
        self.writer.update_arm(arm.name, observed=observed, server_command=None,
                               attestation=attest.remote_record(arm.intended, observed))
        self._save()
        return server

    def _server_for(self, arm: ArmPlan, block: int) -> VllmServer | RemoteServer | None:
        """The arm's server for a level of session block ``block`` (:meth:`Plan.block_of`). A fresh server session
        per block (arm × block of rounds) where :meth:`Scenario.fresh_session_per_block` — sessions, the unit of
        replication, are then independent even where ABBA puts one arm's two blocks back to back; sequential servers
        stop the other arm's first, concurrent ones stop both of the last block's. Otherwise concurrent servers keep
        one session per arm for the whole run."""
        if self.options.base_urls:
            if arm.name not in self.servers and arm.name not in self.dead_arms:
                try:
                    self.servers[arm.name] = self._connect_remote(arm, self.options.base_urls[arm.name])
                    self._parity(arm.name, self.servers[arm.name])
                except ServerError as error:
                    self.dead_arms[arm.name] = str(error)
                    self.console.print(f"[red]{arm.name}: {escape(str(error))}[/]")
            return self.servers.get(arm.name)
        self._stop_stale(arm.name, block)
        server = self.servers.get(arm.name)
        if server is not None and server.alive():
            return server
        if server is not None:
            self.dead_arms[arm.name] = "server died"
            return None
        self._open([arm], block)
        return self.servers.get(arm.name)

    def _servers_up(self, block: int, first: str) -> None:
        """Concurrent servers: every live arm's server for session block ``block`` up before a level of it is
        measured, the missing ones started together where :meth:`_start_together` allows (their start-ups overlap:
        on the 2-core CPU default a block's two starts cost ≈ one, ``results/carryover/README.md``), else one after
        the other, arm ``first`` (the step's) first."""
        for name in list(self.servers):
            self._stop_stale(name, block)
        names = sorted(self.arms_plan, key=lambda name: name != first)
        missing = [self.arms_plan[n] for n in names if n not in self.dead_arms and n not in self.servers]
        self._open(missing, block)
        for name in [n for n in self.arms_plan if n not in self.dead_arms]:
            self._server_for(self.arms_plan[name], block)   # a server that died meanwhile is recorded dead

    def _stop_stale(self, arm_name: str, block: int) -> None:
        """Stop the servers that cannot serve ``arm_name``'s levels of ``block``: sequential servers, every other
        arm's and its own of another block; concurrent ones, every server of another block (with fresh sessions per
        block) or whose slot moves, before any starts: two never share a slot."""
        scenario = self.plan.scenario
        if not scenario.serve.concurrent_servers:
            stale = [n for n in self.servers if n != arm_name or self.server_round.get(n) != block]
        else:
            fresh, swap = scenario.fresh_session_per_block(), scenario.cluster.swap_nodes
            stale = [n for n in self.servers if (fresh and self.server_round.get(n) != block)
                     or self.server_slot.get(n) != slot_for(block, n, self.slots, swap)]
        for name in stale:
            self.servers.pop(name).stop()

    def _start_together(self, arms: list[ArmPlan], block: int) -> bool:
        """Whether ``arms``' servers for ``block`` may start at the same time (:func:`placement.start_together`;
        never under the Ray backend)."""
        swap = self.plan.scenario.cluster.swap_nodes
        return self.cluster is None and start_together([slot_for(block, arm.name, self.slots, swap) for arm in arms],
                                                       self.plan.machine.gpu_count)

    def _open(self, arms: list[ArmPlan], block: int) -> None:
        """Start ``arms``' servers for ``block`` — at the same time where :meth:`_start_together` allows (the run's
        start-up time then counts the group's wall time once) — then give each one's parity outputs. An arm whose
        server fails to start (or dies during its parity) is recorded dead with the log's first line."""
        if self._start_together(arms, block):
            started, before = time.monotonic(), self.timing["server_start_s"]
            self.console.print(f"starting {', '.join(arm.name for arm in arms)} together")
            outcomes = _start_all(lambda arm: self._try_start(arm, block), arms)
            self.timing["server_start_s"] = before + time.monotonic() - started
        else:
            outcomes = [self._try_start(arm, block) for arm in arms]
        for arm, outcome in zip(arms, outcomes):
            try:
                if isinstance(outcome, ServerError):
                    raise outcome
                self.servers[arm.name] = outcome
                self.server_round[arm.name] = block
                self.server_slot[arm.name] = slot_for(block, arm.name, self.slots, self.plan.scenario.cluster.swap_nodes)
                self._parity(arm.name, outcome)
            except ServerError as error:
                first = str(error).splitlines()[0].removesuffix(", last lines:")  # the log's tail went to the console
                self.dead_arms[arm.name] = f"server failed to start: {first}"
                self.console.print(f"[red]{arm.name}: {escape(str(error))}[/]")
                self.servers.pop(arm.name, None)

    def _try_start(self, arm: ArmPlan, block: int) -> VllmServer | ServerError:
        """:meth:`_start_server`, its :class:`ServerError` returned (a start in a worker thread reports, not raises)."""
        try:
            return self._start_server(arm, block)
        except ServerError as error:
            return error


def _start_all(start, arms: list[ArmPlan]) -> list:
    """``start(arm)`` for every arm at the same time, in arm order. A SIGTERM or Ctrl-C while they run stops every
    child process (:func:`procs.stop_all`) until the starts in flight have ended — each then sees its server exit —
    and re-raises: the run ends at once instead of waiting out the servers' ready timeout."""
    pool = ThreadPoolExecutor(max_workers=len(arms))
    futures = [pool.submit(start, arm) for arm in arms]
    try:
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((future for future in futures if future.done() and future.exception() is not None), None)
        if failed is not None:
            raise failed.exception()
        return [future.result() for future in futures]
    except BaseException:
        while not all(future.done() for future in futures):   # a start may spawn its server after a stop_all
            procs.stop_all(grace_s=5.0)
            wait(futures, timeout=1.0)
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
