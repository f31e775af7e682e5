#!/usr/bin/env bash
# Record real vLLM server sessions of one path for the gate's session-level simulation (not CI: an hour or more).
#
#   scripts/record_sessions.sh OUT_DIR [UNTIL]     e.g. scripts/record_sessions.sh ~/recordings 15:00
#
# Runs `dsa-bench compare --scenario tests/fixtures/recorded/record-sessions.toml --out OUT_DIR` (an A/A run: fresh
# `vllm serve` per block of rounds, sequential servers), or, when OUT_DIR already holds a run of that scenario,
# `dsa-bench compare --resume` on the newest one. At UNTIL (UTC, anything `date -d` reads; default: no deadline) the
# run gets SIGTERM, which the harness handles like Ctrl-C: it stops its servers and keeps every finished level
# (SIGTERM to this script's `timeout` child does the same earlier).
# OUT_DIR/loadavg.log gets the host's /proc/loadavg every 5 s (UTC timestamp first), to join with the levels'
# finished_at and wall_s in manifest.json. DSA_BENCH names the dsa-bench executable (default: .venv/bin/dsa-bench).
set -euo pipefail
out=${1:?usage: scripts/record_sessions.sh OUT_DIR [UNTIL]}
until_utc=${2:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
bench=${DSA_BENCH:-$repo/.venv/bin/dsa-bench}
scenario=$repo/tests/fixtures/recorded/record-sessions.toml
mkdir -p "$out"

(while true; do echo "$(date -u +%FT%TZ) $(cat /proc/loadavg)"; sleep 5; done) >>"$out/loadavg.log" &
sampler=$!
trap 'kill "$sampler" 2>/dev/null || true' EXIT

# One compare, then --resume while time is left (a run whose arm died — e.g. a server that failed to start — ends
# early; the resume re-runs what is not done, in new server sessions).
while true; do
  previous=$(ls -d "$out"/*-record-sessions 2>/dev/null | tail -n 1 || true)
  if [[ -n "$previous" ]]; then
    args=(compare --scenario "$scenario" --resume "$previous")
  else
    args=(compare --scenario "$scenario" --out "$out")
  fi
  if [[ -n "$until_utc" ]]; then
    seconds=$(( $(date -u -d "$until_utc" +%s) - $(date -u +%s) ))
    (( seconds > 60 )) || break
    limit=(timeout --kill-after=180 "$seconds")
  else
    limit=()
  fi
  rc=0
  "${limit[@]}" "$bench" "${args[@]}" || rc=$?
  echo "record_sessions.sh: dsa-bench ended with $rc at $(date -u +%T)"
  (( rc == 0 || rc == 2 || rc == 130 )) && break   # done, bad input, or interrupted by the user
done
