"""Scenarios: a run is a TOML file in ``scenarios/``; CLI flags only override it.

A scenario is validated into frozen pydantic models — its tables here, the workload in
:mod:`harness.run.workload_spec`, the arms in :mod:`harness.run.arm_spec`, the cluster in
:mod:`harness.run.cluster_spec`, the attribution in :mod:`harness.run.factors`. Every error names the file, the key
and the fix, in one line (:class:`ScenarioError`). Loading is pure (reads one file, no processes, no network).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, model_validator

from harness.judge.policy import GatePolicy
from harness.run.arm_spec import ArmSpec
from harness.run.factors import AttributionSpec, generated_arms
from harness.run.cluster_spec import ClusterSpec
from harness.run.spec_base import Frozen as _Frozen, one_of as _one_of
from harness.run.workload_spec import WorkloadSpec
from harness.rundir.files import first_error

REPO_ROOT = Path(__file__).resolve().parents[2]
SCENARIOS_DIR = REPO_ROOT / "scenarios"

# dsa-bench quantization names → vLLM `--quantization` values. Source: vllm/model_executor/layers/quantization/
# __init__.py (QuantizationMethods, vLLM 0.32); NVFP4 checkpoints (ModelOpt) load as "modelopt_fp4".
QUANTIZATIONS: dict[str, str | None] = {
    "none": None,
    "fp8": "fp8",
    "nvfp4": "modelopt_fp4",
    "modelopt_fp4": "modelopt_fp4",
    "mxfp4": "mxfp4",
}

# Source: vllm/config/cache.py CacheDType (vLLM 0.32), the subset that applies to MLA/DSA models.
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_ds_mla")

# Architectures dsa-bench knows how to serve (DeepSeek MLA family). Source: vllm/model_executor/models/registry.py.
ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")


class ScenarioError(ValueError):
    """A scenario file or override is invalid; ``str(error)`` is the one-line message for the user."""


class ModelSpec(_Frozen):
    """The model under test.

    ``id`` is a local path, a Hugging Face id, or ``generated:<name>`` for a tiny model of the project
    (:func:`dsa_route.tiny.ensure_model`: a seeded preset generated on first use, or ``tiny-deepseek-v32-arith``, the
    committed checkpoint trained in-repo on the ``tiny-arith`` task). ``hf_config_path`` (relative to ``scenarios/``) ships the
    config.json for dummy-weight runs so no hub access is needed for the config.
    """

    id: str
    architecture: Annotated[str, AfterValidator(_one_of("architecture", ARCHITECTURES))]
    load_format: Literal["auto", "dummy", "safetensors"] = "auto"
    tokenizer: str | None = None
    hf_config_path: str | None = None
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    max_model_len: int = Field(gt=0)



class ServeSpec(_Frozen):
    """Options shared by both arms' ``vllm serve`` (arms add their own on top)."""

    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    quantization: Annotated[str, AfterValidator(_one_of("quantization", tuple(QUANTIZATIONS)))] = "none"
    kv_cache_dtype: Annotated[str, AfterValidator(_one_of("kv_cache_dtype", KV_CACHE_DTYPES))] = "auto"
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    chunked_prefill: bool = True
    concurrent_servers: bool = False
    restart_per_block: bool = False   # concurrent servers: a fresh pair of sessions at every session block
    duet: bool = False   # concurrent servers on disjoint cores/GPUs, each level sent to both arms at the same time
    ready_timeout_s: float = Field(default=900.0, gt=0)
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)


    @property
    def vllm_quantization(self) -> str | None:
        """The value for vLLM's ``--quantization`` (None: not passed)."""
        return QUANTIZATIONS[self.quantization]


class SloSpec(_Frozen):
    """Service-level objectives per request (``[slo]``, milliseconds; None = no objective on that figure): TTFT,
    TPOT and E2EL. With any set, every level is measured with ``vllm bench serve --goodput`` and records vLLM's
    goodput — requests meeting every objective per second (DistServe, Zhong et al. 2024) — and the share of requests
    meeting them (``levels.csv`` ``request_goodput``, ``slo_attainment``)."""

    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    e2el_ms: float | None = Field(default=None, gt=0)

    def goodput_args(self) -> list[str]:
        """``["--goodput", "ttft:500", "tpot:25"]`` (vLLM's ``KEY:VALUE`` pairs in ms); ``[]`` without objectives."""
        pairs = [f"{name}:{value:g}" for name, value in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms),
                                                         ("e2el", self.e2el_ms)) if value is not None]
        return ["--goodput", *pairs] if pairs else []


class MtpSpec(_Frozen):
    """Multi-token prediction: ``num_speculative_tokens`` drafts per step, 0 = off."""

    num_speculative_tokens: int = Field(default=0, ge=0)


TASKS = ("gsm8k", "tiny-arith")
"""What lm-eval's ``gsm8k`` task (its prompt, filters and metric) runs on: ``gsm8k`` the real GSM8K (``data_dir``,
``../shared/data/gsm8k`` or the hub), ``tiny-arith`` GSM8K-format arithmetic problems generated at run time by
:mod:`dsa_route.tiny.arith.task` (train seed 0, test seed 1; the task of ``generated:tiny-deepseek-v32-arith``)."""


class AccuracySpec(_Frozen):
    """GSM8K-format accuracy through lm-eval. ``task`` one of :data:`TASKS`; ``limit`` None = full test set (for
    ``tiny-arith``: the number of test problems generated, required); ``data_dir`` holds train/test.jsonl (``gsm8k``
    only)."""

    enabled: bool = False
    task: Annotated[str, AfterValidator(_one_of("accuracy.task", TASKS))] = "gsm8k"
    num_fewshot: int = Field(default=5, ge=0)
    limit: int | None = Field(default=None, gt=0)
    data_dir: str | None = None
    num_concurrent: int = Field(default=8, gt=0)
    timeout_s: float = Field(default=3600.0, gt=0)

    @model_validator(mode="after")
    def _generated_task(self) -> "AccuracySpec":
        if self.task == "tiny-arith" and self.data_dir is not None:
            raise ValueError("accuracy.data_dir is for task gsm8k; task tiny-arith generates its own data (drop "
                             "data_dir, or set task = \"gsm8k\")")
        if self.task == "tiny-arith" and self.limit is None:
            raise ValueError("task tiny-arith needs accuracy.limit: the number of test problems to generate (e.g. 128)")
        return self


PARITY_PROMPTS = ("generic", "tiny-arith")
"""Where the parity prompts come from: ``generic`` :func:`harness.run.parity.fixed_prompts` (English GSM8K-like
sentences), ``tiny-arith`` 0-shot prompts of the arithmetic task (seed 2: neither the train nor the test split)."""


class ParitySpec(_Frozen):
    """Output parity: ``n`` greedy prompts of ``prompts`` (:data:`PARITY_PROMPTS`), ``max_tokens`` each;
    ``ignore_eos`` false stops a request at the model's end-of-sequence (the answer is the unit compared).
    ``tiny-arith`` only: ``long_n`` more prompts of the same task with ``long_distractors`` (min, max) distractor
    sentences each, several times ``index_topk`` long, where what the indexer selects far back decides the answer
    (they follow the ``n`` short ones; every cell pools all ``n + long_n``)."""

    prompts: Annotated[str, AfterValidator(_one_of("parity.prompts", PARITY_PROMPTS))] = "generic"
    n: int = Field(default=16, gt=0)
    long_n: int = Field(default=0, ge=0)
    long_distractors: tuple[int, int] = (16, 24)
    max_tokens: int = Field(default=64, gt=0)
    ignore_eos: bool = True
    gated: bool = True
    """Score the baseline's greedy continuations on both arms and on the A/A sessions (:mod:`harness.run.scoring`) and
    gate the correctness cells (:mod:`harness.judge.divergence`). Never under ``load_format = "dummy"``
    (:func:`gates_tokens`): every tensor is drawn U(−1e-3, 1e-3) from a generator re-seeded with 1234 per tensor
    (vLLM 0.32 ``model_executor/model_loader/weight_utils.py:1544-1596``, called per layer tensor by
    ``dummy_loader.py:35-48``), so two model classes do get identical values for tensors of the same shape and dtype
    whatever their creation order — but the logits are then ≈ 0 (log p ≈ −ln V, a flat distribution a defect barely
    moves), and integer tensors (NVFP4/GPTQ packed weights) are left uninitialised ``torch.empty`` except on ROCm
    (:1557-1563), so they differ between the arms' processes. Token cells on dummy weights would check nothing."""

    @model_validator(mode="after")
    def _long_prompts(self) -> "ParitySpec":
        if self.long_n and self.prompts != "tiny-arith":
            raise ValueError("parity.long_n needs prompts = \"tiny-arith\" (the generic prompts have no long form); "
                             "drop long_n or set prompts = \"tiny-arith\"")
        low, high = self.long_distractors
        if not 0 <= low <= high:
            raise ValueError(f"parity.long_distractors: need 0 <= min <= max, got {list(self.long_distractors)}; "
                             f"write [min, max], e.g. {sorted(map(abs, self.long_distractors))}")
        return self

    @property
    def total(self) -> int:
        """Prompts per collection: ``n`` short + ``long_n`` long."""
        return self.n + self.long_n


def gates_tokens(load_format: str, gated: bool) -> bool:
    """Whether a run collects the scorings and gates the correctness cells (:attr:`ParitySpec.gated`). Never on
    dummy weights: vLLM seeds every tensor alike (uniform ±1e-3, ``weight_utils.py:1588``), so attention is nearly
    uniform and a DSA defect hardly moves the tokens (``results/defects/README.md``)."""
    return gated and load_format != "dummy"


class Scenario(_Frozen):
    """A whole run: model, serve options, the two arms, workload, MTP, accuracy, parity and gate policy."""

    name: str
    description: str = ""
    platform: Literal["any", "cuda"] = "any"   # "cuda": needs NVIDIA GPUs; "any": runs on whatever vLLM build is here
    model: ModelSpec
    serve: ServeSpec = ServeSpec()
    arms: dict[str, ArmSpec] = Field(
        default_factory=lambda: {"baseline": ArmSpec(route="baseline"), "candidate": ArmSpec(route="candidate")}
    )
    workload: WorkloadSpec
    mtp: MtpSpec = MtpSpec()
    slo: SloSpec = SloSpec()
    accuracy: AccuracySpec = AccuracySpec()
    parity: ParitySpec = ParitySpec()
    gate: GatePolicy = GatePolicy()
    cluster: ClusterSpec = ClusterSpec()
    allow_identical_arms: bool = False   # A/A calibration: both arms the same path on purpose
    # The design of scenarios/design-study/cpu.toml this scenario's run design is (None: none of a study's): the plan
    # and the report compare it with the cheapest design the study of this machine found (harness.render.designs).
    design: str | None = None
    attribution: AttributionSpec | None = None   # factorial attribution (harness.run.factors; `dsa-bench attribute`)

    @model_validator(mode="after")
    def _attribution_one_server_at_a_time(self) -> "Scenario":
        if self.attribution is None:
            return self
        if self.serve.concurrent_servers or self.serve.duet or self.cluster.swap_nodes:
            raise ValueError("an attribution runs one arm's server at a time per block: set serve.concurrent_servers "
                             "= false, serve.duet = false and cluster.swap_nodes = false")
        return self

    @model_validator(mode="after")
    def _two_arms(self) -> "Scenario":
        if set(self.arms) != {"baseline", "candidate"}:
            raise ValueError("[arms] must declare exactly two arms, [arms.baseline] and [arms.candidate]")
        if not self.allow_identical_arms and self.arms["baseline"].route == self.arms["candidate"].route:
            raise ValueError("[arms.baseline] and [arms.candidate] pin the same route; set allow_identical_arms = true "
                             "for an A/A calibration run")
        return self

    @model_validator(mode="after")
    def _sequential_blocks(self) -> "Scenario":
        most = self.gate.max_sessions
        if most is None:
            return self
        if not self.fresh_session_per_block():
            raise ValueError(f"gate.max_sessions = {most} makes the run sequential over server sessions, which needs a "
                             "fresh server session per arm and block: serve.concurrent_servers = false, or "
                             "serve.restart_per_block = true (--restart-per-block)")
        if self.workload.repeats != most:
            raise ValueError(f"gate.max_sessions = {most} is the most session blocks the run may take: set "
                             f"workload.repeats = {most} too (--max-sessions sets both)")
        return self

    @model_validator(mode="after")
    def _duet_needs_disjoint_places(self) -> "Scenario":
        if not self.serve.duet:
            return self
        if not self.serve.concurrent_servers:
            raise ValueError("serve.duet loads both arms at once, which needs both servers up: set "
                             "serve.concurrent_servers = true")
        pinned = [[getattr(slot, field) for slot in self.cluster.slots().values()] for field in ("cpu_cores", "gpu_ids")]
        pinned = [sets for sets in pinned if sets != [None, None]]   # an unset side (None) means all of them
        if pinned and all(None not in sets and not set(sets[0]) & set(sets[1]) for sets in pinned):
            return self
        raise ValueError("serve.duet loads both arms at once, so each needs its own CPU cores or GPUs: set disjoint "
                         "cpu_cores or gpu_ids under [cluster.arms.baseline] and [cluster.arms.candidate] (e.g. "
                         "--place-baseline cores=0 --place-candidate cores=1)")

    @model_validator(mode="after")
    def _swap_needs_places(self) -> "Scenario":
        slots = self.cluster.slots()
        if self.cluster.swap_nodes and slots["baseline"] == slots["candidate"]:
            raise ValueError("cluster.swap_nodes is on but both arms have the same placement; give each arm its "
                             "own node or cores under [cluster.arms.baseline] / [cluster.arms.candidate]")
        return self

    @model_validator(mode="after")
    def _requests_fit(self) -> "Scenario":
        need = self.workload.longest_request()
        if need > self.model.max_model_len:
            raise ValueError(f"the longest level's input_len + output_len = {need} exceeds model.max_model_len "
                             f"{self.model.max_model_len}; shorten the requests or raise model.max_model_len")
        return self

    @model_validator(mode="after")
    def _prefill_fits(self) -> "Scenario":
        batched = self.serve.max_num_batched_tokens
        if not self.serve.chunked_prefill and batched is not None and self.model.max_model_len > batched:
            raise ValueError(
                f"chunked prefill is off and model.max_model_len {self.model.max_model_len} > "
                f"serve.max_num_batched_tokens {batched}: longer prompts would never be scheduled; "
                f"set serve.max_num_batched_tokens ≥ {self.model.max_model_len}"
            )
        return self

    def effective(self) -> "Scenario":
        """This scenario with the gate's primary metrics limited to what the run measures (no MTP → no acceptance
        length; no GSM8K → no accuracy), so a run with a feature off is not INVALID for lacking its data. Under
        ``model.load_format = "dummy"`` (random weights) GSM8K accuracy and MTP acceptance mean nothing: both are
        left out of the gate (not applicable; still measured and shown)."""
        dropped = []
        if self.mtp.num_speculative_tokens == 0 or self.model.load_format == "dummy":
            dropped.append("acceptance_length")
        if not self.accuracy.enabled or self.model.load_format == "dummy":
            dropped.append("gsm8k_accuracy")
        return self.model_copy(update={"gate": self.gate.without(*dropped)}) if dropped else self

    def fresh_session_per_block(self) -> bool:
        """Whether every session block starts a fresh server session per arm (the unit of replication): sequential
        servers, or concurrent ones with ``serve.restart_per_block``, ``serve.duet`` or ``cluster.swap_nodes`` (a
        swapped block moves both servers). False: concurrent servers keep one session per arm for the whole run."""
        serve = self.serve
        return not serve.concurrent_servers or serve.restart_per_block or serve.duet or self.cluster.swap_nodes

    def arm_names(self) -> list[str]:
        """Arm names in plan order: baseline first; an attribution's generated arms in design order."""
        return list(self.run_arms())

    def run_arms(self) -> dict[str, ArmSpec]:
        """The arms a run starts: ``[arms.baseline]`` and ``[arms.candidate]``, or with ``[attribution]`` the
        generated arms (:func:`harness.run.factors.generated_arms` on the baseline arm)."""
        if self.attribution is None:
            return {"baseline": self.arms["baseline"], "candidate": self.arms["candidate"]}
        return {name: arm for name, (_, arm) in generated_arms(self.attribution, self.arms["baseline"]).items()}


def scenario_from_dict(data: dict[str, Any], source: str = "<scenario>") -> Scenario:
    """Validate ``data`` into a :class:`Scenario`.

    Raises:
        ScenarioError: one line naming ``source``, the offending key and what to do.
    """
    try:
        return Scenario.model_validate(data)
    except ValidationError as error:
        raise ScenarioError(first_error(error, f"{source}: key '{{where}}': {{message}}")) from None


def find_scenario(name_or_path: str) -> Path:
    """Resolve ``cpu-tiny`` or ``scenarios/cpu-tiny.toml`` or any path to an existing TOML file.

    Raises:
        ScenarioError: no such file; lists the shipped scenarios.
    """
    candidate = Path(name_or_path)
    for path in (candidate, SCENARIOS_DIR / name_or_path, SCENARIOS_DIR / f"{name_or_path}.toml"):
        if path.is_file():
            return path
    shipped = ", ".join(sorted(p.stem for p in SCENARIOS_DIR.glob("*.toml")))
    raise ScenarioError(f"{name_or_path}: no such scenario file; use a path or one of: {shipped}")


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set each dotted key of ``overrides`` (``{"serve.tensor_parallel_size": 4}``) in the nested ``data``, creating
    missing tables; returns ``data`` (changed in place)."""
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return data


INCLUDE = "include"
"""The key of a scenario that builds on another (lm-eval task YAML's ``include``): a scenario name or a path relative
to the including file; the including file's tables merge into the base's key by key, its other values replace."""


def _merged(base: dict[str, Any], variant: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in variant.items():
        both_tables = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both_tables else value
    return out


def _read_toml(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The scenario file at ``path`` with its ``include`` chain merged in (:data:`INCLUDE`).

    Raises:
        ScenarioError: malformed TOML, a missing base, or an include cycle.
    """
    if path.resolve() in chain:
        raise ScenarioError(f"{path}: include cycle ({' → '.join(p.name for p in (*chain, path.resolve()))}); "
                            f"remove one include")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ScenarioError(f"{path}: malformed TOML ({error}); fix the syntax at that line") from None
    if INCLUDE not in data:
        return data
    name = data.pop(INCLUDE)
    beside = path.parent / str(name)
    base_path = beside if beside.is_file() else find_scenario(str(name))
    return _merged(_read_toml(base_path, (*chain, path.resolve())), data)


def load_scenario(name_or_path: str, overrides: dict[str, Any] | None = None) -> Scenario:
    """Read a scenario TOML file (with its ``include`` base, :data:`INCLUDE`), apply dotted-key ``overrides`` (e.g.
    ``{"serve.tensor_parallel_size": 4}``), validate.

    Raises:
        ScenarioError: missing file, malformed TOML, an include cycle, or invalid values (one line, naming file and
            key).
    """
    path = find_scenario(name_or_path)
    data = apply_overrides(_read_toml(path), overrides or {})
    source = str(path) + (" (with CLI overrides)" if overrides else "")
    return scenario_from_dict(data, source)


def resolve_path(value: str) -> Path:
    """A scenario-relative path (``models/glm-5.2``) → absolute, relative to ``scenarios/``; absolute paths pass."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else (SCENARIOS_DIR / path).resolve()
