"""Cell validity: the checks that make a run's data unfit to compare, per arm and level (:func:`check_validity`).

Pure: functions of the typed manifest and the ``levels.csv``/``requests.csv`` frames (schema: :mod:`harness.rundir.schema`);
no files, processes or sockets. In :mod:`harness.judge.verdict` a failed check makes the cells of that level INVALID (a
failed attestation: every cell of the run); missing or unfit data never yields PASS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.judge.policy import GatePolicy
from harness.judge.stalls import excludes
from harness.metrics import achieved_concurrency, succeeded
from harness.rundir.schema import ArmRecord, Level, LevelState, Manifest, level_state, workload_levels
from harness.rundir.v2 import with_level_column
from harness.metrics import finite_float

__all__ = ["ValidityReport", "check_validity"]


@dataclass
class ValidityReport:
    """Validity of a run's data, per arm and level.

    Attributes:
        arms: ``{"baseline": name, "candidate": name}`` (arm names in the tables).
        reasons: ``{(arm, level): [(round or None, detail)]}`` — any makes every cell of that level INVALID
            (:meth:`level_reasons` words them).
        arm_reasons: ``{arm: [reason]}`` — reasons that invalidate every cell of the arm (attestation).
        done: ``{(arm, level): {round}}`` — rounds whose data passed every check.
        no_requests: ``{(arm, level): {round}}`` — done rounds without requests.csv rows (request metrics only).
        levels: every level the run planned or holds.
        not_checked: checks that could not run on this data, with why.
        failures: one record per failed check ``{arm, level, concurrency, round, check, detail}`` (``level``
            ``str(Level)``).
        latency_reasons: ``{(arm, level): [detail]}`` — reasons that make only the level's latency cells (unit
            "ms") INVALID, e.g. coalesced streams; throughput stays valid.
        performance_reasons: reasons that make every throughput and latency cell INVALID (the arms ran different
            installed packages without the scenario saying so); GSM8K and MTP acceptance stay valid.
    """

    arms: dict[str, str]
    reasons: dict[tuple[str, Level], list[str]] = field(default_factory=dict)
    arm_reasons: dict[str, list[str]] = field(default_factory=dict)
    done: dict[tuple[str, Level], set[int]] = field(default_factory=dict)
    no_requests: dict[tuple[str, Level], set[int]] = field(default_factory=dict)
    levels: tuple[Level, ...] = ()
    not_checked: list[str] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    latency_reasons: dict[tuple[str, Level], list[str]] = field(default_factory=dict)
    performance_reasons: list[str] = field(default_factory=list)

    def fail_latency(self, arm: str, level: Level, check: str, detail: str) -> None:
        self.latency_reasons.setdefault((arm, level), []).append(detail)
        self.failures.append({"arm": arm, "level": str(level), "concurrency": level.concurrency, "round": None,
                              "check": check, "detail": detail})

    def level_latency_reasons(self, level: Level) -> list[str]:
        """The level's latency-only failures for both arms: ``candidate: <detail>``."""
        return [f"{role}: {detail}" for role in ("baseline", "candidate")
                for detail in self.latency_reasons.get((self.arms[role], level), [])]

    def fail(self, arm: str, level: Level, round_no: int | None, check: str, detail: str) -> None:
        self.reasons.setdefault((arm, level), []).append((round_no, detail))
        self.failures.append({"arm": arm, "level": str(level), "concurrency": level.concurrency, "round": round_no,
                              "check": check, "detail": detail})

    def level_reasons(self, level: Level) -> list[str]:
        """The level's failures for both arms, one line per distinct problem: ``baseline r0, r3: <detail>``."""
        grouped: dict[str, dict[str, list[int | None]]] = {}
        for role in ("baseline", "candidate"):
            for round_no, detail in self.reasons.get((self.arms[role], level), []):
                grouped.setdefault(detail, {}).setdefault(role, []).append(round_no)
        lines = []
        for detail, roles in grouped.items():
            who = []
            for role, rounds in roles.items():
                shown = [f"r{r}" for r in rounds if r is not None]
                if len(shown) > 4:
                    shown = shown[:3] + [f"… ({len(shown)} rounds)"]
                who.append(role + (" " + ", ".join(shown) if shown else ""))
            lines.append(f"{' and '.join(who)}: {detail}")
        return lines


def keyed_rows(frame) -> dict[tuple[str, Level, int], Any]:
    """``levels.csv`` rows by ``(arm, level, round)`` (the last of duplicates; rows whose level does not parse are
    left out — :meth:`harness.rundir.store.RunDir.levels` refuses them when read as numbers)."""
    if not len(frame):
        return {}
    rows = frame.drop_duplicates(["arm", "level", "round"], keep="last")
    return {(str(a), level, int(r)): row for (a, l, r), row in rows.set_index(["arm", "level", "round"]).iterrows()
            if (level := Level.parse(l)) is not None}


def keyed_groups(frame) -> dict[tuple[str, Level, int], Any]:
    """``requests.csv`` rows grouped by ``(arm, level, round)`` (levels that do not parse left out)."""
    if not len(frame):
        return {}
    return {(str(a), level, int(r)): group for (a, l, r), group in frame.groupby(["arm", "level", "round"])
            if (level := Level.parse(l)) is not None}


def arm_names(manifest: Manifest) -> dict[str, str]:
    """``{"baseline": name, "candidate": name}``: the arm playing each role. Roles are the arms' names (a scenario's
    ``[arms.baseline]`` and ``[arms.candidate]``), never their routes: an A/A run, or main against a PR build, gives
    both arms the same route. Arms with other names take the roles in manifest order (baseline first)."""
    names = [arm.name for arm in manifest.arms]
    if {"baseline", "candidate"} <= set(names) or len(names) < 2:
        return {"baseline": "baseline", "candidate": "candidate"}
    return {"baseline": names[0], "candidate": names[1]}


def _flag_value(argv: Any, flag: str) -> str | None:
    if not isinstance(argv, (list, tuple)):
        return None
    for i, item in enumerate(argv):
        if item == flag and i + 1 < len(argv):
            return str(argv[i + 1])
        if isinstance(item, str) and item.startswith(flag + "="):
            return item.split("=", 1)[1]
    return None


def _exact_output_len(arm: ArmRecord | None) -> bool:
    """Whether every request must produce exactly its level's ``output_len`` (``--ignore-eos``, no length range)."""
    argv = arm.bench_command if arm is not None else None
    if not isinstance(argv, (list, tuple)) or "--ignore-eos" not in argv:
        return False
    try:
        return float(_flag_value(argv, "--random-range-ratio") or 0) == 0
    except ValueError:
        return False


def check_validity(manifest: Manifest, levels, requests, policy: GatePolicy) -> ValidityReport:
    """Run every validity check on the run's data.

    Per arm and level (any failure → the level's cells are INVALID): a planned round not ``done`` (failed, skipped,
    missing — a partial run; rounds ``stopped`` by a sequential look or the budget are no longer planned); a done round without its levels.csv row; failed requests above
    ``max_failed_fraction``; fewer than ``min_requests_per_concurrency × c`` completed requests (ramp-up and drain
    dominate); achieved concurrency below ``min_concurrency_fraction × c`` by vLLM's ``max_concurrent_requests`` or by
    the per-request timeline; the client saturated (``client_cpu_util`` ≥ ``max_client_cpu_util``); under
    ``--ignore-eos``, server-counted output tokens differing from the requested length; requests.csv rows disagreeing
    with levels.csv counts. Per arm and level, latency cells only: coalesced streams above
    ``max_coalesced_fraction`` (:func:`coalesced_share`). Per arm: the observed path differs from the intended one
    (attestation), or, with ``require_attestation``, was not attested. Per arm and level: the host's CPU steal
    share over the level above ``max_steal_fraction`` under ``estimator = "mean"`` (other estimators exclude such a
    round instead: :mod:`harness.judge.stalls`; not checked where ``host_steal_fraction`` is not recorded; the load average is recorded and shown, never judged: on a shared host it is the benchmark's own load too).
    Per level: a ``levels.csv`` level that neither the scenario nor ``manifest.json`` declares
    (:func:`_check_declared`).
    """
    levels, requests = (with_level_column(frame, manifest.scenario_data()) for frame in (levels, requests))
    report = ValidityReport(arms=arm_names(manifest))
    planned_levels = workload_levels(manifest.scenario_value("workload"))
    blocks = manifest.scenario_value("workload", "repeats")   # session blocks
    per_session = manifest.rounds_per_session()
    planned_rounds = int(blocks) * int(per_session) if finite_float(blocks) else None   # rounds in all
    level_set = set(planned_levels) | {Level.parse(v) for v in levels["level"].dropna()} - {None}
    statuses: dict[tuple[str, Level], dict[int, str]] = {}
    stopped: set[int] = set()
    for role, arm in report.arms.items():
        record = manifest.arm(arm)
        for key, entry in record.level_items() if record is not None else []:
            if entry.state is LevelState.STOPPED:   # no longer planned: the run stopped before it
                stopped.add(key.round)
                continue
            statuses.setdefault((arm, key.level), {})[key.round] = entry.status
            level_set.add(key.level)
        attestation = record.attestation if record is not None else None
        if attestation is not None and attestation.valid is False:
            mismatches = "; ".join(attestation.mismatches) or "no details"
            report.arm_reasons.setdefault(arm, []).append(f"{role}: observed path differs from intended ({mismatches})")
        elif not (attestation is not None and attestation.valid is True) and policy.require_attestation:
            why = (attestation.note if attestation is not None and attestation.note
                   else f"manifest.json has no attestation for arm {arm}")
            report.arm_reasons.setdefault(arm, []).append(
                f"{role}: execution path not attested ({why}); a policy with require_attestation = false judges "
                "it anyway")
    report.levels = tuple(sorted(level_set))
    _check_declared(manifest, report, set(planned_levels), level_set - set(planned_levels))

    has_cpu = "client_cpu_util" in levels.columns and levels["client_cpu_util"].notna().any()
    if not has_cpu:
        report.not_checked.append("client saturation: levels.csv has no client_cpu_util")
    has_requested = "requested_output_len" in requests.columns
    level_rows = keyed_rows(levels)
    request_groups = keyed_groups(requests)
    if not request_groups:
        report.not_checked.append("timeline concurrency and output lengths: requests.csv is absent or empty")
    exact_len = {arm: _exact_output_len(manifest.arm(arm)) for arm in report.arms.values()}
    if not has_requested and not any(exact_len.values()):
        report.not_checked.append("output lengths: not an --ignore-eos run with a fixed --random-output-len")

    for arm in report.arms.values():
        for level in report.levels:
            recorded = statuses.get((arm, level), {})
            rows = {r for (a, c, r) in level_rows if a == arm and c == level}
            planned = set(recorded) | rows | (set(range(planned_rounds)) - stopped if planned_rounds else set())
            if not planned:
                report.fail(arm, level, None, "missing", "level not run (no manifest entry, no levels.csv row)")
                continue
            done = set()
            for round_no in sorted(planned):
                status = recorded.get(round_no, "done" if round_no in rows and not recorded else None)
                if status is None:
                    report.fail(arm, level, round_no, "missing", "not run (no manifest entry)")
                elif status != "done":
                    report.fail(arm, level, round_no, "status", f"{status}" if level_state(status) is LevelState.FAILED
                                else f"not run ({status})")
                elif round_no not in rows:
                    report.fail(arm, level, round_no, "missing", "done in manifest.json but no levels.csv row")
                elif _check_round(report, policy, arm, level, round_no, level_rows[(arm, level, round_no)],
                                   request_groups.get((arm, level, round_no)),
                                   level.output_len if exact_len[arm] else None, has_requested):
                    done.add(round_no)
            report.done[(arm, level)] = done
            report.no_requests[(arm, level)] = {r for r in done if (arm, level, r) not in request_groups}
            frames = [request_groups[(arm, level, r)] for r in sorted(done) if (arm, level, r) in request_groups]
            if frames:
                _check_coalesced(report, policy, arm, level, frames)
    _check_packages(manifest, report)
    _check_idle_gpus(manifest, report)
    if "host_steal_fraction" not in levels.columns or not levels["host_steal_fraction"].notna().any():
        report.not_checked.append("host steal time: levels.csv has no host_steal_fraction (older run directories, "
                                  "imported results, or a host without /proc/stat)")
    return report


def _check_declared(manifest: Manifest, report: ValidityReport, planned: set[Level], others: set[Level]) -> None:
    """Fail, in both arms, every level of ``others`` (levels the tables or the manifest's entries hold beyond the
    scenario's ``planned`` ones) that neither the scenario nor any arm's ``manifest.json`` entry (stopped ones
    included) declares: rows of a hand-edited or foreign ``levels.csv`` relabelled to another level or regime are no
    level of the run, and must not be judged as one. Not checked (said so) when nothing declares a level."""
    declared = planned | {key.level for arm in manifest.arms for key, _ in arm.level_items()}
    if not declared:
        report.not_checked.append("declared levels: neither the scenario nor manifest.json declares a level")
        return
    for level in sorted(others - declared):
        for arm in report.arms.values():
            report.fail(arm, level, None, "undeclared",
                        f"level {level} is in levels.csv but not declared by the scenario or manifest.json "
                        "(hand-edited or foreign rows); remove those rows or restore their level")


def _declares_difference(manifest: Manifest, arm: ArmRecord) -> bool:
    """Whether the scenario says this arm's packages differ: its own ``vllm`` build, or ``packages_differ``."""
    spec = manifest.scenario_value("arms", arm.name)
    spec = spec if isinstance(spec, dict) else {}
    return bool(spec.get("vllm") or spec.get("packages_differ") or (arm.build is not None and arm.build.declared))


def _check_packages(manifest: Manifest, report: ValidityReport) -> None:
    """Both arms' installed packages (``pip freeze``'s set, hashed in ``arms[].build``) must be identical unless the
    scenario declares the difference; else every throughput and latency cell is INVALID (the software, not the
    path, could explain a difference)."""
    records = [manifest.arm(name) for name in report.arms.values()]
    hashes = [r.build.packages_sha256 if r is not None and r.build is not None else None for r in records]
    if None in hashes:
        report.not_checked.append("installed packages: manifest.json has no package hash for an arm (servers "
                                  "started by other tooling, imported results, or a run directory before the check)")
        return
    if hashes[0] == hashes[1] or any(_declares_difference(manifest, r) for r in records):
        return
    base, cand = (set(r.build.packages) for r in records)
    changed = sorted(base ^ cand)
    shown = ", ".join(changed[:6]) + (f" … ({len(changed)} in all)" if len(changed) > 6 else "")
    detail = (f"the arms ran different installed packages ({shown or 'same names, other hash'}) and the scenario "
              "does not declare it ([arms.X] vllm or packages_differ = true)")
    report.performance_reasons.append(detail)
    report.failures.append({"arm": None, "concurrency": None, "round": None, "check": "packages", "detail": detail})


MAX_IDLE_GPU_UTILIZATION_PCT = 5.0
"""An idle GPU reports 0 % (nvidia-smi ``utilization.gpu``: the share of the last sample period a kernel ran); 5 %
leaves room for a monitoring agent, not for another job."""
MAX_IDLE_GPU_MEMORY_MIB = 1024.0
"""An idle GPU holds a few MiB (driver context); 1 GiB is more than any idle context, less than any model's weights."""


def busy_gpus(gpus) -> list[str]:
    """One line per recorded GPU (:class:`~harness.rundir.schema.GpuState`) above either idle threshold."""
    return [f"GPU {g.index}: {g.utilization_pct:g} % utilised, {g.memory_used_mib:g} MiB used" for g in gpus
            if (g.utilization_pct or 0.0) > MAX_IDLE_GPU_UTILIZATION_PCT
            or (g.memory_used_mib or 0.0) > MAX_IDLE_GPU_MEMORY_MIB]


def _check_idle_gpus(manifest: Manifest, report: ValidityReport) -> None:
    """The levels of a session whose GPUs were busy just before its server started are INVALID (another process
    shared them); sessions without a reading are said in ``not_checked`` once, except on a CPU platform (no GPUs
    to check)."""
    unchecked = set()
    if manifest.platform.name == "cpu":
        return
    for arm in report.arms.values():
        record = manifest.arm(arm)
        for session in record.sessions if record is not None else ():
            if session.gpus_before is None:
                unchecked.add(session.gpu_note or "no nvidia-smi reading recorded")
                continue
            found = busy_gpus(session.gpus_before)
            if not found:
                continue
            for key, entry in record.level_items():
                if entry.session == session.index:
                    report.fail(arm, key.level, key.round, "gpus_busy",
                                f"session {session.index}'s GPUs were busy before its server started "
                                f"({'; '.join(found)})")
    if unchecked:
        report.not_checked.append("idle GPUs before each session: " + "; ".join(sorted(unchecked)))


COALESCED_TTFT_SHARE = 0.95
"""A request whose first token took ≥ 95 % of its end-to-end latency delivered its output in one burst."""
COALESCED_MAX_ITL_MS = 0.1
"""A largest inter-token gap below 0.1 ms: faster than any model step (≥ ~1 ms even for a tiny model), so a burst."""


def coalesced_share(frame) -> tuple[int, int]:
    """``(coalesced, checked)`` among the successful requests with more than one output token: coalesced when
    ``ttft_ms ≥ 0.95 · e2el_ms`` or, where recorded, ``max_itl_ms < 0.1``."""
    ok = succeeded(frame)
    ok = ok[ok["output_len"].to_numpy(dtype=float) > 1]
    ttft, e2el = ok["ttft_ms"].to_numpy(dtype=float), ok["e2el_ms"].to_numpy(dtype=float)
    burst = np.isfinite(ttft) & np.isfinite(e2el) & (ttft >= COALESCED_TTFT_SHARE * e2el)
    if "max_itl_ms" in ok.columns:
        max_itl = ok["max_itl_ms"].to_numpy(dtype=float)
        burst |= np.isfinite(max_itl) & (max_itl < COALESCED_MAX_ITL_MS)
    return int(burst.sum()), int(len(ok))


def _check_coalesced(report: ValidityReport, policy: GatePolicy, arm: str, level: Level, frames) -> None:
    """Coalesced streams over the level's valid rounds: above ``max_coalesced_fraction`` its latency cells are
    INVALID (TPOT ≈ 0 for a burst: a candidate that buffers output would look faster)."""
    counts = [coalesced_share(frame) for frame in frames]
    coalesced, checked = sum(c for c, _ in counts), sum(n for _, n in counts)
    if checked and coalesced / checked > policy.max_coalesced_fraction:
        report.fail_latency(arm, level, "coalesced_streams",
                            f"{coalesced} of {checked} requests arrived as one burst (TTFT ≥ 0.95·E2EL or max "
                            f"ITL ≈ 0), above {100 * policy.max_coalesced_fraction:g} %: TPOT and ITL of this level "
                            "are not per-token figures")


def _check_round(report: ValidityReport, policy: GatePolicy, arm: str, level: Level, round_no: int, row,
                  frame, expected_len: int | None, has_requested: bool) -> bool:
    """Checks on one done round_no; records failures and returns whether it passed them all."""
    before = len(report.failures)
    completed, failed = finite_float(row.get("completed")) or 0.0, finite_float(row.get("failed")) or 0.0
    total = completed + failed
    if completed <= 0:
        report.fail(arm, level, round_no, "failed_requests", "no completed requests")
    elif failed / total > policy.max_failed_fraction:
        report.fail(arm, level, round_no, "failed_requests",
                    f"{failed:.0f} of {total:.0f} requests failed (> {100 * policy.max_failed_fraction:g} %)")
    c = level.concurrency
    if 0 < completed < policy.min_requests_per_concurrency * c:
        report.fail(arm, level, round_no, "too_few_requests",
                    f"{completed:.0f} requests at concurrency {c}: fewer than "
                    f"{policy.min_requests_per_concurrency:g}×{c}, ramp-up and drain dominate")
    peak = finite_float(row.get("max_concurrent_requests"))
    if peak is not None and peak < policy.min_concurrency_fraction * c:
        report.fail(arm, level, round_no, "concurrency", f"vLLM's max_concurrent_requests {peak:.0f} far below "
                                                       f"the level's concurrency {c}")
    cpu = finite_float(row.get("client_cpu_util"))
    if cpu is not None and cpu >= policy.max_client_cpu_util:
        report.fail(arm, level, round_no, "client_saturated",
                    f"benchmark client used {100 * cpu:.0f} % of a core (≥ {100 * policy.max_client_cpu_util:g} %): "
                    "the client, not the server, may be the bottleneck")
    steal = finite_float(row.get("host_steal_fraction"))
    if steal is not None and steal > policy.max_steal_fraction and not excludes(policy.estimator):
        report.fail(arm, level, round_no, "host_steal",
                    f"the host's CPU steal time was {100 * steal:.1f} % of its CPU time during the level (> "
                    f"{100 * policy.max_steal_fraction:g} %): other guests of the hypervisor, not the server, set the "
                    "pace")
    if frame is not None:
        if len(frame) != total:
            report.fail(arm, level, round_no, "request_rows", f"requests.csv has {len(frame)} rows, levels.csv "
                                                            f"counts {total:.0f} requests")
        ok = succeeded(frame)
        achieved = achieved_concurrency(ok)
        if achieved is not None and achieved < policy.min_concurrency_fraction * c:
            report.fail(arm, level, round_no, "concurrency",
                        f"achieved concurrency {achieved:.2f} (Σ E2EL / span) far below {c}")
        expected = ok["requested_output_len"] if has_requested else (
            None if expected_len is None else expected_len)
        if expected is not None:
            wanted = np.asarray(expected, dtype=float) if has_requested else np.full(len(ok), float(expected_len))
            got = ok["output_len"].to_numpy(dtype=float)
            checkable = np.isfinite(wanted)
            mismatched = int((got[checkable] != wanted[checkable]).sum())
            if checkable.any() and mismatched / checkable.sum() > policy.max_output_len_mismatch_fraction:
                report.fail(arm, level, round_no, "output_len",
                            f"{mismatched} of {int(checkable.sum())} requests produced a different number of tokens "
                            "than requested under --ignore-eos (the server stopped early or counted differently)")
    return len(report.failures) == before
