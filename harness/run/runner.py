"""Orchestration: plan → servers → load levels → records on disk → report. The only module that runs a comparison.

Every finished level is on disk (atomic writes) before the next one starts, and ``manifest.json`` says what is done,
failed or skipped, so a crash or Ctrl-C leaves a readable run directory.
"""

from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.run import (accuracy, arm_checks, cluster as cluster_info, duet, host_load, pilot, procs, run_manifest,
                         server_metrics, spec_decode, stopping)
from harness.run.placement import Slot
from harness.run.server_sessions import ServerSessions

from harness.rundir import schema
from harness.rundir.schema import Level, LevelKey, LevelRecord, LevelState, Manifest
from harness.rundir.store import RunDir
from harness.run.load import LevelError, LoadClient, parse_bench_result, read_bench_json
from harness.run.plan import ArmPlan, Plan
from harness.run.scenario import gates_tokens
from harness.run import text_prompts
from harness.run.start import now, schedule
from harness.run.server import RemoteServer, VllmServer, request_successes


@dataclass
class RunOptions:
    """How to run: failure policy, and ``base_urls`` (arm → URL) to benchmark servers started by other tooling."""

    continue_on_error: bool = False
    base_urls: dict[str, str] | None = None
    gsm8k: accuracy.GsmData | None = None   # where GSM8K comes from; None or source "skip" → not run
    budget_s: float | None = None   # no session block starts that would end past this many seconds of the run
    aa_check: dict[str, Any] | None = None   # the [cluster] aa_check run's record, for the manifest


class Runner(ServerSessions):
    """Runs one comparison into ``run_dir``. Use :meth:`run`. Its server sessions (start, attest, place, reuse or
    stop): :class:`~harness.run.server_sessions.ServerSessions`."""

    def __init__(self, plan: Plan, run_dir: Path, options: RunOptions, console: Console | None = None,
                 resume_manifest: Manifest | None = None):
        self.plan = plan
        self.run_dir = run_dir
        self.store = RunDir(run_dir)
        self.options = options
        self.console = console or Console(stderr=True)
        self.servers: dict[str, VllmServer | RemoteServer] = {}
        self.server_round: dict[str, int] = {}   # the session block each running local server was started for
        self.server_slot: dict[str, Slot] = {}   # where each running server runs
        self.slots = plan.scenario.cluster.slots([arm.name for arm in plan.arms])
        self.cluster = None                       # the Ray backend (harness.run.ray_backend.RayBackend) when used
        self.node_versions: dict[str, dict[str, str | None]] = {}
        self.dead_arms: dict[str, str] = {}   # arm → reason it stopped
        self.timing = {"server_start_s": 0.0, "benchmark_s": 0.0, "parity_s": 0.0, "gsm8k_s": 0.0,
                       "client_import_s": 0.0, "pilot_s": 0.0}
        self.gsm8k_failures: dict[str, str] = {}
        self.writer = run_manifest.ManifestWriter(   # the typed manifest; a duet's two level threads share it
            run_manifest.initial(plan, run_dir, remote=bool(options.base_urls), aa_check=options.aa_check)
            if resume_manifest is None else run_manifest.resumed(resume_manifest, plan, self.store), self.store)
        self.arms_plan = {arm.name: arm for arm in plan.arms}

    @property
    def manifest(self) -> run_manifest.RunManifest:
        """The run's manifest as it stands (typed; the writer replaces it on every change)."""
        return self.writer.manifest

    def _connect_cluster(self, client_env: dict[str, str]) -> None:
        """With ``backend = "ray"``: connect (or start a head) and record the nodes and their versions. The backend
        module is imported by name here only, so the local backend never imports Ray."""
        spec = self.plan.scenario.cluster
        if spec.backend != "ray" or self.options.base_urls:
            return
        backend = importlib.import_module("harness.run.ray_backend")
        self.cluster = backend.RayBackend(spec.address, client_env)
        nodes = self.cluster.nodes()
        self.node_versions = {node["node_id"]: node["versions"] for node in nodes}
        record = self.manifest.cluster or schema.ClusterRecord.model_validate(   # a resumed run from before placement
            cluster_info.manifest_record(spec, list(self.arms_plan), self.plan.scenario.workload.repeats))
        self.writer.update(cluster=run_manifest.changed(record, nodes=nodes))
        self.console.print(f"ray: {len(nodes)} node(s): " + ", ".join(
            f"{node['node_id'][:12]} ({node['ip']})" for node in nodes))
        self._save()

    def _save(self) -> None:
        self.writer.save()

    def _level(self, arm: str, level: Level, round_no: int) -> LevelRecord:
        return self.writer.level(arm, LevelKey(level, round_no))


    def _size_levels(self, order: list[tuple[str, int, int]], clients: dict[str, LoadClient]) -> None:
        """With ``workload.min_level_s``: every level's prompt count, both arms alike, from a pilot (harness.run.pilot)
        on the first server the schedule starts — or from the manifest's record on ``--resume`` — before any
        measured level. A server that fails to start here is recorded by the level loop, as without a pilot."""
        if not self.plan.scenario.workload.min_level_s:
            return
        if self.manifest.pilot is None:
            first = next(((name, server) for name, c, r in order if name not in self.dead_arms
                          and self._level(name, c, r).status != LevelState.DONE
                          for server in [self._server_for(self.arms_plan[name], self.plan.block_of(r))] if server),
                         None)
            if first is None:
                return
            name, server = first
            self.console.print(f"[bold]{name}[/]: pilot levels (≥ {self.plan.scenario.workload.min_level_s:g} s)")
            record = pilot.run_pilot(self.plan, self.arms_plan[name], server, server.load_client or clients[name],
                                     self.run_dir, self._session(name))
            self.writer.update(pilot=record)
            self.timing["pilot_s"] += record.wall_s or 0.0
        self.plan = pilot.apply(self.writer, self.plan, self.run_dir)
        self._save()
        self.console.print(f"prompts per level: {self.manifest.pilot.describe()}")

    # ----------------------------------------------------------------------------------------------- stopping
    def _stopped(self, reason: str) -> None:
        """Record an early stop: the levels not run become ``stopped: …`` (not planned any more), the manifest says
        why."""
        self.console.print(f"[bold]{escape(reason)}[/]")
        for name, server in list(self.servers.items()):   # concurrent servers: GSM8K was due after the last level
            if server.alive():
                self._gsm8k(name, server)
        self.writer.settle_pending(f"{schema.STOPPED}: {reason}")
        self.writer.update(stopped=schema.StopRecord(reason=reason, at=now()))
        self._save()

    # ----------------------------------------------------------------------------------------------- accuracy
    def _parity(self, arm: str, server: VllmServer | RemoteServer) -> None:
        """Greedy outputs of the parity prompts, once per arm before its sweep, then the scorings every live server's
        session provides (harness.run.arm_checks; not on dummy weights, :func:`gates_tokens`)."""
        self.timing["parity_s"] += arm_checks.collect_parity(self.run_dir, arm, server, self.plan.scenario.parity,
                                                             self.console)
        scenario = self.plan.scenario
        if not gates_tokens(scenario.model.load_format, scenario.parity.gated):
            return
        for name, live in list(self.servers.items()):   # the baseline's outputs may come after the other's start
            if live.alive():
                self.timing["parity_s"] += arm_checks.collect_scoring(self.run_dir, name,
                                                                      len(self.writer.arm(name).sessions), live,
                                                                      scenario.parity, self.console)

    def _gsm8k(self, arm: str, server: VllmServer | RemoteServer) -> None:
        """lm-eval GSM8K on the arm's running server (harness.run.arm_checks)."""
        spent, failure = arm_checks.run_gsm8k(self.run_dir, arm, server, self.plan.scenario.accuracy,
                                              self.options.gsm8k, self.console)
        self.timing["gsm8k_s"] += spent
        if failure is not None:
            self.gsm8k_failures[arm] = failure

    # ----------------------------------------------------------------------------------------------- levels
    def _run_level(self, client: LoadClient, arm: ArmPlan, server: VllmServer | RemoteServer, level: Level,
                   round_no: int,
                   progress: Progress, task) -> None:
        raw_dir = self.run_dir / schema.RAW_DIR
        raw_dir.mkdir(exist_ok=True)
        argv = self.plan.bench_argv(arm, LevelKey(level, round_no), server.base_url, raw_dir, server.served_model_name)
        total = self.plan.num_prompts(level) + self.plan.scenario.workload.warmups
        before = request_successes(server)
        progress.update(task, description=f"{arm.name} {self.plan.label(level)} r={round_no}", total=total, completed=0)

        def tick() -> None:
            progress.update(task, completed=max(0.0, request_successes(server) - before))

        cpu_before, engine_before = host_load.read_cpu_times(), _engine_cpu_s(server)
        reply = (server.load_client or client).run(argv, self.store.log_path(f"{arm.name}-bench.log"),
                           self.plan.scenario.workload.level_timeout_s, on_tick=tick)
        steal = host_load.steal_share(cpu_before, host_load.read_cpu_times())
        engine_after = _engine_cpu_s(server)
        self.timing["benchmark_s"] += reply.get("wall_s", 0.0)
        if not reply["ok"]:
            raise LevelError(f"benchmark failed: {reply['error']}")
        if not server.alive():
            raise LevelError("server died during the level")
        bench = read_bench_json(self.store.raw_path(arm.name, LevelKey(level, round_no)))
        level_row, request_rows = parse_bench_result(bench, arm.name, level, round_no, self._session(arm.name))
        mtp_on = self.plan.scenario.mtp.num_speculative_tokens > 0
        level_row.update(spec_decode.level_fields(spec_decode.from_bench_result(bench, mtp_on)))
        columns, unreadable = server_metrics.level_columns(bench)
        level_row.update(columns)
        if unreadable:
            self.console.print(f"[yellow]{arm.name} {self.plan.label(level)} r={round_no}: server /metrics columns left "
                               f"empty ({escape(unreadable)})[/]")
        level_row["client_cpu_util"] = round(reply["cpu_s"] / reply["wall_s"], 3) if reply.get("wall_s") else None
        level_row["host_steal_fraction"] = None if steal is None else round(steal, 4)
        level_row["load_avg_1m"] = host_load.read_load_1m()
        level_row["engine_cpu_ms_per_token"] = host_load.cpu_ms_per_token(engine_before, engine_after,
                                                                          bench.get("total_output_tokens"))
        self.store.append_requests(request_rows)
        self.store.append_levels([level_row])
        progress.update(task, completed=total)
        self.console.print(f"{arm.name} {self.plan.label(level)} r={round_no}: {level_row['completed']} ok, "
                           f"{level_row['failed']} failed, {level_row['output_throughput']:.1f} output tok/s, "
                           f"mean TPOT {level_row['mean_tpot_ms'] or float('nan'):.1f} ms")

    # ----------------------------------------------------------------------------------------------- the loop
    def _pending(self, name: str, key: LevelKey) -> bool:
        """Whether ``name``'s level ``key`` is still to run now (not done, not stopped, its arm not dead)."""
        return name not in self.dead_arms and self.writer.level(name, key).state not in (LevelState.DONE,
                                                                                         LevelState.STOPPED)

    def _ready(self, name: str, level: Level, round_no: int) -> VllmServer | RemoteServer | None:
        """The running server a pending level is measured on; None when the level is not run now (done on a resumed
        run, stopped: left out by the budget, or its arm is dead: the level's status then says why)."""
        key = LevelKey(level, round_no)
        if self.writer.level(name, key).state in (LevelState.DONE, LevelState.STOPPED):
            return None
        if name in self.dead_arms:
            self.writer.update_level(name, key, status=f"{LevelState.SKIPPED.value}: {self.dead_arms[name]}")
            self._save()
            return None
        server = self._server_for(self.arms_plan[name], self.plan.block_of(round_no))
        if server is None:
            self.writer.update_level(name, key, status=f"{LevelState.FAILED.value}: {self.dead_arms[name]}")
            self._save()
        return server

    def _measure(self, client: LoadClient, name: str, server: VllmServer | RemoteServer, level: Level,
                 round_no: int, progress: Progress, task) -> None:
        """Run one level (:meth:`_run_level`) and record its outcome, start and end (UTC, ms) in the manifest. A
        level failure is recorded, not raised; its arm then stops unless ``continue_on_error`` (or its server died)."""
        key, level_started = LevelKey(level, round_no), time.monotonic()
        with self.writer.lock:
            self.writer.update_level(name, key, status="failed: interrupted during this level",
                                     started_at=now("milliseconds"))
            self._save()
        status, dead = "done", None
        try:
            self._run_level(client, self.arms_plan[name], server, level, round_no, progress, task)
        except (LevelError, ValueError) as error:
            status = f"failed: {error}"
            self.console.print(f"[red]{name} {self.plan.label(level)} r={round_no} failed: {escape(str(error))}[/]")
            dead = ("server died" if not server.alive() else None if self.options.continue_on_error
                    else "an earlier level failed (use --continue-on-error to go on)")
        with self.writer.lock:
            if dead is not None:
                self.dead_arms[name] = dead
            session = {"session": self._session(name)} if status == "done" else {}
            self.writer.update_level(name, key, status=status, wall_s=round(time.monotonic() - level_started, 2),
                                     finished_at=now("milliseconds"), raw=f"{schema.RAW_DIR}/{key.raw_name(name)}",
                                     **session)
            self._save()

    def _run_step(self, items: list[tuple[str, Level, int]], clients: dict[str, LoadClient], progress: Progress,
                  tasks: dict[str, Any]) -> None:
        """The levels of one step: one level, or (duet) both arms' levels at the same time on servers started first.
        Concurrent servers: every live arm's server is up before a level is measured, so no level runs beside a
        server that is still starting. A duet step's benchmark time is its wall time (the two levels overlap)."""
        if self.plan.scenario.serve.concurrent_servers and not self.options.base_urls and any(
                self._pending(name, LevelKey(level, round_no)) for name, level, round_no in items):
            self._servers_up(self.plan.block_of(items[0][2]), items[0][0])   # a resumed run's finished step starts nothing
        ready = [(item, self._ready(*item)) for item in items]
        measures = [lambda item=item, server=server: self._measure(clients[item[0]], item[0], server, *item[1:],
                                                                 progress, tasks[item[0]])
                    for item, server in ready if server is not None]
        if len(measures) == 1:
            measures[0]()
        elif measures:
            started, benchmark_s = time.monotonic(), self.timing["benchmark_s"]
            duet.run_step(measures)
            self.timing["benchmark_s"] = benchmark_s + time.monotonic() - started

    def _block_done(self, blocks_done: int, budget: stopping.BlockBudget) -> str | None:
        """The stop reason at the boundary after ``blocks_done`` blocks (a deciding look, the budget), else None.
        After block 1 of a run with a budget, the projection (:meth:`_project`) may leave levels out of the later
        blocks (the next block is then taken to cost that much less) or stop the run."""
        looked = time.monotonic()
        stop = stopping.look_stop(self.run_dir, blocks_done)
        now_s, one_off_s = time.monotonic(), sum(self.timing[k] for k in ("parity_s", "gsm8k_s", "pilot_s"))
        start_s = 0.0 if budget.servers_stay_up else self.timing["server_start_s"] - budget.block_start_s
        next_block_s = budget.close(now_s, self.timing["server_start_s"], one_off_s)
        if stop is None and blocks_done == 1 and budget.budget_s is not None and self.manifest.budget is None:
            record = self._project(budget.budget_s, now_s - budget.started, start_s, now_s - looked)
            if record.outcome == "cannot":
                return record.describe()
            next_block_s = record.block_s - sum(record.level_s[level] for level in record.dropped)
        return stop or budget.stop_reason(now_s, next_block_s, blocks_done)

    def _project(self, budget_s: float, elapsed_s: float, start_s: float, look_s: float) -> schema.BudgetRecord:
        """Project ``gate.min_sessions`` blocks from block 1's per-block work (:func:`stopping.project_budget`: its
        level steps, :func:`stopping.step_seconds` — a duet's overlapping levels counted once —, ``start_s`` its
        server starts every block repeats, ``look_s`` the look at its end; seconds); record it in the manifest, say it
        on the terminal, and leave the dropped levels out."""
        walls = [(arm, key, level.wall_s) for arm in self.arms_plan for key, level in self.writer.arm(arm).level_items()
                 if self.plan.block_of(key.round) == 0 and level.wall_s is not None]
        level_s = stopping.step_seconds(walls, overlapping=self.plan.scenario.serve.duet)
        record = stopping.project_budget(budget_s, elapsed_s, level_s, self.plan.scenario.gate.min_sessions,
                                         self.plan.scenario.workload.repeats, start_s, look_s)
        self.writer.update(budget=record)
        if record.outcome != "cannot":   # that one is the stop reason, printed by _stopped
            self.console.print(f"[bold]{escape(record.describe())}[/]")
        self._drop_levels()
        self._save()
        return record

    def _drop_levels(self) -> None:
        """Mark the levels the manifest's ``budget`` left out of blocks 2 on as stopped (a resumed run re-applies
        it): no longer planned, so nothing runs them and the gate does not count them missing."""
        record = self.manifest.budget
        if record is None or not record.dropped:
            return
        for arm in self.arms_plan:
            for key, level in self.writer.arm(arm).level_items():
                if (str(key.level) in record.dropped and self.plan.block_of(key.round) > 0
                        and level.state != LevelState.DONE):
                    self.writer.update_level(arm, key, status=f"{schema.STOPPED}: budget: {self.plan.label(key.level)} "
                                                              "left out of blocks 2 on (manifest budget)")

    def _write_text_datasets(self) -> None:
        """The prompts of every real-text regime (:mod:`harness.run.text_prompts`), written once into the run
        directory before any level (a resumed run keeps its file): enough distinct prompts for the regime's largest
        level with its warmups, cut with the first arm's tokenizer (both arms serve the same model)."""
        work = self.plan.scenario.workload
        for regime in self.plan.regimes():
            path = text_prompts.dataset_path(self.run_dir, regime)
            if regime.dataset not in text_prompts.TEXT_DATASETS or path.exists():
                continue
            from transformers import AutoTokenizer

            count = max(self.plan.num_prompts(level) for level in work.levels() if level.regime == regime)
            tokenizer = AutoTokenizer.from_pretrained(self.plan.arms[0].tokenizer)
            texts = text_prompts.gsm8k_texts(text_prompts.text_data_dir(self.plan.scenario, regime))
            text_prompts.write_dataset(path, text_prompts.text_prompts(texts, tokenizer, regime.input_len,
                                                                       count + work.warmups))
            self.console.print(f"{regime.label()}: {count + work.warmups} prompts of {regime.input_len} tokens "
                               f"written to {path.relative_to(self.run_dir)}")

    def run(self) -> run_manifest.RunManifest:
        """Run every scheduled level; returns the final manifest. Stops all children on every exit path."""
        started = time.monotonic()
        self._save()
        client_env = dict(os.environ)
        if os.environ.get("VLLM_API_KEY"):  # vLLM's bench client sends OPENAI_API_KEY as the bearer token
            client_env["OPENAI_API_KEY"] = os.environ["VLLM_API_KEY"]
        is_duet = self.plan.scenario.serve.duet
        clients = duet.load_clients(list(self.arms_plan), client_env, self.store.log_path, is_duet)
        self.store.log_path("").mkdir(exist_ok=True)
        status = "failed"
        order = schedule(self.plan)
        gsm8k_at = stopping.gsm8k_points(self.plan, order)
        block, blocks_done, stop = None, 0, None
        budget = stopping.BlockBudget(self.options.budget_s, started, not self.plan.scenario.fresh_session_per_block())
        try:
            self._connect_cluster(client_env)
            self._drop_levels()
            self._write_text_datasets()
            self._size_levels(order, clients)
            if is_duet and self.cluster is None:   # both imports done before the first step's two levels begin
                duet.start_clients(clients, self.console)
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                          TimeElapsedColumn(), console=self.console, transient=True) as progress:
                task = None if is_duet else progress.add_task("starting", total=None)
                tasks = {name: task if task is not None else progress.add_task(f"{name}: starting", total=None)
                         for name in self.arms_plan}
                for indices in duet.steps(order, is_duet):
                    step_block = self.plan.block_of(order[indices[0]][2])
                    if step_block != block:
                        if block is not None:
                            blocks_done += 1
                            stop = self._block_done(blocks_done, budget)
                            if stop is not None:
                                break
                        block = step_block
                    self._run_step([order[index] for index in indices], clients, progress, tasks)
                    for name in [order[index][0] for index in indices if index == gsm8k_at[order[index][0]]]:
                        if name in self.servers and self.servers[name].alive():
                            self._gsm8k(name, self.servers[name])
            if stop is not None:
                self._stopped(stop)
            arm_checks.finish(self.run_dir, self.plan.scenario.accuracy, self.options.gsm8k, self.gsm8k_failures)
            status = "done" if self.writer.complete() else "failed"
        except (KeyboardInterrupt, procs.Interrupted):
            status = "interrupted"
            raise
        finally:
            self._close(set(clients.values()), started, status)
        return self.manifest

    def _close(self, clients: set[LoadClient], started: float, status: str) -> None:
        """Stop every client and server; the final timing, the levels never reached and the status, saved."""
        with self.writer.lock:
            for client in clients:
                client.close()
            for server in self.servers.values():
                server.stop()
            if self.cluster is not None:
                self.cluster.close()
            self.timing["client_import_s"] = sum(client.import_s for client in clients)
            self.writer.finish(self.timing, time.monotonic() - started, status)
            self._save()


def _engine_cpu_s(server: VllmServer | RemoteServer) -> float | None:
    """CPU seconds so far of a local server's engine (:func:`harness.run.procs.engine_cpu_seconds`); None for a
    remote one (its ``/proc`` is on another node)."""
    proc = getattr(server, "proc", None)
    return procs.engine_cpu_seconds(proc.pid) if proc is not None else None
