"""The JSON documents of a run directory beside the manifest: GSM8K and parity summaries and ``verdict.json``. Typed
where readers rely on a field, open to the rest (the producer owns its full shape). Re-exported by
:mod:`harness.rundir.schema`, which names their files."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.rundir.levels import Level


class _Open(BaseModel):
    """A summary document: the named fields typed, further keys kept as written (the producer owns their shape)."""

    model_config = ConfigDict(frozen=True, extra="allow")


class AccuracyFilter(_Open):
    """One lm-eval filter's score of an arm: accuracy (0..1), lm-eval's ``mean_stderr``, questions."""

    accuracy: float | None = None
    stderr: float | None = None
    n: int | None = None


class AccuracyArm(_Open):
    """``accuracy/<arm>/arm.json`` (and its copy in the summary): ``status`` "done", "failed: <why>" or "not run"."""

    arm: str = ""
    status: str = "not run"
    task: str | None = None
    source: str | None = None
    data: str | None = None     # which data ran (task, seeds, directory), e.g. "tiny-arith: ... generated ..."
    num_fewshot: int | None = None
    limit: int | None = None
    filters: dict[str, AccuracyFilter] = Field(default_factory=dict)


class AccuracyPair(_Open):
    """The paired comparison of one filter: candidate − baseline in points, discordant counts, exact McNemar p."""

    filter: str
    n: int | None = None
    difference_pts: float | None = None
    baseline_only: int | None = None
    candidate_only: int | None = None
    p_value: float | None = None


class AccuracySummary(_Open):
    """``accuracy/summary.json``: ``status`` "done" | "partial" | "failed" | "skipped"; per-arm scores (``arms``),
    paired rows per filter (``paired``); ``reason`` when an arm or the whole GSM8K step did not run."""

    status: str
    reason: str | None = None
    arms: dict[str, AccuracyArm] = Field(default_factory=dict)
    paired: tuple[AccuracyPair, ...] = ()


class ParitySummary(_Open):
    """``parity.json``: greedy-output comparison of the arms (exact-match rate, first divergences, near ties)."""

    exact_match_rate_pct: float | None = None
    prompts_total: int | None = None


class VerdictCell(_Open):
    """One cell of ``verdict.json``: a metric at a level (``level`` its id ``str(Level)``, ``regime`` its regime's,
    ``concurrency`` its concurrency; all None for GSM8K; a pooled cell has a ``regime`` only — verdict documents
    before schema 3 have no ``level``/``regime``), both arms' figures, Δ (``delta_unit`` "%" or "pt") with its
    interval at ``ci_level``, the margin, ``result`` (None for diagnostics)."""

    metric: str
    label: str
    unit: str = ""
    concurrency: int | None = None
    level: str | None = None
    regime: str | None = None
    primary: bool = True
    result: Literal["PASS", "FAIL", "INCONCLUSIVE", "INVALID"] | None = None
    higher_is_better: bool = True
    baseline: float | None = None
    candidate: float | None = None
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    delta_unit: str = "%"
    ci_level: float | None = None
    margin: float = 0.0
    repeats: int | None = None
    note: str = ""
    mcnemar: dict[str, Any] | None = None
    accuracy: dict[str, Any] | None = None

    @property
    def where(self) -> str:
        """``"c=<concurrency> · <regime>"`` (``"c=<concurrency>"`` without a level id), or ``"GSM8K"``."""
        level = Level.parse(self.level)
        if level is not None:
            return level.label()
        return "GSM8K" if self.concurrency is None else f"c={self.concurrency}"

    def named(self, name: str) -> str:
        """``"<name> <where>"`` (``"Output throughput c=4"``); the GSM8K cell, which has no level, by ``name`` alone."""
        return name if self.where == "GSM8K" else f"{name} {self.where}"


class CorrectnessCellDoc(_Open):
    """One cell of the correctness family in ``verdict.json`` (``harness.judge.correctness_cell.CorrectnessCell``): the
    prompts beyond / within / tied with the A/A envelope, the ``test``'s p against ``alpha`` (a sign test; the
    ``confidence_loss`` cell's Wilcoxon signed-rank test), the A/B and A/A summaries, the first divergent (prompt,
    token) and the per-token quantiles of the cell's statistic (``cdf``)."""

    name: str
    family: str = "correctness"
    result: Literal["PASS", "FAIL", "INCONCLUSIVE", "INVALID"]
    reasons: tuple[str, ...] = ()
    exceed: int = 0
    below: int = 0
    ties: int = 0
    p_fail: float | None = None
    alpha: float | None = None
    ab: dict[str, Any] = Field(default_factory=dict)
    aa: dict[str, Any] = Field(default_factory=dict)
    first: tuple[int, int] | None = None
    cdf: dict[str, list[float]] = Field(default_factory=dict)
    test: str = "sign test"
    note: str = ""


class VerdictDocument(_Open):
    """``verdict.json`` (its own ``schema_version`` 1; fields documented in :mod:`harness.gate`)."""

    schema_version: int = 1
    kind: Literal["dsa-bench.verdict"] = "dsa-bench.verdict"
    run_id: str
    overall: Literal["PASS", "FAIL", "INCONCLUSIVE", "INVALID"]
    exit_code: int
    reason: str
    policy: str = ""
    policy_source: str = ""
    policy_fields: dict[str, Any] = Field(default_factory=dict)
    arms: dict[str, str] = Field(default_factory=lambda: {"baseline": "baseline", "candidate": "candidate"})
    cells: tuple[VerdictCell, ...] = ()
    diagnostics: tuple[VerdictCell, ...] = ()
    pooled: tuple[VerdictCell, ...] = ()       # per metric: the pooled (geometric-mean) hypothesis, FAIL side first
    validity: dict[str, Any] = Field(default_factory=dict)
    notes: tuple[str, ...] = ()
    evaluated: bool = True                      # False: the data could not be read (no figures)
    sessions_needed: int | None = None          # INCONCLUSIVE: sessions per arm for 90 % joint PASS power
    correctness: tuple[CorrectnessCellDoc, ...] = ()   # token divergence and parity against the A/A envelope
    slo: tuple[dict[str, Any], ...] = ()       # SLO attainment per arm and level (harness.judge.attainment)
    prefix_cache: tuple[dict[str, Any], ...] = ()   # prefix-cache hit rate per arm and level (harness.judge.prefix_cache)


class AttributionEffect(BaseModel):
    """One estimated effect of an attribution (``harness.judge.attribution``): ``term`` (a factor name, or two joined
    by ``×``), its ``letters`` (``"A"``, ``"BC"``) and ``alias`` (the letters it is aliased with in a fraction, else
    None), the ``metric`` and ``level``, ``scale`` (``"log"``: the effect is a difference of natural logs, ``percent``
    = 100·(e^estimate − 1); ``"linear"``: in the metric's unit), the estimate with its standard error, the
    ``ci_low``/``ci_high`` interval at ``1 − alpha`` (t with ``df`` residual degrees of freedom), the two-sided
    ``p`` and ``p_holm`` (Holm over every effect tested, ``tests`` of them), ``attributed`` (``p_holm < alpha``), and
    ``note`` (e.g. "no variation")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    term: str
    letters: str
    alias: str | None = None
    metric: str
    level: str
    scale: Literal["log", "linear"]
    estimate: float
    se: float
    ci_low: float
    ci_high: float
    df: int
    p: float | None = None
    p_holm: float | None = None
    attributed: bool = False
    percent: float | None = None
    note: str | None = None


class AttributionObservation(BaseModel):
    """One (arm, block, level) observation: the arm's session in that block, its factor levels (0/1) and the
    block's means (tok/s, ms, tokens; None where not measured)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    arm: str
    block: int
    level: str
    levels: dict[str, int]
    session: int | None = None
    rounds: int = 1
    output_throughput: float | None = None
    server_mean_tpot_ms: float | None = None
    mean_tpot_ms: float | None = None
    acceptance_length: float | None = None
    engine_steps_per_s: float | None = None
    tokens_per_step: float | None = None
    load_avg_1m: float | None = None


class WaterfallStep(BaseModel):
    """One bar of the baseline → candidate waterfall: the factor switched on at this step, the model's predicted
    value before and after (log metrics: natural log), and the change."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    factor: str
    before: float
    after: float
    change: float


class SizeCheck(BaseModel):
    """One injected effect's size check (:mod:`harness.judge.injected_size`): the effect (``metric``, ``level``,
    ``term``, ``letters``, ``estimate`` and its ``ci_low``/``ci_high`` interval, log scale for throughput and TPOT),
    the size the injected step delays predict (``expected``: the mean over ``blocks`` session blocks,
    ``expected_low``/``expected_high`` their range), ``inside`` (the interval holds ``expected``; None when either
    is not a number) and ``miss`` (how far outside; 0 inside)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str
    level: str
    term: str
    letters: str
    estimate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    expected: float | None = None
    expected_low: float | None = None
    expected_high: float | None = None
    blocks: int = 0
    inside: bool | None = None
    miss: float = 0.0


class StepCheck(BaseModel):
    """The size check's assumption measured on one delayed arm: on ``route`` ``"engine"`` (1000 /
    ``engine_steps_per_s``) or ``"request"`` (TPOT × acceptance length), its step time and its reference arm's (ms,
    means over ``blocks``), ``delay_ms`` (its delay minus the reference's), the ``sleeps_per_step`` the difference
    implies (1 when each engine step sleeps once) and the ``excess_ms`` beyond that."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arm: str
    level: str
    route: Literal["engine", "request"]
    delay_ms: float
    step_ms: float
    reference_ms: float
    blocks: int
    sleeps_per_step: float
    excess_ms: float


class InjectedSizes(BaseModel):
    """``attribution.json`` ``injected_sizes``: the expected size of every effect with an injected (step-delay)
    factor against its interval. ``assumption`` in words, ``sleeps_per_step`` it assumes, ``reference``
    ``"matched"`` | ``"pooled"`` (how each arm's reference arm was chosen), the ``checks``, the measured ``steps``,
    ``checked`` (checks with a number) and ``inside`` (of those, within their interval), ``notes``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    assumption: str
    sleeps_per_step: float
    reference: str
    checks: list[SizeCheck] = Field(default_factory=list)
    steps: list[StepCheck] = Field(default_factory=list)
    checked: int = 0
    inside: int = 0
    notes: list[str] = Field(default_factory=list)


class AttributionDocument(BaseModel):
    """``attribution.json``: the design (``design`` "full" | "half", ``factors`` in order with their letters,
    ``generator`` and ``aliases`` of a fraction), the model (``model``: what was fitted), α and the multiplicity
    (``tests``: how many effects Holm ran over), the observations, the effects, the waterfall per (metric, level),
    the arms (levels, intended path, attestation) and the schedule; ``notes`` in words; ``attribution`` the run's
    ``[attribution]`` table (what a recompute from this file alone needs) and ``injected_sizes`` the size check of
    injected step delays (:class:`InjectedSizes`)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    schema_version: Literal[1] = 1
    run_id: str | None = None
    scenario: str | None = None
    design: Literal["full", "half"]
    factors: list[str]
    letters: dict[str, str]
    generator: str | None = None
    aliases: dict[str, str] = Field(default_factory=dict)
    alpha: float
    tests: int
    model: str
    blocks: int
    observations: list[AttributionObservation]
    effects: list[AttributionEffect]
    waterfall: dict[str, list[WaterfallStep]] = Field(default_factory=dict)   # "metric @ level" → steps
    arms: list[dict[str, Any]] = Field(default_factory=list)
    schedule: list[list[Any]] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    attribution: dict[str, Any] | None = None     # the run's [attribution] table (factors, design, injections, …)
    injected_sizes: InjectedSizes | None = None   # the size check of the injected effects (None: nothing injected)
