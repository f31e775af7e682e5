"""Scenario × machine × model location → the exact commands of a run. Pure: no files written, no processes.

Each arm's server flags and environment come from one place: ``dsa_route.routing.decide`` for the arm's route,
turned into vLLM flags by ``dsa_route.serve_path.serve_overrides`` for the platform. ``dsa-bench plan`` prints this.
Where the model is (and generating a tiny one on first use) is :func:`harness.run.models.locate`'s job; what machine
this is, :func:`harness.run.machine.detect`'s.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from dsa_route import routing, serve_path
from dsa_route.inject import DEFECTS, ENV_INJECT, NEEDS_DSA_CPU, Injection
from dsa_route.knobs import ENV_KNOBS, decision_refusals
from harness.rundir.schema import Level, LevelKey, Regime, level_regimes
from harness.run.placement import needs_multi_node
from harness.run.scenario import Scenario, resolve_path
from harness.run.workload_spec import RegimeSpec
from harness.rundir.levels import PREFIX_DATASET, TEXT_DATASETS, dataset_path

BENCH_PERCENTILES = "50,99"

# HF model_type of each architecture: the MTP draft's model_type, which selects the draft class (vLLM
# config/speculative.py: deepseek_v3 → DeepSeekMTPModel; deepseek_v32 / glm_moe_dsa → DeepseekV32MTPModel).
MODEL_TYPES = {"DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV32ForCausalLM": "deepseek_v32",
               "GlmMoeDsaForCausalLM": "glm_moe_dsa"}


class PlanError(ValueError):
    """The scenario cannot run on this machine; ``str(error)`` is the one-line message (exit code 2)."""


@dataclass(frozen=True)
class Machine:
    """The host: ``name`` is ``"cuda"`` when an NVIDIA GPU is visible, else ``"cpu"``."""

    name: str
    device: str
    cpu_count: int
    gpu_count: int
    has_triton: bool

    def to_dict(self) -> dict:
        """JSON-ready dict (manifest ``platform``)."""
        return asdict(self)


class ModelLocation(NamedTuple):
    """Where the served model and its tokenizer are: local paths or Hugging Face ids."""

    path: str
    tokenizer: str


@dataclass(frozen=True)
class ArmPlan:
    """One arm, fully resolved: route decision, what the platform lacks, server command and environment."""

    name: str
    route: str
    description: str
    decision: routing.RouteDecision
    unavailable: tuple[str, ...]
    intended: dict
    server_args: tuple[str, ...]          # everything after `vllm serve MODEL`, port excluded
    server_env: dict[str, str]            # only what dsa-bench sets on top of the inherited environment
    model_path: str
    served_model_name: str
    tokenizer: str
    refusals: tuple[str, ...] = ()        # why vLLM would refuse to start this arm's server (empty: it starts)
    vllm: str | None = None               # the arm's own vLLM build (a venv's bin/vllm or bin/python); None: this one

    def vllm_command(self) -> list[str]:
        """How to invoke the arm's ``vllm`` CLI: the declared executable, a declared ``python`` running vLLM's CLI
        module (``vllm.entrypoints.cli.main``, the ``vllm`` console script's target), or :func:`vllm_executable`."""
        if self.vllm is None:
            return [vllm_executable()]
        if Path(self.vllm).name.startswith("python"):
            return [self.vllm, "-m", "vllm.entrypoints.cli.main"]
        return [self.vllm]

    def server_argv(self, port: int | str, host: str = "127.0.0.1") -> list[str]:
        """``vllm serve`` argv for ``port`` on ``host`` (a Ray-placed server listens on its node's address)."""
        return [*self.vllm_command(), "serve", self.model_path, "--host", host, "--port", str(port),
                *self.server_args]


@dataclass(frozen=True)
class Plan:
    """The run: scenario, machine, arms (baseline first), levels and how servers are scheduled."""

    scenario: Scenario
    machine: Machine
    arms: tuple[ArmPlan, ...]
    notes: tuple[str, ...] = field(default=())
    scenario_file: str = ""   # the TOML the scenario came from (manifest ``scenario_file``)
    prompt_counts: tuple[tuple[Level, int], ...] = ()   # (level, prompts) a pilot set (harness.run.pilot)

    def num_prompts(self, level: Level) -> int:
        """Requests per measured round of ``level`` (warmups excluded): the pilot's count where one set it
        (:meth:`with_prompt_counts`), else ``workload.num_prompts``."""
        work = self.scenario.workload
        return work.whole_prefix_groups(level, dict(self.prompt_counts).get(level, work.num_prompts(level)))

    def with_prompt_counts(self, counts: dict[Level, int]) -> "Plan":
        """This plan with every round of each level sending ``counts[level]`` prompts (both arms)."""
        return replace(self, prompt_counts=tuple(sorted(counts.items())))

    def rounds(self) -> int:
        """Rounds per arm: ``workload.repeats × workload.rounds_per_session``."""
        return self.scenario.workload.repeats * self.scenario.workload.rounds_per_session

    def block_of(self, round_: int) -> int:
        """The session block (0, 1, …) round ``round_`` belongs to: ``rounds_per_session`` consecutive rounds each."""
        return round_ // self.scenario.workload.rounds_per_session

    def levels(self) -> list[LevelKey]:
        """(level, round) pairs in sweep order: every level of round 0 (:meth:`WorkloadSpec.levels`), then of
        round 1, …"""
        return [LevelKey(level, r) for r in range(self.rounds()) for level in self.scenario.workload.levels()]

    def regimes(self) -> list[Regime]:
        """The sweep's regimes (dataset, input and output length), each once, in sorted order."""
        return level_regimes(self.scenario.workload.levels())

    def label(self, level: Level) -> str:
        """How the terminal names ``level``: ``"c=4"``, with its regime (``"c=4 · 256→32 random"``) when the sweep
        has several."""
        return level.label(regime=len(self.regimes()) > 1)

    def bench_argv(self, arm: ArmPlan, key: LevelKey, base_url: str, result_dir: Path,
                   served_model_name: str | None = None) -> list[str]:
        """The ``vllm bench serve`` argv of one level's round (random dataset, the level's lengths,
        ``--ignore-eos``, greedy).

        ``served_model_name`` overrides the arm's (a server started by other tooling may serve another name)."""
        return self._bench(arm, base_url, result_dir, served_model_name, {
            "level": key.level, "seed": self.scenario.workload.seed + key.round,
            "num_prompts": self.num_prompts(key.level), "result_filename": key.raw_name(arm.name)})

    def pilot_argv(self, arm: ArmPlan, level: Level, base_url: str, result_dir: Path,
                   served_model_name: str | None = None) -> list[str]:
        """The ``vllm bench serve`` argv of the pilot of ``level`` (harness.run.pilot): the scenario's count
        ``workload.num_prompts``, the seed one past the last round's (its prompts are none of a measured level's, so
        a prefix cache it fills serves no measured request) and the result file :func:`pilot_raw_name`."""
        work = self.scenario.workload
        return self._bench(arm, base_url, result_dir, served_model_name, {
            "level": level, "seed": work.seed + self.rounds(), "num_prompts": work.num_prompts(level),
            "result_filename": pilot_raw_name(arm.name, level)})

    def bench_template(self, arm: ArmPlan, regime: Regime) -> list[str]:
        """:meth:`bench_argv` of ``regime``'s levels with the per-level values as formulas in ``<…>`` (``c``:
        concurrency, ``r``: round)."""
        work = self.scenario.workload
        least, per = work.prompt_rule(regime)
        return self._bench(arm, "http://127.0.0.1:<port>", Path("<run-dir>/raw"), None, {
            "level": regime.at(1), "concurrency": "<c>", "seed": f"<{work.seed}+r>",
            "num_prompts": (f"<max({least},{per}c)>" if not work.min_level_s else
                            f"<pilot: ≥ {work.min_level_s:g} s, ≥ max({least},{per}c)>"),
            "result_filename": f"{arm.name}-{regime}-c<c>-r<r>.json"})

    def _bench(self, arm: ArmPlan, base_url: str, result_dir: Path, served_model_name: str | None,
               level: dict) -> list[str]:
        return [
            "vllm", "bench", "serve", "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", arm.model_path, "--served-model-name", served_model_name or arm.served_model_name, "--tokenizer", arm.tokenizer,
            *_dataset_args(level["level"], self.scenario.workload.regime_spec(level["level"]), result_dir),
            "--ignore-eos", "--temperature", "0",
            "--seed", str(level["seed"]), "--num-prompts", str(level["num_prompts"]),
            "--max-concurrency", str(level.get("concurrency", level["level"].concurrency)), "--request-rate", "inf",
            "--num-warmups", str(self.scenario.workload.warmups),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", BENCH_PERCENTILES,
            *self.scenario.slo.goodput_args(),
            "--save-result", "--save-detailed", "--result-dir", str(result_dir),
            "--result-filename", level["result_filename"], "--disable-tqdm",
        ]


def _dataset_args(level: Level, spec: RegimeSpec | None, result_dir: Path) -> list[str]:
    """The dataset flags of a level: vLLM's random dataset at its lengths; a real-text dataset's prompts
    (:mod:`harness.run.text_prompts`, beside ``result_dir`` in the run directory) through ``--dataset-name custom``
    with the output length fixed and no chat template (the prompt is sent as the text it is); or vLLM's
    ``prefix_repetition`` with the regime's (``spec``'s) shared prefix and ``input_len − prefix_len`` tokens of each
    prompt's own (``vllm/benchmarks/datasets/datasets.py`` ``--prefix-repetition-*``)."""
    if level.dataset in TEXT_DATASETS:
        return ["--dataset-name", "custom", "--dataset-path", str(dataset_path(result_dir.parent, level.regime)),
                "--custom-output-len", str(level.output_len), "--skip-chat-template"]
    if level.dataset == PREFIX_DATASET:
        return ["--dataset-name", PREFIX_DATASET, "--prefix-repetition-prefix-len", str(spec.prefix_len),
                "--prefix-repetition-suffix-len", str(level.input_len - spec.prefix_len),
                "--prefix-repetition-num-prefixes", str(spec.num_prefixes),
                "--prefix-repetition-output-len", str(level.output_len)]
    return ["--dataset-name", level.dataset, "--random-input-len", str(level.input_len),
            "--random-output-len", str(level.output_len)]


def pilot_raw_name(arm: str, level: Level) -> str:
    """The ``raw/`` file name of the pilot of ``level`` on ``arm`` (never a measured level's name)."""
    return f"pilot-{arm}-{level}.json"


def vllm_executable() -> str:
    """``$DSA_BENCH_VLLM`` when set (tests point it at a fake server), else the ``vllm`` CLI of this Python
    environment (``.venv/bin/vllm``), else the one on PATH, else ``"vllm"``."""
    if os.environ.get("DSA_BENCH_VLLM"):
        return os.environ["DSA_BENCH_VLLM"]
    sibling = Path(sys.executable).parent / "vllm"
    if sibling.exists():
        return str(sibling)
    return shutil.which("vllm") or "vllm"


def check_machine(scenario: Scenario, machine: Machine) -> None:
    """Refuse what this machine cannot run before anything starts.

    Raises:
        PlanError: a CUDA-only setting (tensor parallelism > 1, a quantization, a CUDA scenario) on a machine without
            CUDA, or more GPUs asked for than visible.
    """
    serve = scenario.serve
    if machine.name != "cuda":
        if scenario.platform == "cuda":
            raise PlanError(f"scenario '{scenario.name}' requires a CUDA machine; on this CPU machine use "
                            f"--scenario cpu-tiny-dsa (the default) or cpu-tiny")
        needs = []
        if serve.tensor_parallel_size > 1:
            needs.append(f"--tp {serve.tensor_parallel_size}")
        if serve.quantization != "none":
            needs.append(f"--quant {serve.quantization}")
        if needs:
            raise PlanError(f"{' and '.join(needs)} requires a CUDA machine with {serve.tensor_parallel_size} "
                            f"GPU(s); this machine has none — drop the flag or run on a GPU node")
        if serve.kv_cache_dtype not in ("auto", "bfloat16"):
            raise PlanError(f"--kv-cache-dtype {serve.kv_cache_dtype} is not supported on CPU (vLLM's CPU MLA backend "
                            f"and dsa_route's CPU DSA caches take only non-quantized caches); use auto on CPU or run "
                            f"on a GPU node")
        _check_cores(scenario)
    elif serve.tensor_parallel_size > machine.gpu_count and not multi_node(scenario):
        raise PlanError(f"--tp {serve.tensor_parallel_size} needs {serve.tensor_parallel_size} GPUs; "
                        f"this machine has {machine.gpu_count}")


def _check_cores(scenario: Scenario) -> None:
    """Refuse local placements on CPU ids this process may not use (``os.sched_getaffinity``): vLLM's engine would
    fail to bind its OpenMP threads there."""
    if scenario.cluster.backend != "local" or not hasattr(os, "sched_getaffinity"):
        return
    usable = os.sched_getaffinity(0)
    for arm, slot in scenario.cluster.slots().items():
        missing = sorted(set(slot.cpu_cores or ()) - usable)
        if missing:
            raise PlanError(f"{arm} is placed on CPU core(s) {missing}, which this machine does not offer (usable: "
                            f"{sorted(usable)}); place it with --place-{arm} cores=N, or use vLLM's own binding with "
                            f"--place-baseline \"\" --place-candidate \"\" --no-swap-nodes")


def multi_node(scenario: Scenario) -> bool:
    """Whether each arm is served across Ray nodes: backend ``ray`` and TP × PP above ``cluster.gpus_per_node``."""
    serve, cluster = scenario.serve, scenario.cluster
    return cluster.backend == "ray" and needs_multi_node(serve.tensor_parallel_size, serve.pipeline_parallel_size,
                                                         cluster.gpus_per_node)


def executor_backend(scenario: Scenario) -> str:
    """The executor vLLM runs each arm's workers with: ``ray`` across nodes, else vLLM's own choice on one host
    (``mp`` for a world above 1, ``uni`` for one rank; vllm/config/parallel.py)."""
    if multi_node(scenario):
        return "ray"
    return "mp" if scenario.serve.tensor_parallel_size * scenario.serve.pipeline_parallel_size > 1 else "uni"


def planning_machine(scenario: Scenario, host: Machine) -> Machine:
    """The machine a plan is made for: the host, or — when the scenario needs CUDA and the host has none — a
    hypothetical CUDA machine with the scenario's GPU count (so ``dsa-bench plan`` works for any scenario anywhere)."""
    if scenario.platform != "cuda" or host.name == "cuda":
        return host
    return Machine(name="cuda", device=f"planned; this host has no CUDA: {host.device}", cpu_count=host.cpu_count,
                   gpu_count=scenario.serve.tensor_parallel_size, has_triton=True)


def _common_server_args(scenario: Scenario, served_name: str, tokenizer: str) -> list[str]:
    model, serve = scenario.model, scenario.serve
    args = ["--served-model-name", served_name, "--tokenizer", tokenizer, "--seed", "0",
            "--dtype", model.dtype, "--max-model-len", str(model.max_model_len),
            "--load-format", model.load_format, "--tensor-parallel-size", str(serve.tensor_parallel_size),
            "--kv-cache-dtype", serve.kv_cache_dtype]
    if serve.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(serve.max_num_batched_tokens)]
    if model.hf_config_path is not None:
        args += ["--hf-config-path", str(resolve_path(model.hf_config_path))]
    if serve.vllm_quantization is not None:
        args += ["--quantization", serve.vllm_quantization]
    if serve.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(serve.pipeline_parallel_size)]
    if multi_node(scenario):
        args += ["--distributed-executor-backend", "ray"]
    return args


# (architecture, machine, env, MTP draft model_type) → the installed vLLM's own choice for a ``route="auto"`` arm, or
# None (``harness.run.installed_vllm.auto_choice``; passed in so the plan itself never imports vLLM).
AskVllm = Callable[[str, Machine, dict, "str | None"], "dict | None"]


def _injection_refusals(injection: Injection | None, decision: routing.RouteDecision, platform: str,
                        num_speculative_tokens: int) -> list[str]:
    """Why an arm's injection could not be applied: every kind lives in dsa_route's CPU DSA classes, and a defect
    that acts on MTP drafts (``DefectSpec.min_spec_tokens``) needs that many speculative tokens."""
    if injection is None or injection.kind not in NEEDS_DSA_CPU:
        return []
    refusals = []
    cpu_classes = set(routing.CPU_IMPLEMENTATION.values())
    if platform != "cpu" or not any(impl in cpu_classes for impl in decision.implementation.values()):
        refusals.append(f"inject = {injection.spec!r} is applied by dsa_route's CPU DSA classes (dsa_route.vllm_cpu), "
                        f"which do not serve this arm on {platform}; drop the injection or run a DSA model on cpu")
    defect = DEFECTS.get(injection.kind)
    if defect is not None and num_speculative_tokens < defect.min_spec_tokens:
        refusals.append(f"inject = {injection.spec!r} acts on MTP draft position {defect.min_spec_tokens - 1} and "
                        f"later, which {num_speculative_tokens} speculative token(s) never reach; pass "
                        f"--mtp {defect.min_spec_tokens} (mtp.num_speculative_tokens)")
    return refusals


def same_commands(arms: Sequence[ArmPlan]) -> list[tuple[str, str]]:
    """Pairs of arms (names, plan order) that would run the same thing: server command, environment (the knobs'
    carrier ``DSA_ROUTE_KNOBS`` aside), vLLM build and the classes the plugin registers all equal — e.g. two
    attribution arms that differ only in the implementation knob on CPU, where dsa_route serves both values."""
    def key(arm: ArmPlan):
        env = {k: v for k, v in arm.server_env.items() if k != ENV_KNOBS}
        return arm.server_args, env, arm.vllm, dict(arm.decision.implementation)

    return [(a.name, b.name) for i, a in enumerate(arms) for b in arms[i + 1:] if key(a) == key(b)]


def _session_notes(scenario: Scenario) -> list[str]:
    """The run notes on how concurrent servers are scheduled: fresh sessions per block, or a duet."""
    serve, cluster = scenario.serve, scenario.cluster
    if not serve.concurrent_servers or not scenario.fresh_session_per_block():
        return []
    fresh = ("Concurrent servers with a fresh pair of server sessions per session block: each block is one "
             "session per arm (the unit of replication), both servers up together, arms alternating per level.")
    if not serve.duet:
        return [fresh]
    where = "; ".join(f"{name} on {slot.describe()}" for name, slot in cluster.slots().items())
    swapped = (" (exchanged every other block, so core/GPU differences cancel)" if cluster.swap_nodes else
               " — not swapped: a core/GPU difference stays tied to one arm (add --swap-nodes)")
    return [f"duet: both arms loaded at once on disjoint cores/GPUs — {where}{swapped}; each level is sent to both "
            "arms at the same time, so shared host noise hits both alike, but neither arm has the host to itself. "
            "Each session block is a fresh pair of server sessions (one per arm, the unit of replication)."]


def build_plan(scenario: Scenario, machine: Machine, model: ModelLocation, ask_vllm: AskVllm | None = None) -> Plan:
    """Derive both arms for ``machine`` from the routing decision (call :func:`check_machine` first to run it);
    ``model`` from :func:`harness.run.models.locate`. ``ask_vllm``: for ``route="auto"`` arms, what the installed vLLM
    itself chooses (None: the routing module's vLLM 0.32 snapshot). Each arm's ``refusals`` say why vLLM would refuse
    to start it (``dsa-bench plan`` warns, ``compare`` refuses).

    Raises:
        PlanError: both arms would be identical on this platform.
    """
    model_path, tokenizer = model
    served_name = Path(scenario.model.id.split(":", 1)[-1]).name
    common = _common_server_args(scenario, served_name, tokenizer)
    mtp_tokens = scenario.mtp.num_speculative_tokens or None
    draft_type = MODEL_TYPES[scenario.model.architecture] if mtp_tokens else None
    arms = []
    for name, spec in scenario.run_arms().items():
        given_env = {**scenario.serve.env, **spec.env}
        choice = (ask_vllm(scenario.model.architecture, machine, given_env, draft_type)
                  if spec.route == "auto" and ask_vllm is not None else None)
        decision = routing.decide(
            [scenario.model.architecture], machine.name, env=given_env, speculative_model_type=draft_type,
            kv_cache_dtype=scenario.serve.kv_cache_dtype, route=spec.route, has_triton=machine.has_triton,
            vllm_choice=choice, knobs=spec.knobs,
        )
        route_args, route_env, unavailable = serve_path.serve_overrides(
            decision, machine.name, has_triton=machine.has_triton, num_speculative_tokens=mtp_tokens)
        env = {**scenario.serve.env, **route_env, **spec.env}
        injection = spec.injection()
        if injection is not None:
            env[ENV_INJECT] = injection.spec
        refusals = serve_path.startup_refusals(env, machine.name, machine.has_triton) + _injection_refusals(
            injection, decision, machine.name, mtp_tokens or 0) + decision_refusals(decision, spec.knobs, machine.name,
                                                                                    machine.has_triton)
        arms.append(ArmPlan(
            name=name, route=spec.route, description=spec.description, decision=decision,
            unavailable=tuple(unavailable),
            intended={**serve_path.expected_observation(decision, machine.name, has_triton=machine.has_triton),
                      "injection": None if injection is None else injection.spec},
            server_args=tuple(common + list(route_args) + list(scenario.serve.extra_args) + list(spec.extra_args)),
            server_env=env, model_path=model_path, served_model_name=served_name, tokenizer=tokenizer,
            refusals=tuple(refusals), vllm=spec.vllm,
        ))
    refused = [f"arm {arm.name}: {why}" for arm in arms for why in arm.refusals]
    if refused and len(arms) > 2:   # an attribution's combination vLLM refuses: no design to plan (exit 2)
        raise PlanError(refused[0])
    same = same_commands(arms)
    identical = len(arms) == 2 and bool(same)
    if identical and not scenario.allow_identical_arms:
        raise PlanError(f"on {machine.name} both arms resolve to the same server command and environment; "
                        f"nothing would be compared — add arm-specific extra_args or run on another platform")
    if same and len(arms) > 2:
        raise PlanError(f"on {machine.name} arms {same[0][0]} and {same[0][1]} resolve to the same server command "
                        f"and environment: a factor that changes nothing here cannot be attributed — drop it or "
                        f"run on a platform that has its knob")
    notes = []
    if identical:
        notes.append("A/A calibration run: both arms use the same server command and environment on purpose "
                     "(allow_identical_arms); any difference is noise.")
    if any(arm.unavailable for arm in arms):
        notes.append(f"On this {machine.name} build some knobs of the routing change do not exist "
                     f"({'; '.join(sorted({u for arm in arms for u in arm.unavailable}))}). The arms therefore differ "
                     f"only in what the platform allows: "
                     + "; ".join(f"{arm.name} = {arm.intended.get('compilation_mode')}" for arm in arms) + ".")
    if scenario.model.load_format == "dummy":
        notes.append("Dummy weights (model.load_format = \"dummy\"): GSM8K accuracy and MTP acceptance are not "
                     "applicable — random weights answer nothing and drafts are not accepted for a reason — so the "
                     "gate never uses them; they are still measured and shown. Run accuracy on real weights "
                     "(load_format = \"auto\" and the hub id).")
    notes += _session_notes(scenario)
    cpu_classes = set(routing.CPU_IMPLEMENTATION.values())
    per_arm = [{impl for arch, impl in arm.decision.implementation.items()
                if impl in cpu_classes and arch in arm.decision.architectures} for arm in arms]
    served_by_dsa_route = sorted(set.union(*per_arm)) if all(per_arm) else []
    if served_by_dsa_route:
        notes.append("Both arms serve the DSA model with dsa_route's CPU implementation "
                     f"({', '.join(served_by_dsa_route)}): vLLM's CPU build has no sparse-attention backend, so the PR's class choice (deepseek_v2 vs "
                     "deepseek_v32) cannot be compared here. Under VLLM_COMPILE vLLM compiles that class around opaque "
                     "attention and MoE ops; under NONE it runs eagerly.")
    return Plan(scenario=scenario, machine=machine, arms=tuple(arms), notes=tuple(notes))
