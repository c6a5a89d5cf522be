#!/usr/bin/env bash
# Builds a separate virtual environment in which vLLM's v1 Scheduler and KVCacheManager import and
# run on a CPU-only machine, for the conformance tests (tests/conformance) and
# scripts/vllm_conformance.py. Needs only the package index: no GPU, no compiler, no model hub.
#
#   scripts/vllm_env.sh [DIR]        DIR defaults to $VLLM_VENV, else .vllm-venv in the repo
#
# What goes in, in this order (each step pinned, so the result is the same on every machine):
#   1. torch 2.13.0, the CPU build (first, so nothing later can pull a CUDA build);
#   2. vllm 0.33.0 with --no-deps (its declared dependencies include CUDA wheels and a GPU stack
#      that the scheduler never imports);
#   3. scripts/vllm-0.33-requirements.txt with --no-deps: the pure-Python packages that vLLM's
#      config and v1 core import, at versions checked together;
#   4. the test runner, then kvbench itself (--no-deps -e .).
# A DIR that was already built from the same pins is reused (a stamp file records them).
set -euo pipefail
usage="usage: scripts/vllm_env.sh [DIR]   (DIR: a new or empty folder, or one this script built; default \$VLLM_VENV, else .vllm-venv)"
case "${1:-}" in
  -h|--help) echo "$usage"; exit 0 ;;
  -*) echo "vllm_env: unknown option '$1'; $usage" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "vllm_env: one DIR at most, got $#; $usage" >&2; exit 2; }
given=${1:-${VLLM_VENV:-}}
case "$given" in  # a DIR given is the caller's, relative to where it was given
  ""|/*) ;;
  *) given="$PWD/$given" ;;
esac
cd "$(dirname "$0")/.."

VENV=${given:-.vllm-venv}
VLLM_VERSION=0.33.0
TORCH_VERSION=2.13.0
REQS=scripts/vllm-0.33-requirements.txt
STAMP="$VENV/.kvbench-vllm-env"
want="vllm==$VLLM_VERSION torch==$TORCH_VERSION $(grep -v '^#' "$REQS" | sha256sum | cut -c1-16)"

check() {  # the imports the conformance harness needs, on the CPU platform
  VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" - <<'EOF'
import vllm, torch
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.kv_cache_manager import KVCacheManager
import kvbench, kvbench.cli, orjson, pandas, scipy.stats  # kvbench's own imports, beside vLLM's
print(f"vllm {vllm.__version__}, torch {torch.__version__}, kvbench {kvbench.__version__}")
EOF
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  "$VENV/bin/pip" install -q --no-deps -e . && check && { echo "vllm_env: reused $VENV"; exit 0; }
  echo "vllm_env: $VENV is stale, rebuilding"
fi

log=$(mktemp /tmp/vllm-env.XXXXXX.log)
trap '[ -n "${keep_log:-}" ] || rm -f "$log"' EXIT  # kept where a failure names it; else gone, however it ends
pipi() {  # pip's log is shown only when it fails
  "$VENV/bin/pip" install --progress-bar off "$@" >>"$log" 2>&1 \
    || { tail -30 "$log"; keep_log=1; echo "vllm_env: FAILED: pip install $* (log: $log)" >&2; exit 1; }
}
t0=$SECONDS
# rebuilt only where it is this script's (its stamp, written as a build starts, so a build cut
# short is rebuilt too) or nothing yet: any other folder, another virtual environment included
# (kvbench's own .venv), is somebody's, never removed
if [ -e "$VENV" ] && [ ! -f "$STAMP" ] && [ -n "$(ls -A "$VENV" 2>/dev/null || echo x)" ]; then
  if [ -f "$VENV/pyvenv.cfg" ]; then
    echo "vllm_env: $VENV is a virtual environment this script did not build (no $(basename "$STAMP")); give a new or empty DIR" >&2
  else
    echo "vllm_env: $VENV exists and is not a virtual environment; give a new or empty DIR" >&2
  fi
  exit 2
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
echo "building" >"$STAMP"  # ours from here on: a rerun after a failure rebuilds it
echo "vllm_env: torch==$TORCH_VERSION (CPU)";  pipi "torch==$TORCH_VERSION"
echo "vllm_env: vllm==$VLLM_VERSION --no-deps"; pipi --no-deps "vllm==$VLLM_VERSION"
echo "vllm_env: $REQS --no-deps";             pipi --no-deps -r "$REQS"
echo "vllm_env: test runner, kvbench's table, statistics and JSON libraries"
pipi "pytest>=7.4" "hypothesis>=6.80" "pytest-benchmark>=4.0" "hydra-joblib-launcher>=1.2" "pandas>=2.0" "scipy>=1.10" \
  "orjson>=3.9"
echo "vllm_env: kvbench --no-deps -e .";       pipi --no-deps -e .
check
echo "$want" >"$STAMP"
rm -f "$log"
echo "vllm_env: built $VENV in $((SECONDS - t0))s"
