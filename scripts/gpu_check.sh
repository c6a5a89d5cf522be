#!/usr/bin/env bash
# GPU validation of kvbench's kernels and graph modes, sized for under 8 minutes on one H200.
#
#   scripts/gpu_check.sh            on a CUDA machine: install, GPU tests, kernel sweep, graph modes
#   scripts/gpu_check.sh --cpu      the same pipeline on CPU with tiny specs (Triton interpreter):
#                                   checks the script, not the hardware; no installs, no GPU tests
#
# Writes under $OUT (default results/gpu): tests.txt, kernel.csv (every kernel point),
# graphs.csv (every serve point), latency_vs_context.png and figures.txt, the numbers the
# issue asks for: triton_paged's bandwidth at 64 x 4k against the H200's measured ~4.3 TB/s,
# its paging overhead, and full / piecewise step time against eager at batch 1, 8 and 64; and
# the calibrated simulator against the real engine: profile.csv, validation.md / .csv (relative
# errors next to the measured run-to-run spread) and step_time.png.
# Every stage has a time limit; a stage that runs out leaves what it finished and says so.
set -uo pipefail

MODE=gpu
case "${1:-}" in
  "") ;;
  --cpu) MODE=cpu ;;
  -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu_check: unknown argument '$1'; usage: scripts/gpu_check.sh [--cpu] (OUT=DIR sets where results go)" >&2
     exit 2 ;;
esac
if [[ $# -gt 1 ]]; then
  echo "gpu_check: one argument at most (--cpu); got: $*" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
asked="${OUT:-results/gpu}"
if ! OUT="$(mkdir -p "$asked" 2>/dev/null && cd "$asked" && pwd)" || [[ ! -w "$OUT" ]]; then
  echo "gpu_check: cannot write results into OUT=$asked: give a folder that can be created and written" >&2
  exit 2
fi
failed=0  # stages that finished nothing: the exit code says so
PY="${PYTHON:-python}"
# --cpu installs nothing (the GPU mode installs kvbench into $PY first): without kvbench, every
# stage "finished nothing", then a traceback
if [[ $MODE == cpu ]] && ! "$PY" -c "import kvbench" 2>/dev/null; then
  echo "gpu_check: $PY cannot import kvbench: set PYTHON=.venv/bin/python (the environment kvbench is installed in)" >&2
  exit 2
fi
# this run's results only: a stage that finishes nothing must not leave an earlier run's files
# to be read as its own
for f in tests.txt kernel.csv graphs.csv latency_vs_context.png figures.txt profile.csv profile_fit.json \
         validation.csv validation.md step_time.png; do
  rm -f "$OUT/$f"
done
WORK="$(mktemp -d "${TMPDIR:-/tmp}/kvbench-gpu.XXXXXX")"
BENCH=("$PY" -m kvbench.cli)
started=$SECONDS
stage() { echo "== [$((SECONDS - started))s] $*"; }

if [[ $MODE == gpu ]]; then
  MODEL=llama-3-8b                     # 32 query / 8 KV heads, head_dim 128
  BATCHES=1,8,64,128
  CONTEXTS=(512 2k 4k 16k)
  DTYPES=fp16,bf16
  KERNEL_EXTRA=(scenario.warmup_ms=10 scenario.rep_ms=50)
  GRAPH_BATCHES=1,8,64
  GRAPH_EXTRA=(workload.input_len=32 workload.output_len=64 scenario.kv_cache_tokens=16384)
  LIMIT_TESTS=120 LIMIT_KERNEL=180 LIMIT_FLASHINFER=45 LIMIT_GRAPHS=90
  # a Llama-3-8B layer shape (random bf16 weights), 4 of its 32 layers so both sides run in minutes
  VALIDATE=(model=llama-3-8b model.num_layers=4 +backend=triton_paged workload.num_requests=300
            scenario.kv_cache_tokens=65536 scenario.serve.clock=wall scenario.profiling.clock=wall)
  LIMIT_VALIDATE=240
else
  export TRITON_INTERPRET=1            # Triton on CPU: correctness only, ~10 ms per program
  MODEL=tiny
  BATCHES=1,2
  CONTEXTS=(16)
  DTYPES=fp32
  KERNEL_EXTRA=(scenario.min_run_time_s=0.01)
  GRAPH_BATCHES=2
  # one warm-up step, not three: under the interpreter each costs seconds and checks nothing more
  GRAPH_EXTRA=(workload.input_len=4 workload.output_len=2 ++graph.capture_sizes=[1,2,4] scenario.warmup_steps=1)
  LIMIT_TESTS=0 LIMIT_KERNEL=300 LIMIT_FLASHINFER=0 LIMIT_GRAPHS=300
  VALIDATE=(model=tiny workload.num_requests=12 scenario.runs=1 ++scenario.profiling.repeats=1
            ++scenario.profiling.warmup=0 "++scenario.profiling.decode_batch=[1,8]" "++scenario.profiling.prefill_seqs=[1]"
            "++scenario.profiling.mixed_batch=[4]")
  LIMIT_VALIDATE=300
fi
specs() {  # decode specs: every batch at every context, comma-separated
  local out=() b c
  for b in ${BATCHES//,/ }; do for c in "${CONTEXTS[@]}"; do out+=("${b}d${c}"); done; done
  local IFS=,; echo "${out[*]}"
}

# ---- 1. install --------------------------------------------------------------------------
if [[ $MODE == gpu ]]; then
  stage "install (torch stays as installed)"
  "$PY" -c "import sys, torch; torch.cuda.is_available() or sys.exit('gpu_check: no CUDA device here; \
scripts/gpu_check.sh --cpu checks the pipeline on a CPU'); print(torch.__version__, torch.cuda.get_device_name())" || exit 2
  # pip keeps the installed torch (it satisfies torch>=2.4); offline, the editable install of
  # kvbench alone still works when its dependencies are already there.
  "$PY" -m pip install -q -e '.[test,flashinfer]' || "$PY" -m pip install -q --no-deps -e . || exit 1
  "$PY" -c "import hydra, pluggy, pytest, triton, matplotlib, orjson, kvbench" ||
    { echo "missing dependencies and no package index: bring a virtual environment that has them"; exit 1; }
fi
FLASHINFER=$("$PY" -c "import flashinfer" 2>/dev/null && [[ $MODE == gpu ]] && echo yes || echo no)

# ---- 2. backend and graph-mode tests on the GPU ------------------------------------------
if [[ $MODE == gpu ]]; then
  stage "tests: attention backends, flashinfer, graph modes"
  timeout "$LIMIT_TESTS" "$PY" -m pytest -q --no-header -p no:cacheprovider \
    tests/test_attention_backends.py tests/test_graphs.py tests/test_flashinfer.py >"$OUT/tests.txt" 2>&1
  echo "exit $?" >>"$OUT/tests.txt"
  tail -n 3 "$OUT/tests.txt"
else
  echo "GPU tests skipped in --cpu mode (the suite runs them on CPU)" >"$OUT/tests.txt"
fi

# ---- 3. kernel sweep -----------------------------------------------------------------------
sweep() {  # name, time limit, overrides...
  local name=$1 limit=$2; shift 2
  stage "sweep $name"
  timeout "$limit" "${BENCH[@]}" -m "$@" progress=false "hydra.sweep.dir=$WORK/$name" \
    >"$WORK/$name.log" 2>&1 || echo "sweep $name stopped early (exit $?): $WORK/$name.log"
  "$PY" -c "import sys; from kvbench.reporting.report import summarize; summarize(sys.argv[1])" "$WORK/$name" \
    >/dev/null 2>&1 || { echo "sweep $name: no points finished"; failed=$((failed + 1)); }
}
SPECS=$(specs)
# triton_paged first: if the stage runs out of time, the points that matter most are done.
sweep kernel "$LIMIT_KERNEL" scenario=kernel model=$MODEL +backend=triton_paged,eager \
  "batch=$SPECS" model.dtype=$DTYPES +allocator=paged allocator.block_size=16 "${KERNEL_EXTRA[@]}"
if [[ $FLASHINFER == yes ]]; then
  sweep flashinfer "$LIMIT_FLASHINFER" scenario=kernel model=$MODEL +backend=flashinfer \
    "batch=$SPECS" model.dtype=$DTYPES +allocator=paged allocator.block_size=16
fi

# ---- 4. graph modes on the tiny model -------------------------------------------------------
sweep graphs "$LIMIT_GRAPHS" scenario=serve model=tiny +backend=triton_paged \
  +graph=eager,full,piecewise "workload.num_requests=$GRAPH_BATCHES" engine.async_scheduling=false,true \
  workload=fixed "${GRAPH_EXTRA[@]}"

# ---- 5. the calibrated simulator against the real engine -----------------------------------
stage "profile + validate the calibrated simulator"
timeout "$LIMIT_VALIDATE" "${BENCH[@]}" +experiment=validate_simulator "${VALIDATE[@]}" progress=false \
  "hydra.run.dir=$WORK/validate" >"$WORK/validate.log" 2>&1 ||
  { echo "validate stopped early (exit $?): $WORK/validate.log"; failed=$((failed + 1)); }
for f in profile.csv profile_fit.json validation.csv validation.md step_time.png; do
  [[ -f "$WORK/validate/$f" ]] && cp "$WORK/validate/$f" "$OUT/"
done
[[ -f "$OUT/validation.md" ]] && cat "$OUT/validation.md"

# ---- 6. results ------------------------------------------------------------------------------
stage "results in $OUT"
"$PY" scripts/gpu_figures.py "$WORK" "$OUT" | tee "$OUT/figures.txt"
if ((failed)); then
  stage "done; $failed stage(s) finished nothing (their logs are named above)"
  exit 1
fi
stage "done"
