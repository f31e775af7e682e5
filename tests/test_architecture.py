"""The import directions of pyproject.toml's [tool.importlinter] contracts hold, and a forbidden import breaks them."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})


def test_the_contracts_hold():
    result = _lint(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module,line,contract", [
    ("dsa_route/routing.py", "import harness.rundir.schema", "dsa_route never imports the harness"),
    ("dsa_route/routing.py", "import torch", "the routing decision and its platform translation are pure"),
    ("dsa_route/serve_path.py", "import vllm", "the routing decision and its platform translation are pure"),
    ("dsa_route/dsa/rope.py", "import vllm", "the PyTorch DSA reference never imports vLLM"),
    ("harness/run/server.py", "import dsa_route.plugin", "the harness never imports the vLLM plugin"),
    ("harness/judge/stats.py", "import harness.run.server", "judging, rendering and the gate never import running"),
    ("harness/render/plots.py", "import harness.judge.verdict", "rendering reads judging only through the"),
    ("harness/run/plan.py", "import harness.run.machine", "the plan is pure"),
    ("harness/run/runner.py", "import harness.study.calibrate", "only the CLI and the comparison entry point import"),
    ("harness/study/design_table.py", "import harness.cli", "the study and the comparison entry point never import"),
    ("harness/compare.py", "import harness.cli", "the study and the comparison entry point never import"),
    ("harness/study/calibrate.py", "import harness.cli_flags", "the study and the comparison entry point take"),
    ("harness/judge/cells.py", "import harness.rundir.store", "judging is pure: it never reads run directories"),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, contract):
    for name in ("dsa_route", "harness"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / module
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}  # forbidden\n", encoding="utf-8")
    result = _lint(tmp_path)
    assert result.returncode != 0 and "broken" in result.stdout, result.stdout[-3000:]
    broken = result.stdout.split("Broken contracts", 1)[1]
    assert contract in broken and module.removesuffix(".py").replace("/", ".") in broken
