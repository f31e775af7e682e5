"""The gate's vocabulary and policy: verdict statuses, the gateable metrics with their default margins, and the
``[gate]`` policy (:class:`GatePolicy`).

Pure: data and validation only; no files, processes or sockets. :mod:`harness.run.scenario` embeds :class:`GatePolicy`;
:mod:`harness.judge.validity`, :mod:`harness.judge.verdict` and :mod:`harness.study.simulation` read it.

Margins' origin: the project's acceptance criteria (throughput −3 %, mean TPOT +3 %, GSM8K −1 point, MTP acceptance length
−2 %). For scale: one arm's standard error on the full 1319-question GSM8K
test set at the upstream 94.8 % is 0.61 points (the paired difference's is smaller when few answers change). Throughput
and latency are decided on server sessions; how many a decision takes follows from the paired-block spread
(:mod:`harness.judge.planning`): on this 2-core CPU machine, recorded on real sessions
(``tests/fixtures/recorded/real-sessions``), :data:`RECOMMENDED_REPEATS` sessions per arm give 90 % power against a
10 % throughput loss; below that the gate mostly says
INCONCLUSIVE. p99 latencies, if made primary,
default to +10 %: a tail quantile is far noisier.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.metrics import METRICS as ALL_METRICS, MTP_POSITIONS, Metric
from harness.judge.decode_divergence import DECODE_TOLERANCE
from harness.judge.divergence import CONFIDENCE_TOLERANCE, TOKEN_TOLERANCE
from harness.judge.stalls import Estimator
from harness.rundir.schema import SEVERITY, Level, Status, level_regimes

__all__ = ["Status", "SEVERITY", "Metric", "METRICS", "DEFAULT_PRIMARY", "RECOMMENDED_REPEATS", "GatePolicy"]

RECOMMENDED_REPEATS = 101
"""Sessions per arm recommended for a gated run on the recorded machine:
:func:`harness.judge.planning.recommended_sessions` — 90 % power to FAIL a 10 % throughput loss against the −3 %
margin at α/2 (two speed metrics), at the 95 % upper bound of the paired-block spread recorded on real server sessions
(:data:`harness.judge.planning.RECORDED_PAIR_SD`); ``tests/test_planning.py`` recomputes it from the recording. A host
with a smaller spread needs fewer: ``planning.sessions_for_power`` with its own spread."""


METRICS: dict[str, Metric] = {name: m for name, m in ALL_METRICS.items() if m.default_margin is not None}
"""Every metric a policy may name: the gated ones of the registry :data:`harness.metrics.METRICS`."""

DEFAULT_PRIMARY: tuple[str, ...] = ("output_throughput", "mean_tpot_ms", "gsm8k_accuracy", "acceptance_length")
DIAGNOSTIC: tuple[str, ...] = ("output_throughput", "total_token_throughput", "mean_tpot_ms", "p99_tpot_ms",
                               "mean_ttft_ms", "p99_ttft_ms", "mean_e2el_ms", "acceptance_length",
                               "server_mean_tpot_ms", "engine_steps_per_s", "tokens_per_step", "request_goodput",
                               "slo_attainment",
                               *(f"acceptance_pos_{k}" for k in range(1, MTP_POSITIONS + 1)))
"""Metrics shown with an unadjusted 95 % interval when not primary (no verdict). ``acceptance_pos_<k>`` (MTP
acceptance at draft position k) is gated like ``acceptance_length`` when ``[gate].primary`` names it (each counts as
one metric in the FAIL side's Bonferroni split); shown otherwise, for every position the run drafted."""


class GatePolicy(BaseModel):
    """The gate's policy: the scenario's ``[gate]`` table, or a ``--policy`` TOML file with the same fields.

    Example::

        [gate]
        primary = ["output_throughput", "mean_tpot_ms", "gsm8k_accuracy", "acceptance_length"]
        alpha = 0.05
        levels = [1, 8]              # concurrencies to gate, in every regime (default: every level of the run)
        min_sessions = 4             # server sessions per arm a throughput/latency PASS or FAIL needs
        max_sessions = 10            # optional: group-sequential, stop at PASS/FAIL between 4 and 10 sessions
        estimator = "exclude-stalls" # the default: within-session location of rounds ("mean", "median")
        [gate.margins]               # per metric; % of baseline, or accuracy points for gsm8k_accuracy
        output_throughput = -3.0
        mean_tpot_ms = 3.0
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    primary: tuple[str, ...] = DEFAULT_PRIMARY
    margins: dict[str, float] = Field(default_factory=dict)
    levels: tuple[int, ...] | None = None
    alpha: float = Field(0.05, gt=0.0, lt=0.5)
    min_sessions: int = Field(4, ge=2)
    bootstrap_resamples: int = Field(1000, ge=100, le=100_000)
    seed: int = Field(0, ge=0)
    gsm8k_filter: str = "flexible-extract"
    max_failed_fraction: float = Field(0.01, ge=0.0, le=1.0)
    min_concurrency_fraction: float = Field(0.8, ge=0.0, le=1.0)
    max_client_cpu_util: float = Field(0.9, gt=0.0)
    max_output_len_mismatch_fraction: float = Field(0.0, ge=0.0, le=1.0)
    min_requests_per_concurrency: float = Field(2.0, ge=0.0)
    min_requests_for_p99: int = Field(100, ge=1)
    max_coalesced_fraction: float = Field(0.03, ge=0.0, le=1.0)
    """Largest share of a level's multi-token requests that may arrive as one burst (TTFT ≥ 0.95·E2EL, or a max
    ITL ≈ 0 where recorded) before its latency cells are INVALID. Such a request's TPOT is ≈ 0, so a share ``s``
    pulls mean TPOT down by ≈ ``s``: above the 3 % mean-TPOT margin the burst alone could flip a verdict, so the
    default is that margin (3 %). The server-side latencies (``server_mean_*_ms``, the engine's own timestamps) are
    not affected and stay valid."""
    max_steal_fraction: float = Field(0.10, ge=0.0, le=1.0)
    """Largest host CPU steal share (stolen / all ticks of ``/proc/stat`` over a level) before the round is
    excluded as stalled (under ``estimator = "mean"``: before the level's cells are INVALID). 10 % is the common
    cloud rule of thumb for a guest slowed by its neighbours (IBM, "CPU steal time": sustained steal above 10 % means
    the VM runs slower than it should); it is also over three times the 3 % throughput margin, so steal alone could
    decide a cell."""
    token_tolerance: float = Field(TOKEN_TOLERANCE, gt=0.0, le=1.0)
    """Nats per token: the per-prompt mean ``|Δ log p|`` beyond the A/A envelope that the ``token_divergence`` cell
    counts (below it a prompt is a tie; :data:`harness.judge.divergence.TOKEN_TOLERANCE`, where the default is
    derived). A scenario whose harmless change moves the numerics more (another kernel library) raises it."""
    decode_tolerance: float = Field(DECODE_TOLERANCE, gt=0.0, le=10.0)
    """Nats per position: the per-prompt mean decode-vs-prefill gap of the runner-up token beyond the A/A envelope
    that the ``decode_divergence`` cell counts (:data:`harness.judge.decode_divergence.DECODE_TOLERANCE`, where the
    default is derived). A build whose decode and prefill kernels round differently (another GPU kernel pair) raises it."""
    confidence_tolerance: float = Field(CONFIDENCE_TOLERANCE, gt=0.0, le=1.0)
    """Nats per token: the largest mean fall of the forced tokens' log-odds (against their top-k competitors) a
    correct candidate may show against the A/A; the ``confidence_loss`` cell FAILs a larger fall by a one-sided
    Wilcoxon test (:mod:`harness.judge.confidence`, where the default is derived). A scenario whose harmless change
    moves the numerics more raises it."""
    require_attestation: bool = True
    """Whether a cell needs both arms' execution path attested from their server logs. ``false`` judges results
    whose path cannot be observed (``dsa-bench import``, servers started by other tooling); PASS then rests on the
    caller's word that the arms ran the intended paths."""
    max_sessions: int | None = Field(None, ge=2)
    """Set: the run is group-sequential (:mod:`harness.judge.sequential`) — it schedules up to this many server
    sessions per arm, looks after each block from ``min_sessions`` on and stops at PASS or FAIL. None: the fixed
    design, one look after ``workload.repeats`` sessions."""
    spending: Literal["pocock", "obrien-fleming"] = "pocock"
    """The α-spending function of a sequential run (Lan & DeMets 1983)."""
    estimator: Estimator = "exclude-stalls"
    """The within-session location of rounds and what happens to stalled rounds (:mod:`harness.judge.stalls`):
    ``"mean"`` (every valid round; flagged rounds are reported and kept), ``"exclude-stalls"`` (the default: the mean
    of the rounds not excluded on exogenous evidence) or ``"median"`` (the median of those rounds). The default keeps
    the estimand the ratio of means, so a candidate's own stalls count against it; chosen on recorded sessions with
    injected candidate stalls (results/statistics/README.md)."""

    @model_validator(mode="before")
    @classmethod
    def _renamed_min_repeats(cls, data: Any) -> Any:
        """``min_repeats`` (older policies) is read as ``min_sessions``, with a deprecation warning."""
        if isinstance(data, dict) and "min_repeats" in data:
            data = dict(data)
            old = data.pop("min_repeats")
            if "min_sessions" in data:
                raise ValueError("min_repeats was renamed min_sessions: keep only min_sessions")
            warnings.warn("gate policy key min_repeats is deprecated: it is read as min_sessions (the unit of "
                          "replication is the server session); rename it", DeprecationWarning, stacklevel=2)
            data["min_sessions"] = old
        return data

    @field_validator("primary")
    @classmethod
    def _known_primary(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in value if name not in METRICS]
        if unknown:
            raise ValueError(f"unknown primary metrics {unknown}; choose from {sorted(METRICS)}")
        if not value:
            raise ValueError("primary must name at least one metric")
        if len(set(value)) != len(value):
            raise ValueError("primary lists a metric twice")
        return value

    @field_validator("levels")
    @classmethod
    def _positive_levels(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and (not value or any(level <= 0 for level in value)):
            raise ValueError("levels must be positive concurrencies (omit the key for every level of the run)")
        return None if value is None else tuple(sorted(set(value)))

    def wanted_levels(self, levels: Sequence[Level]) -> tuple[Level, ...]:
        """The run's ``levels`` the gate judges: those whose concurrency is in ``levels`` (in every regime that has
        it), or all of them when the policy names none. A named concurrency no regime has becomes a level of the
        first regime, judged INVALID ("not in this run"), so a policy that asks for it never PASSes without it."""
        if self.levels is None:
            return tuple(levels)
        found = {level for level in levels if level.concurrency in self.levels}
        regimes = level_regimes(levels)
        lacking = [c for c in self.levels if all(level.concurrency != c for level in found)]
        return tuple(sorted(found | ({regimes[0].at(c) for c in lacking} if regimes else set())))

    @model_validator(mode="after")
    def _sequential_range(self) -> "GatePolicy":
        if self.max_sessions is not None and self.max_sessions < self.min_sessions:
            raise ValueError(f"max_sessions = {self.max_sessions} is below min_sessions = {self.min_sessions}: a "
                             "sequential run looks from min_sessions up to max_sessions sessions per arm")
        return self

    @model_validator(mode="after")
    def _margins_match_direction(self) -> "GatePolicy":
        for name, margin in self.margins.items():
            spec = METRICS.get(name)
            if spec is None:
                raise ValueError(f"margins names unknown metric {name!r}; choose from {sorted(METRICS)}")
            bad = margin > 0 if spec.higher_is_better else margin < 0
            if bad or not math.isfinite(margin) or (spec.margin_unit == "%" and abs(margin) >= 100):
                sign = "≤ 0" if spec.higher_is_better else "≥ 0"
                raise ValueError(f"margins.{name} = {margin}: {spec.label} is "
                                 f"{'higher' if spec.higher_is_better else 'lower'}-is-better, so its margin "
                                 f"(the tolerated change on the bad side) must be {sign}"
                                 f"{' and above -100 %' if spec.margin_unit == '%' else ''}")
        return self

    def margin(self, name: str) -> float:
        """The margin of ``name``: the policy's override or the metric's default (percent or accuracy points)."""
        return float(self.margins.get(name, METRICS[name].default_margin))

    def limit(self, name: str) -> float:
        """The margin on the test scale: ``log(1 + margin/100)`` for ratios, ``margin/100`` for accuracy."""
        margin = self.margin(name)
        return margin / 100.0 if METRICS[name].source == "accuracy" else math.log1p(margin / 100.0)

    def without(self, *names: str) -> "GatePolicy":
        """This policy with ``names`` dropped from ``primary`` (e.g. for ``--no-mtp``/``--no-gsm8k`` runs)."""
        return self.model_copy(update={"primary": tuple(n for n in self.primary if n not in names)})

    def describe(self) -> str:
        """One line: the margins and the correction."""
        parts = [f"{n} {self.margin(n):+g}{' pt' if METRICS[n].margin_unit == 'pt' else ' %'}" for n in self.primary]
        metrics = len(self.primary)
        return (f"non-inferiority at α = {self.alpha:g}: PASS by intersection–union (every primary cell passes its "
                f"own test at α; Berger 1982); FAIL by Holm (1979) per metric at α/{metrics} (Bonferroni over the "
                "metrics, valid under any dependence, e.g. throughput and TPOT of the same requests) over the family "
                "{each regime's pooled hypothesis (geometric mean of its per-level ratios, unit = the session pair), "
                "each level}; accuracy by Tango's (1998) score test against its margin; "
                "margins: " + ", ".join(parts))
