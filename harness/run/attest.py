"""Path attestation: what a vLLM server says about the path it took, compared with the path the arm intended.

Pure functions over text and typed records (no processes, no files):

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

from harness.rundir.observation import Observation, RemoteObservation
from harness.rundir.schema import Attestation

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


def observe_from_log(text: str) -> Observation:
    """Extract the observed execution path from a vLLM server log.

    Args:
        text: the server's combined stdout+stderr.

    Returns:
        An :class:`~harness.rundir.observation.Observation` (its docstring lists the fields). Path fields are None
        when the log does not say; ``breakable_cudagraph`` is vLLM's auto-enable line or its breakable wrapper's
        line, else the value the plugin put in the server's environment; ``compiled`` is True when a torch.compile
        line appears, None otherwise. Never raises on odd text.
    """
    obs: dict[str, Any] = {"dsa_route": None, "dsa_route_lines": 0, "dsa_route_processes": [],
                           "breakable_auto_enabled": False, "compilation_mode": None, "compile_evidence": [],
                           "vllm_version": None, "architecture": None, "attention_backends": [],
                           "non_default_args": None, "engine_init_s": None, "errors": [], "breakable_wrapper": False,
                           "graph_capture_s": None, "injection_applied": None}
    decisions: list[str] = []
    runner: dict[str, str] = {}   # "v1" / "v2" → the first line that shows it
    for raw in text.splitlines():
        line = raw.rstrip()
        prefix = _PREFIX.match(line)
        body = line[prefix.end():] if prefix else line
        if obs["injection_applied"] is None and (m := _APPLIED_SPEC.search(line)):
            obs["injection_applied"] = m.group("spec")
        elif "dsa_route:" in line:
            _plugin_line(obs, decisions, line, prefix)
        elif (engine := _ENGINE.search(body)) and obs["compilation_mode"] is None:
            obs.update(_engine_fields(engine.group("config")), vllm_version=engine.group("version"))
        else:
            _runner_evidence(runner, body)
            _evidence(obs, body)
    return _observation(obs, decisions, runner)


def _plugin_line(obs: dict[str, Any], decisions: list[str], line: str, prefix: re.Match | None) -> None:
    """A ``dsa_route:`` line: its fields (the first line's kept), its process and its decision."""
    fields = parse_dsa_route_line(line)
    if fields is None:
        return
    obs["dsa_route_lines"] += 1
    if obs["dsa_route"] is None:
        obs["dsa_route"] = fields
    obs["dsa_route_processes"].append(str(fields.get("process", prefix.group("proc") if prefix else "?")))
    # The decision, not ``env``: a child process inherits what the API server's plugin set (e.g. VLLM_MLA_DISABLE
    # for DSA on CPU) and logs only what it set itself.
    decisions.append(" ".join(f"{k}={fields.get(k)}" for k in (
        "route", "platform", "arch", "model_runner", "breakable_cudagraph", "compilation_mode", "impl")))


def _engine_fields(config: str) -> dict[str, Any]:
    """The engine core's final config line: compilation mode and backend, CUDA-graph mode and capture sizes,
    speculative config, KV-cache dtype and the eager flag (only those the line holds)."""
    found: dict[str, Any] = {}
    if (m := _MODE.search(config)) is not None:
        found["compilation_mode"] = m.group("mode")
    if (m := _BACKEND.search(config)) is not None:
        found["compilation_backend"] = m.group("backend")
    if (m := _GRAPHS.search(config)) is not None:
        found["cudagraph_mode"] = m.group("graphs")
    if (m := _CAPTURE_SIZES.search(config)) is not None:
        found["cudagraph_capture_sizes"] = [int(x) for x in m.group("sizes").split(",") if x.strip()]
    if (m := _SPEC.search(config)) is not None:
        found["speculative_config"] = None if m.group("value") == "None" else m.group("value")
    for name in ("kv_cache_dtype", "enforce_eager"):
        if (m := re.search(_CONFIG_FIELD.format(name=name), config)) is not None:
            value = m.group("value")
            found[name] = {"True": True, "False": False, "None": None}.get(value, value)
    return found


def _runner_evidence(runner: dict[str, str], body: str) -> None:
    """The first line that shows Model Runner V2 (its own line or file), or V1 (the fallback line or a V1 file)."""
    src = _SRC.search(body)
    if "v2" not in runner and (_V2_USED.search(body) or (src and src.group("file") in _V2_RUNNER_FILES)):
        runner["v2"] = body
    elif "v1" not in runner and (_V1_FALLBACK.search(body) or (src and src.group("file") in _V1_RUNNER_FILES)):
        runner["v1"] = body


def _evidence(obs: dict[str, Any], body: str) -> None:
    """Every other line: breakable graphs, graph capture, compile evidence, architecture, non-default args,
    attention backends, engine init time, the version banner and ERROR lines."""
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


def _observation(obs: dict[str, Any], decisions: list[str], runner: dict[str, str]) -> Observation:
    """The fields read line by line, with what follows from all of them: the model runner (V2 evidence wins), the
    plugin's route and injection, whether its processes agree, and breakable graphs."""
    model_runner = "v2" if "v2" in runner else "v1" if "v1" in runner else None
    route_fields = obs["dsa_route"] or {}
    env = route_fields.get("env") if isinstance(route_fields.get("env"), dict) else {}
    breakable = (True if obs["breakable_auto_enabled"] or obs["breakable_wrapper"] else
                 env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "1" if "VLLM_USE_BREAKABLE_CUDAGRAPH" in env else None)
    return Observation.model_validate({
        **obs, "model_runner": model_runner, "model_runner_evidence": runner.get(model_runner or ""),
        "route": _word(route_fields.get("route")) if route_fields else None,
        "dsa_route_consistent": len(set(decisions)) == 1 if route_fields else None,
        "breakable_cudagraph": breakable, "injection": _word(route_fields.get("inject")),
        "injection_refused": _word(route_fields.get("inject_refused"))})


def _normalise(value: Any) -> Any:
    if isinstance(value, str):
        return value.strip().upper() if value.strip().lower() not in ("v1", "v2") else value.strip().lower()
    return value


def compare_paths(intended: Mapping[str, Any], observed: Observation | RemoteObservation) -> list[str]:
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
        seen = _seen(observed, name)
        if seen is None:
            continue
        if _normalise(intended[name]) != _normalise(seen):
            mismatches.append(f"{name}: intended {intended[name]!r}, observed {seen!r}")
    return mismatches


def injection_mismatches(intended: Mapping[str, Any], observed: Observation | RemoteObservation) -> list[str]:
    """A calibration injection must be seen exactly as declared: ``intended["injection"]`` (a
    :mod:`dsa_route.inject` spec or None) against ``observed.injection`` (the plugin's ``inject=`` field). Unlike the
    path fields, an injection the log does not show is a mismatch: a candidate that silently lacks its injection must
    not produce a calibration verdict; a declared one must also be ``injection_applied`` (the model class's own line).
    Nothing is compared when ``intended`` has no ``injection`` key (older plans)."""
    if "injection" not in intended:
        return []
    declared, seen, refused = (intended["injection"], _seen(observed, "injection"),
                               _seen(observed, "injection_refused"))
    if declared != seen:
        return [f"injection: declared {declared!r}, observed {seen!r}" + (
            f" (the plugin refused it: {refused!r})" if refused else "")]
    applied = _seen(observed, "injection_applied")
    if declared is not None and applied != declared:
        return [f"injection: declared {declared!r}, but no model class applied it (applied {applied!r})"]
    return []


def _seen(observed: Observation | RemoteObservation, name: str) -> Any:
    """A path field of ``observed``; None where it does not say (a :class:`RemoteObservation` has none)."""
    return getattr(observed, name, None)


def not_observed(intended: Mapping[str, Any], observed: Observation | RemoteObservation) -> list[str]:
    """The intended fields the server did not show (names from :data:`COMPARED_FIELDS`)."""
    return [name for name in COMPARED_FIELDS
            if intended.get(name) is not None and _seen(observed, name) is None]


def attest(intended: Mapping[str, Any], observed: Observation) -> dict[str, Any]:
    """``{"valid": bool, "mismatches": [str], "not_observed": [str]}`` for ``manifest.json``; valid when nothing
    disagrees (unobserved fields do not invalidate an arm; the report lists them)."""
    mismatches = compare_paths(intended, observed)
    return {"valid": not mismatches, "mismatches": mismatches, "not_observed": not_observed(intended, observed)}


def observe_remote(server) -> RemoteObservation:
    """What a server started by other tooling exposes (``server``: a connected RemoteServer): its served models,
    ``/version`` and whether ``/metrics`` has spec-decode counters."""
    from harness.run.server import scrape_metrics, served_models, server_version

    metrics = scrape_metrics(server.base_url, server.headers)
    return RemoteObservation(served_models=tuple(served_models(server.base_url, server.headers)),
                             server_version=server_version(server.base_url, server.headers),
                             spec_decode_metrics=any(k.startswith("vllm:spec_decode") for k in metrics))


def remote_record(intended: Mapping[str, Any], observed: RemoteObservation) -> Attestation:
    """The manifest's ``attestation`` of a server started by other tooling: never valid or invalid, only what could
    not be checked (:func:`not_observed`) and why."""
    return Attestation(valid=None, not_checked=tuple(not_observed(intended, observed)),
                       note="server started by other tooling: only /v1/models, /version and /metrics were read; the "
                            "model runner, compilation mode and CUDA-graph mode cannot be checked from there")
