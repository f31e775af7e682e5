#!/usr/bin/env bash
# Issue #27 item 2: the compiled (baseline) arm's start cost on the CPU default, with vLLM's AOT compile cache (the
# default on torch >= 2.10, vllm/envs.py use_aot_compile) and without it (VLLM_USE_AOT_COMPILE=0), alternating.
# Usage: results/startup/measure_starts.sh [PAIRS=3] > results/startup/starts-$(date +%Y%m%d).txt
# Prints per start: ready_s (launch → /health 200), engine_init_s (vLLM's "init engine (profile, create kv cache,
# warmup model) took", v1/engine/core.py:402) and whether vLLM logged "Compiling model again due to a load failure"
# (compilation/decorators.py:333). Logs stay in $LOGS.
set -u
cd "$(dirname "$0")/../.."
PAIRS=${1:-3}; LOGS=${LOGS:-$(mktemp -d)}; PORT=${PORT:-8123}
# The baseline arm's server command and environment exactly as `dsa-bench compare` plans them (ArmPlan.server_argv,
# ArmPlan.server_env), one shell word per line after the served model name.
mapfile -t ARGV < <(.venv/bin/python -c '
import sys
from harness.compare import CompareRequest, build_plan
arm = next(a for a in build_plan(CompareRequest(), to_run=True)[0].arms if a.name == "baseline")
print(arm.served_model_name, *(f"{k}={v}" for k, v in arm.server_env.items()), *arm.server_argv(sys.argv[1]), sep="\n")' "$PORT")
SERVED=${ARGV[0]}; ARGV=("${ARGV[@]:1}")
start() {  # $1 label, rest: extra environment
  local label=$1; shift
  local t0; t0=$(date +%s.%N)
  env "$@" "${ARGV[@]}" > "$LOGS/$label.log" 2>&1 &
  local pid=$!
  until curl -sf "localhost:$PORT/health" >/dev/null; do
    sleep 0.5; kill -0 $pid 2>/dev/null || { echo "$label died (log: $LOGS/$label.log)"; return; }
  done
  local ready; ready=$(echo "$(date +%s.%N) - $t0" | bc)
  curl -sf "localhost:$PORT/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"$SERVED\",\"prompt\":\"12+7=\",\"max_tokens\":8,\"temperature\":0}" >/dev/null || echo "$label: first request failed"
  local init; init=$(grep -oE "init engine .* took [0-9.]+ s" "$LOGS/$label.log" | grep -oE "[0-9.]+ s$")
  local again=no; grep -q "Compiling model again due to a load failure" "$LOGS/$label.log" && again=yes
  printf '%s ready_s=%.1f engine_init_s=%s recompiled_after_load_failure=%s\n' "$label" "$ready" "${init% s}" "$again"
  kill -INT $pid; wait $pid 2>/dev/null
}
for i in $(seq "$PAIRS"); do
  start "pair$i-no-aot" VLLM_USE_AOT_COMPILE=0
  start "pair$i-aot-default" DSA_BENCH_UNUSED=1
done
