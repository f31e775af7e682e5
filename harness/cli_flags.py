"""The scenario flags every running subcommand shares (``compare``, ``plan``, ``calibrate``) and the dotted scenario
overrides they make (:func:`harness.run.scenario.load_scenario`): flags only override the scenario file."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from harness.compare import CompareRequest, UsageError
from harness.run.placement import parse_place_flag
from harness.rundir.files import first_error

__all__ = ["UsageError", "add_scenario_flags", "overrides", "duration", "compare_request", "at_least"]


def at_least(minimum: int):
    """An argparse type: a whole number ≥ ``minimum``, so a bad count is refused under the flag the user typed, not
    the scenario key it overrides."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value
    return parse


_COUNT, _NONNEGATIVE = at_least(1), at_least(0)


def _levels(text: str) -> list[int]:
    try:
        return [_COUNT(part) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers, "
                                         f"e.g. 1,2,4") from None


def duration(text: str) -> float:
    """``"90s"``, ``"12m"``, ``"3h"`` (or plain seconds) → seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration, e.g. 90s, 12m or 3h") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a budget must be positive, e.g. 12m")
    return seconds


def add_scenario_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scenario and overrides (flags override the scenario file)")
    group.add_argument("--scenario", help="scenario name in scenarios/ or a TOML path "
                                          "(default: cpu-tiny-dsa without CUDA; glm-5.2-nvfp4-tp4 with CUDA)")
    group.add_argument("--model", help="model path or Hugging Face id (overrides model.id)")
    group.add_argument("--tp", type=_COUNT, help="tensor parallel size (serve.tensor_parallel_size)")
    group.add_argument("--quant", help="quantization: none, fp8, nvfp4, … (serve.quantization)")
    group.add_argument("--kv-cache-dtype", help="auto, fp8, fp8_ds_mla, … (serve.kv_cache_dtype)")
    group.add_argument("--concurrency", type=_levels, help="levels of the workload's own regime, e.g. 1,2,4 "
                       "(workload.concurrency; [[workload.regimes]] keep their own)")
    group.add_argument("--num-prompts", type=_COUNT, help="prompts per level (at least one per concurrent slot)")
    group.add_argument("--min-level-s", type=float, metavar="S",
                       help="at least S seconds of measured load per level: a pilot before the first measured level "
                            "sets each concurrency's prompt count, the same for both arms and every round "
                            "(workload.min_level_s; 0 = off)")
    group.add_argument("--input-len", type=_COUNT, help="random-dataset input tokens (workload.input_len)")
    group.add_argument("--output-len", type=_COUNT, help="output tokens per request (workload.output_len)")
    group.add_argument("--repeats", type=_COUNT,
                       help="session blocks per arm (workload.repeats; × rounds_per_session rounds), judged in the "
                            "fixed design (one look at the end; --max-sessions N for looks)")
    group.add_argument("--max-sessions", type=_COUNT, metavar="N",
                       help="sequential run: look after each block, stop at PASS/FAIL, at most N server sessions per "
                            "arm (gate.max_sessions and workload.repeats; needs a fresh session per block: "
                            "sequential servers or --restart-per-block)")
    group.add_argument("--restart-per-block", action=argparse.BooleanOptionalAction, default=None,
                       help="concurrent servers: a fresh pair of server sessions per block (serve.restart_per_block)")
    group.add_argument("--duet", action=argparse.BooleanOptionalAction, default=None,
                       help="concurrent servers on disjoint --place-* cores or GPUs, each level sent to both arms at "
                            "once (serve.duet)")
    group.add_argument("--gsm8k-fewshot", type=_NONNEGATIVE, metavar="N",
                       help="GSM8K few-shot examples (accuracy.num_fewshot)")
    group.add_argument("--gsm8k-limit", type=_COUNT, metavar="N", help="GSM8K questions per arm (accuracy.limit)")
    group.add_argument("--no-gsm8k", action="store_true", help="skip GSM8K (accuracy.enabled = false)")
    group.add_argument("--gsm8k-data", metavar="DIR", help="directory with GSM8K train.jsonl and test.jsonl")
    mtp = group.add_mutually_exclusive_group()
    group.add_argument("--inject-candidate", metavar="KIND",
                       help="calibration injection for the candidate only: topk-random, indexer-rope-flip or "
                            "step-delay:<ms> (arms.candidate.inject)")
    mtp.add_argument("--mtp", type=_NONNEGATIVE, metavar="K", help="MTP with K speculative tokens")
    mtp.add_argument("--no-mtp", action="store_true", help="turn MTP off")
    cluster = parser.add_argument_group("placement (the [cluster] table)")
    cluster.add_argument("--cluster-backend", choices=("local", "ray"), help="where servers run (cluster.backend)")
    cluster.add_argument("--ray-address", metavar="ADDR",
                         help="auto, host:port, ray://…, or local to start a head (cluster.address)")
    cluster.add_argument("--swap-nodes", action=argparse.BooleanOptionalAction, default=None,
                         help="exchange the arms' placements every other block (cluster.swap_nodes)")
    cluster.add_argument("--aa-check", action=argparse.BooleanOptionalAction, default=None,
                         help="first an A/A run of the baseline arm on both placements, unswapped (cluster.aa_check)")
    for arm in ("baseline", "candidate"):
        cluster.add_argument(f"--place-{arm}", metavar="SPEC",
                             help=f"{arm}'s placement: node=ID, label=KEY:VALUE, resource=NAME, cores=0-1, gpus=0,1 "
                                  f"separated by ';' (cluster.arms.{arm})")


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    mapping = {
        "model": "model.id", "tp": "serve.tensor_parallel_size", "quant": "serve.quantization",
        "kv_cache_dtype": "serve.kv_cache_dtype", "concurrency": "workload.concurrency",
        "input_len": "workload.input_len", "output_len": "workload.output_len", "repeats": "workload.repeats",
        "min_level_s": "workload.min_level_s",
        "mtp": "mtp.num_speculative_tokens", "gsm8k_fewshot": "accuracy.num_fewshot",
        "gsm8k_limit": "accuracy.limit", "inject_candidate": "arms.candidate.inject",
        "cluster_backend": "cluster.backend", "ray_address": "cluster.address", "swap_nodes": "cluster.swap_nodes",
        "aa_check": "cluster.aa_check", "restart_per_block": "serve.restart_per_block", "duet": "serve.duet",
    }
    overrides = {key: getattr(args, flag) for flag, key in mapping.items() if getattr(args, flag) is not None}
    if args.max_sessions is not None:
        overrides["gate.max_sessions"] = overrides["workload.repeats"] = args.max_sessions
    elif args.repeats is not None:   # N blocks in the fixed design; a scenario's own looks need its own block count
        overrides["gate.max_sessions"] = None
    if args.no_mtp:
        overrides["mtp.num_speculative_tokens"] = 0
    if args.no_gsm8k:
        overrides["accuracy.enabled"] = False
    for arm in ("baseline", "candidate"):
        if getattr(args, f"place_{arm}") is not None:
            try:
                overrides[f"cluster.arms.{arm}"] = parse_place_flag(getattr(args, f"place_{arm}"))
            except ValueError as error:
                raise UsageError(f"--place-{arm}: {error}") from None
    if args.num_prompts is not None:
        overrides["workload.min_prompts"] = args.num_prompts
        overrides["workload.prompts_per_concurrency"] = 1
    return overrides


def compare_request(args: argparse.Namespace, **fields: Any) -> CompareRequest:
    """The scenario flags, ``--out`` and ``--budget`` of ``args`` (``compare`` or ``calibrate``) as a request;
    ``fields``: the other :class:`harness.compare.CompareRequest` fields. Raises UsageError on an invalid field."""
    try:
        return CompareRequest(scenario=args.scenario, overrides=overrides(args), out=args.out, budget_s=args.budget,
                              gsm8k_data=args.gsm8k_data, **fields)
    except ValidationError as error:
        raise UsageError(first_error(error)) from None
