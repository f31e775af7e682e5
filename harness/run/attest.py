"""Path attestation: what a vLLM server says about the path it took, compared with the path the arm intended.

Pure functions over text and dicts (no processes, no files):

- :func:`observe_from_log` — a server log (stdout+stderr of ``vllm serve``) → the observed path.
- :func:`compare_paths` — intended vs observed → human-readable mismatches.
- :func:`attest` — both, in the shape ``manifest.json`` stores under ``arms.<arm>.attestation``.

The intended path is ``dsa_route.serve_path.expected_observation(decision, platform, has_triton=...)``: vLLM's own names
for what the server should report on that platform (e.g. on CPU ``VLLM_COMPILE`` is expected as
``DYNAMO_TRACE_ONCE``).

Log lines read (vLLM 0.32; file:line as printed in the log prefix):

- ``dsa_route: key=value ...`` — :mod:`dsa_route.plugin`, one line per server process (API server, engine core,
  worker). Values are plain words or compact JSON; ``inject=<spec>`` names a calibration injection it applies
  (:mod:`dsa_route.inject`), which must equal the arm's declared one (:func:`injection_mismatches`).
- ``dsa_route.vllm_cpu: applied inject=<spec> model=<class> ...`` — ``dsa_route.vllm_cpu.model.apply_injection``,
  once per model built (target and MTP draft): the model class really took the injection.
- ``[core.py] Initializing a V1 LLM engine (vX) with config: ... compilation_config={'mode':
  <CompilationMode.X: n>, ... 'backend': 'inductor', ... 'cudagraph_mode': <CUDAGraphMode.Y: n>, ...}`` — the
  engine core's final config, after the platform rewrote it (vllm/platforms/cpu.py turns VLLM_COMPILE into
  DYNAMO_TRACE_ONCE), so it is the authority for compilation and CUDA-graph mode.
- ``[vllm.py] Model Runner V2 requires Triton; using the V1 model runner instead.`` /
  ``Model Runner V2 does not yet support ...; using the V1 model runner instead.`` → v1;
  ``[cpu_worker.py|gpu_worker.py|xpu_worker.py] Using V2 Model Runner`` → v2; a line logged from
  ``[gpu_model_runner.py`` or ``[cpu_model_runner.py`` (the V1 runners' files) → v1.
- ``[vllm.py] Auto-enabling VLLM_USE_BREAKABLE_CUDAGRAPH=1. Set VLLM_USE_BREAKABLE_CUDAGRAPH=0 to opt out.`` —
  vLLM switched breakable graphs on by itself (it only does so when the variable is unset).
- ``[decorators.py] [backbone] saved AOT compiled function`` / ``loaded AOT compiled function`` / ``Compiling a
  graph`` / ``torch.compile took`` / ``Dynamo bytecode transform time`` — evidence that torch.compile ran. Not
  ``[cpu_model_runner.py] Warming up model for the compilation...``: the CPU runner prints it whenever the mode is not
  NONE, also for a model class vLLM does not compile (no ``support_torch_compile``).
- ``[model.py] Resolved architecture: X``, ``[api_utils.py] non-default args: {...}``, ``Using X backend.``,
  ``[core.py] init engine (profile, create kv cache, warmup model) took N s``.

CUDA-only lines (vLLM 0.32; tests/fixtures/logs/cuda_*.log are built from them by tests/fixtures/make_cuda_logs.py):

- ``[cuda.py:506] Using X attention backend out of potential backends: ['X', ...].`` (vllm/platforms/cuda.py
  ``get_attn_backend_cls``) — e.g. FLASHMLA_SPARSE / FLASHINFER_MLA_SPARSE for DSA; joins ``attention_backends``.
- ``[breakable_cudagraph.py:294] Breakable CUDA graph enabled`` (vllm/compilation/breakable_cudagraph.py
  ``BreakableCUDAGraphWrapper.__init__``) — vLLM's breakable wrapper was built: breakable graphs on.
- ``[model_runner.py:1127] Graph capturing finished in N secs, took X GiB`` — logged by Model Runner V2
  (vllm/v1/worker/gpu/model_runner.py ``capture_model``) → v2; the same text from ``[gpu_model_runner.py:6581]``
  (the V1 runner) → v1. Also the capture time and memory.
- ``'cudagraph_capture_sizes': [...]`` inside the engine core's config line — the batch sizes captured.
- ``[gpu_worker.py:518] Using V2 Model Runner`` and ``[vllm.py:818] Auto-enabling VLLM_USE_BREAKABLE_CUDAGRAPH=1``
  (above) appear on CUDA too.

Not used as evidence: ``Inductor compilation was disabled by user settings`` — vLLM 0.32 prints it on CPU even for a
compiled server (the engine core re-validates a config whose mode the CPU platform already rewrote).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Mapping

# Fields compared between intended and observed; see dsa_route.serve_path.expected_observation.
COMPARED_FIELDS: tuple[str, ...] = ("route", "model_runner", "compilation_mode", "cudagraph_mode",
                                    "breakable_cudagraph")

_PREFIX = re.compile(r"^\((?P<proc>[\w-]+) pid=(?P<pid>\d+)\)\s+")
_SRC = re.compile(r"\[(?P<file>[\w.]+\.py):\d+\]")
_APPLIED_SPEC = re.compile(r"dsa_route\.vllm_cpu: applied inject=(?P<spec>\S+)")
_DSA_LINE = re.compile(r"dsa_route:\s*(?P<body>.*)$")
_KV = re.compile(r"(?P<key>[A-Za-z_]+)=(?P<value>\S+)")
_ENGINE = re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[^)]+)\) with config: (?P<config>.*)$")
_MODE = re.compile(r"compilation_config=\{'mode': <CompilationMode\.(?P<mode>\w+): \d+>")
_MODE_NONE = re.compile(r"compilation_config=\{'mode': None")
_BACKEND = re.compile(r"'backend': '(?P<backend>[^']*)'")
_GRAPHS = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(?P<graphs>\w+): [^>]*>")
_CONFIG_FIELD = r"(?:^|, ){name}=(?P<value>[^,]*)"
_SPEC = re.compile(r"(?:^|, )speculative_config=(?P<value>None|\w+\((?:[^()]|\([^()]*\))*\))")
_ENUM_REPR = re.compile(r"<(\w+)\.(\w+): [^<>]*>")

_V1_FALLBACK = re.compile(r"using the V1 model runner instead")
_V2_USED = re.compile(r"Using V2 Model Runner")
_V1_RUNNER_FILES = ("gpu_model_runner.py", "cpu_model_runner.py")
_BREAKABLE_AUTO = re.compile(r"Auto-enabling VLLM_USE_BREAKABLE_CUDAGRAPH=1")
_COMPILE_EVIDENCE = re.compile(
    r"saved AOT compiled function|Compiling a graph|torch\.compile took"
    r"|Dynamo bytecode transform time|loaded AOT compiled function")
_ARCH = re.compile(r"Resolved architecture: (?P<arch>\S+)")
_NON_DEFAULT = re.compile(r"non-default args: (?P<args>\{.*\})\s*$")
_ATTN = re.compile(r"Using (?P<backend>[\w]+) (?:attention backend out of potential backends|backend\.)")
_BREAKABLE_WRAPPER = re.compile(r"Breakable CUDA graph enabled")
_CAPTURE = re.compile(r"Graph capturing finished in (?P<s>[\d.]+) secs, took (?P<gib>-?[\d.]+) GiB")
_CAPTURE_SIZES = re.compile(r"'cudagraph_capture_sizes': \[(?P<sizes>[\d, ]*)\]")
_V2_RUNNER_FILES = ("model_runner.py",)  # vllm/v1/worker/gpu/model_runner.py (MRV2); MRV1 is gpu_model_runner.py
_INIT_TIME = re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+) s")
_ERROR = re.compile(r"(?:ERROR|CRITICAL) \d\d-\d\d ")
_VERSION_BANNER = re.compile(r"version (?P<version>\d+\.\d+\.\d+\S*)")


def _value(text: str) -> Any:
    """A ``dsa_route:`` value: JSON when it parses, else the word."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _word(value: Any) -> str | None:
    """A field's text as the plugin wrote it (``inject=50`` would decode as a number), None when absent."""
    return None if value is None else str(value)


def parse_dsa_route_line(line: str) -> dict[str, Any] | None:
    """The ``key=value`` fields of one ``dsa_route:`` line (JSON values decoded), or None if the line has none.

    ``breakable_cudagraph`` comes back as a bool. Text without ``=`` (e.g. ``route=off (vLLM defaults untouched)``)
    is ignored.
    """
    match = _DSA_LINE.search(line)
    if match is None:
        return None
    body, fields, pos = match.group("body"), {}, 0
    decoder = json.JSONDecoder()
    while (m := _KV.search(body, pos)) is not None:
        start = m.start("value")
        if body[start] in "[{":  # compact JSON; its strings may hold spaces
            try:
                fields[m.group("key")], pos = decoder.raw_decode(body, start)
                continue
            except ValueError:
                pass
        fields[m.group("key")] = _value(m.group("value"))
        pos = m.end()
    if "breakable_cudagraph" in fields:
        fields["breakable_cudagraph"] = fields["breakable_cudagraph"] in (1, True, "1", "true")
    return fields


def _non_default_args(text: str) -> dict[str, Any] | None:
    """``non-default args: {...}``, enum reprs (``<CompilationMode.NONE: 0>``) made ``"CompilationMode.NONE"``."""
    try:
        value = ast.literal_eval(_ENUM_REPR.sub(lambda m: repr(f"{m.group(1)}.{m.group(2)}"), text))
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, dict) else None


def observe_from_log(text: str) -> dict[str, Any]:
    """Extract the observed execution path from a vLLM server log.

    Args:
        text: the server's combined stdout+stderr.

    Returns:
        A JSON-serialisable dict. Path fields (None when the log does not say):
        ``route`` (from the ``dsa_route:`` line), ``model_runner`` (``"v1" | "v2"``), ``compilation_mode`` (a
        CompilationMode name, e.g. ``"DYNAMO_TRACE_ONCE"``), ``cudagraph_mode`` (a CUDAGraphMode name),
        ``breakable_cudagraph`` (bool: vLLM's auto-enable line or its breakable wrapper's line, else the value the
        plugin put in the server's environment). Detail fields: ``dsa_route`` (fields of the first line), ``dsa_route_lines`` (count),
        ``dsa_route_processes``, ``dsa_route_consistent`` (every process logged the same decision),
        ``breakable_auto_enabled``, ``model_runner_evidence``, ``compilation_backend``, ``compiled`` (True when a
        torch.compile line appears, None otherwise), ``compile_evidence`` (up to 3 lines), ``vllm_version``,
        ``architecture``, ``kv_cache_dtype``, ``enforce_eager``, ``speculative_config``, ``attention_backends``,
        ``non_default_args``, ``engine_init_s``, ``errors`` (up to 5 ERROR lines), ``injection`` /
        ``injection_refused`` (the plugin's ``inject=`` / ``inject_refused=`` spec, None without one),
        ``injection_applied`` (``dsa_route.vllm_cpu: applied inject=<spec>``, the model class's line), and on CUDA
        ``breakable_wrapper`` (bool), ``cudagraph_capture_sizes`` (list of batch sizes), ``graph_capture_s`` and
        ``graph_capture_gib`` (first capture). Never raises on odd text.
    """
    obs: dict[str, Any] = {
        "route": None, "model_runner": None, "compilation_mode": None, "cudagraph_mode": None,
        "breakable_cudagraph": None,
        "dsa_route": None, "dsa_route_lines": 0, "dsa_route_processes": [], "dsa_route_consistent": None,
        "breakable_auto_enabled": False, "model_runner_evidence": None, "compilation_backend": None,
        "compiled": None, "compile_evidence": [], "vllm_version": None, "architecture": None,
        "kv_cache_dtype": None, "enforce_eager": None, "speculative_config": None, "attention_backends": [],
        "non_default_args": None, "engine_init_s": None, "errors": [],
        "breakable_wrapper": False, "cudagraph_capture_sizes": None, "graph_capture_s": None,
        "graph_capture_gib": None, "injection_applied": None,
    }
    decisions: list[str] = []
    v1_evidence = v2_evidence = None
    for raw in text.splitlines():
        line = raw.rstrip()
        prefix = _PREFIX.match(line)
        body = line[prefix.end():] if prefix else line

        if obs["injection_applied"] is None and (m := _APPLIED_SPEC.search(line)):
            obs["injection_applied"] = m.group("spec")
            continue
        if "dsa_route:" in line:
            fields = parse_dsa_route_line(line)
            if fields is not None:
                obs["dsa_route_lines"] += 1
                if obs["dsa_route"] is None:
                    obs["dsa_route"] = fields
                obs["dsa_route_processes"].append(str(fields.get("process", prefix.group("proc") if prefix else "?")))
                # The decision, not ``env``: a child process inherits what the API server's plugin set (e.g.
                # VLLM_MLA_DISABLE for DSA on CPU) and logs only what it set itself.
                decisions.append(" ".join(f"{k}={fields.get(k)}" for k in (
                    "route", "platform", "arch", "model_runner", "breakable_cudagraph", "compilation_mode", "impl")))
            continue

        engine = _ENGINE.search(body)
        if engine and obs["compilation_mode"] is None:
            obs["vllm_version"] = engine.group("version")
            config = engine.group("config")
            if (m := _MODE.search(config)) is not None:
                obs["compilation_mode"] = m.group("mode")
            elif _MODE_NONE.search(config):
                obs["compilation_mode"] = None
            if (m := _BACKEND.search(config)) is not None:
                obs["compilation_backend"] = m.group("backend")
            if (m := _GRAPHS.search(config)) is not None:
                obs["cudagraph_mode"] = m.group("graphs")
            if (m := _CAPTURE_SIZES.search(config)) is not None:
                obs["cudagraph_capture_sizes"] = [int(x) for x in m.group("sizes").split(",") if x.strip()]
            if (m := _SPEC.search(config)) is not None:
                obs["speculative_config"] = None if m.group("value") == "None" else m.group("value")
            for name in ("kv_cache_dtype", "enforce_eager"):
                if (m := re.search(_CONFIG_FIELD.format(name=name), config)) is not None:
                    value = m.group("value")
                    obs[name] = {"True": True, "False": False, "None": None}.get(value, value)
            continue

        src = _SRC.search(body)
        if v2_evidence is None and (_V2_USED.search(body) or (src and src.group("file") in _V2_RUNNER_FILES)):
            v2_evidence = body
        elif v1_evidence is None and _V1_FALLBACK.search(body):
            v1_evidence = body
        elif v1_evidence is None and src and src.group("file") in _V1_RUNNER_FILES:
            v1_evidence = body
        if _BREAKABLE_WRAPPER.search(body):
            obs["breakable_wrapper"] = True
        if obs["graph_capture_s"] is None and (m := _CAPTURE.search(body)):
            obs["graph_capture_s"], obs["graph_capture_gib"] = float(m.group("s")), float(m.group("gib"))
        if _BREAKABLE_AUTO.search(body):
            obs["breakable_auto_enabled"] = True
        if _COMPILE_EVIDENCE.search(body):
            obs["compiled"] = True
            if len(obs["compile_evidence"]) < 3:
                obs["compile_evidence"].append(body)
        if obs["architecture"] is None and (m := _ARCH.search(body)):
            obs["architecture"] = m.group("arch")
        if obs["non_default_args"] is None and (m := _NON_DEFAULT.search(body)):
            obs["non_default_args"] = _non_default_args(m.group("args"))
        if (m := _ATTN.search(body)) and m.group("backend") not in obs["attention_backends"]:
            obs["attention_backends"].append(m.group("backend"))
        if obs["engine_init_s"] is None and (m := _INIT_TIME.search(body)):
            obs["engine_init_s"] = float(m.group("s"))
        if obs["vllm_version"] is None and "api_utils.py" in body and (m := _VERSION_BANNER.search(body)):
            obs["vllm_version"] = m.group("version")
        if _ERROR.match(body) and len(obs["errors"]) < 5:
            obs["errors"].append(body)

    if v2_evidence is not None:
        obs["model_runner"], obs["model_runner_evidence"] = "v2", v2_evidence
    elif v1_evidence is not None:
        obs["model_runner"], obs["model_runner_evidence"] = "v1", v1_evidence

    route_fields = obs["dsa_route"] or {}
    obs["injection"] = _word(route_fields.get("inject"))
    obs["injection_refused"] = _word(route_fields.get("inject_refused"))
    if route_fields:
        obs["route"] = route_fields.get("route")
        obs["dsa_route_consistent"] = len(set(decisions)) == 1
    env = route_fields.get("env") if isinstance(route_fields.get("env"), dict) else {}
    if obs["breakable_auto_enabled"] or obs["breakable_wrapper"]:
        obs["breakable_cudagraph"] = True
    elif "VLLM_USE_BREAKABLE_CUDAGRAPH" in env:
        obs["breakable_cudagraph"] = env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "1"
    return obs


def _normalise(value: Any) -> Any:
    if isinstance(value, str):
        return value.strip().upper() if value.strip().lower() not in ("v1", "v2") else value.strip().lower()
    return value


def compare_paths(intended: Mapping[str, Any], observed: Mapping[str, Any]) -> list[str]:
    """Mismatches between the intended and the observed path.

    Args:
        intended: e.g. ``dsa_route.serve_path.expected_observation(...)``; only :data:`COMPARED_FIELDS` are compared.
        observed: :func:`observe_from_log` output.

    Returns:
        One sentence per disagreeing field, ``"<field>: intended <value>, observed <value>"``; empty when they agree.
        A field the log does not show (observed None or absent) is "not observed", never a mismatch (see
        :func:`not_observed`). Mode names compare case-insensitively.
    """
    mismatches: list[str] = injection_mismatches(intended, observed)
    for name in COMPARED_FIELDS:
        if name not in intended or intended[name] is None:
            continue
        seen = observed.get(name)
        if seen is None:
            continue
        if _normalise(intended[name]) != _normalise(seen):
            mismatches.append(f"{name}: intended {intended[name]!r}, observed {seen!r}")
    return mismatches


def injection_mismatches(intended: Mapping[str, Any], observed: Mapping[str, Any]) -> list[str]:
    """A calibration injection must be seen exactly as declared: ``intended["injection"]`` (a
    :mod:`dsa_route.inject` spec or None) against ``observed["injection"]`` (the plugin's ``inject=`` field). Unlike the
    path fields, an injection the log does not show is a mismatch: a candidate that silently lacks its injection must
    not produce a calibration verdict; a declared one must also be ``injection_applied`` (the model class's own line).
    Nothing is compared when ``intended`` has no ``injection`` key (older plans)."""
    if "injection" not in intended:
        return []
    declared, seen = intended["injection"], observed.get("injection")
    if declared != seen:
        return [f"injection: declared {declared!r}, observed {seen!r}" + (
            f" (the plugin refused it: {observed['injection_refused']!r})" if observed.get("injection_refused") else "")]
    if declared is not None and observed.get("injection_applied") != declared:
        return [f"injection: declared {declared!r}, but no model class applied it "
                f"(applied {observed.get('injection_applied')!r})"]
    return []


def not_observed(intended: Mapping[str, Any], observed: Mapping[str, Any]) -> list[str]:
    """The intended fields the log did not show (names from :data:`COMPARED_FIELDS`)."""
    return [name for name in COMPARED_FIELDS
            if intended.get(name) is not None and observed.get(name) is None]


def attest(intended: Mapping[str, Any], observed: Mapping[str, Any]) -> dict[str, Any]:
    """``{"valid": bool, "mismatches": [str], "not_observed": [str]}`` for ``manifest.json``; valid when nothing
    disagrees (unobserved fields do not invalidate an arm; the report lists them)."""
    mismatches = compare_paths(intended, observed)
    return {"valid": not mismatches, "mismatches": mismatches, "not_observed": not_observed(intended, observed)}


def observe_remote(server) -> dict[str, Any]:
    """What a server started by other tooling exposes (``server``: a connected RemoteServer): its served models,
    ``/version`` and whether ``/metrics`` has spec-decode counters."""
    from harness.run.server import scrape_metrics, served_models, server_version

    metrics = scrape_metrics(server.base_url, server.headers)
    return {"served_models": served_models(server.base_url, server.headers),
            "server_version": server_version(server.base_url, server.headers),
            "spec_decode_metrics": any(k.startswith("vllm:spec_decode") for k in metrics)}


def remote_record(intended: dict[str, Any], observed: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``attestation`` of a server started by other tooling: never valid or invalid, only what could
    not be checked (:func:`not_observed`) and why."""
    return {"valid": None, "mismatches": [], "not_checked": not_observed(intended, observed),
            "note": "server started by other tooling: only /v1/models, /version and /metrics were read; the model "
                    "runner, compilation mode and CUDA-graph mode cannot be checked from there"}
