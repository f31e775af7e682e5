"""The arms section of the report: each arm as configured and attested, and what differs between their launches."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from harness.render.log_errors import LogError, split_errors
from harness.render.text import show
from harness.rundir import store as records
from harness.rundir.schema import ArmRecord, Injection


@dataclass(frozen=True)
class PathRow:
    """One key of the intended vs observed execution path of an arm."""

    key: str
    intended: str
    observed: str
    mismatch: bool


@dataclass
class ArmView:
    """An arm as configured and attested in the manifest."""

    name: str
    present: bool
    route: str = "—"
    description: str = ""
    decision_items: list[tuple[str, str]] = field(default_factory=list)
    decision_reasons: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    server_command: str = ""
    server_env: list[tuple[str, str]] = field(default_factory=list)
    reproduce: str = ""
    bench_command: str = ""
    path_rows: list[PathRow] = field(default_factory=list)
    attestation: str = "unknown"       # "valid" | "INVALID" | "unknown"
    mismatches: list[str] = field(default_factory=list)
    server_start_s: float | None = None
    base_url: str = ""
    injected: str = ""                 # the arm's calibration injection ("step-delay ms=50"), "" when none
    log_errors: list[str] = field(default_factory=list)   # server-log errors during a measured level
    log_notes: list[str] = field(default_factory=list)    # server-log errors outside measurement (start-up, shutdown)


def _is_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not token[1].isdigit() and token[1] != "."


def _flag_groups(argv: Any) -> list[list[str]]:
    """Split an argv list into groups: the leading positionals, then one group per flag with its values."""
    groups: list[list[str]] = [[]]
    for token in (str(part) for part in (argv if isinstance(argv, (list, tuple)) else [])):
        if _is_flag(token) and groups[-1]:
            groups.append([])
        groups[-1].append(token)
    return [group for group in groups if group]


def _argv(value: Any) -> str:
    """An argv list as shell-quoted, copy-pastable text: one ``--flag value`` per line, joined by `` \\``.

    A string is shown as it is.
    """
    if not isinstance(value, (list, tuple)):
        return show(value) if value else ""
    return " \\\n  ".join(" ".join(shlex.quote(token) for token in group) for group in _flag_groups(value))


_VOLATILE_FLAGS = ("--port", "--base-url", "--result-filename", "--result-dir")
"""Flags that differ between arms by construction (ports, file names); left out of the arm comparison."""


def arm_differences(base: ArmRecord | None, cand: ArmRecord | None) -> list[tuple[str, str, str]]:
    """What differs between the baseline and candidate launch: ``(what, baseline, candidate)`` rows.

    Compares server flags (ports and result paths excluded), server environment and benchmark flags. Empty when the
    arms launch identically (the caller warns: two identical arms compare nothing) or when an arm is missing.
    """
    if base is None or cand is None:
        return []
    rows: list[tuple[str, str, str]] = []
    for field_name, label in (("server_command", "server"), ("bench_command", "benchmark")):
        groups = [
            {group[0]: " ".join(group[1:])
             for group in _flag_groups(getattr(arm, field_name)) if group[0] not in _VOLATILE_FLAGS}
            for arm in (base, cand)
        ]
        for key in list(groups[0]) + [k for k in groups[1] if k not in groups[0]]:
            left, right = groups[0].get(key), groups[1].get(key)
            if left != right:
                rows.append((f"{label} {key}", "absent" if left is None else (left or "(set)"),
                             "absent" if right is None else (right or "(set)")))
    envs = [arm.server_env for arm in (base, cand)]
    for key in sorted(set(envs[0]) | set(envs[1])):
        left, right = envs[0].get(key), envs[1].get(key)
        if left != right:
            rows.append((f"env {key}", "unset" if left is None else str(left),
                         "unset" if right is None else str(right)))
    return rows


def build_arm(name: str, arm: ArmRecord | None) -> ArmView:
    """An :class:`ArmView` of the manifest's arm ``name`` (``present=False`` when the arm is absent)."""
    if arm is None:
        return ArmView(name=name, present=False)
    reasons: list[str] = []
    items: list[tuple[str, str]] = []
    for key, value in arm.decision.items():
        if key == "reasons" and isinstance(value, (list, tuple)):
            reasons = [show(reason) for reason in value]
        else:
            items.append((str(key), show(value)))
    env_items = sorted((str(k), show(v)) for k, v in arm.server_env.items())
    command = _argv(arm.server_command)
    assignments = [f"{key}={shlex.quote(value)}" for key, value in env_items]
    reproduce = " \\\n".join(assignments + ([command] if command else []))
    intended, observed = arm.intended, arm.observed
    mismatches = [show(m) for m in arm.attestation.mismatches]
    mismatch_text = " ".join(mismatches)
    path_rows = []
    for key in list(intended) + [k for k in observed if k not in intended and k != "errors"]:
        want, got = intended.get(key), observed.get(key)
        differs = key in intended and key in observed and want != got
        path_rows.append(PathRow(
            key=str(key), intended=show(want) if key in intended else "—",
            observed=show(got) if key in observed else "not observed",
            mismatch=differs or (bool(mismatches) and str(key) in mismatch_text),
        ))
    valid = arm.attestation.valid
    during, outside = split_errors(arm)
    return ArmView(
        name=name, present=True, route=show(arm.route), description=show(arm.description),
        decision_items=items, decision_reasons=reasons,
        unavailable=[show(u) for u in arm.unavailable],
        server_command=command, server_env=env_items, reproduce=reproduce,
        bench_command=_argv(arm.bench_command), path_rows=path_rows,
        attestation="valid" if valid is True else ("INVALID" if valid is False or mismatches else "unknown"),
        mismatches=mismatches, server_start_s=records.finite_float(arm.server_start_s),
        base_url=show(arm.base_url or ""), injected=injection_text(arm.injection),
        log_errors=[_error_text(e) for e in during], log_notes=[_error_text(e) for e in outside],
    )


def _error_text(error: LogError) -> str:
    """``"13:43:30 [async_llm.py:906] AsyncLLM output_handler failed. (traceback, 5 lines kept)"``."""
    when = error.at.strftime("%H:%M:%S ") if error.at is not None else ""
    return when + error.message + (f" (traceback, {error.lines} lines kept)" if error.lines > 1 else "")


def injection_text(injection: Injection | None) -> str:
    """``"topk-random"``, ``"step-delay ms=50"``: an injection's kind and parameters; ``""`` without one."""
    if injection is None:
        return ""
    params = " ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
                      for key, value in sorted(injection.params.items()))
    return show(f"{injection.kind} {params}".strip())
