#!/usr/bin/env bash
# What sessions lent a GPU run there: our GPU tests, numba-cuda's own test
# suite under Numba's default memory manager and under numba_alloc, and every
# benchmark. Each step has its own time limit, and one invocation (one device
# call) stops itself within its --budget, inside the device tool's 10-minute
# limit. `plan` says what a session runs and what waits for later ones;
# benchmarks/GPU-SESSION.md says more.
#
#   bash benchmarks/gpu_session.sh plan            # the device calls, in order (runs nothing)
#   bash benchmarks/gpu_session.sh STEP [ARG...] [STEP [ARG...]]...   # one device call
#   bash benchmarks/gpu_session.sh all             # every step (a machine with no call limit)
#   bash benchmarks/gpu_session.sh --dry-run ...   # print the steps and their limits only
#
# Steps:
#   tests                   our GPU tests (test_gpu.py, test_gpu_defrag.py, test_gpu_device_heap.py,
#                           test_gpu_marks.py, test_gpu_reclaim.py),
#                           then the other gpu-marked tests of tests/, each part under its
#                           own limit (JUnit XML kept)
#   demo                    numba-alloc demo
#   bench                   benchmarks/bench_malloc.py
#   defrag                  benchmarks/bench_defrag.py
#   sweep                   benchmarks/bench_defrag.py --one-block-a-chunk 1024
#                           --chunks-per-block 1 2 4 8 16: the copy kernel's bandwidth for
#                           each way of cutting a launch (to choose kernels.CHUNKS_PER_BLOCK)
#   kernels [WORKLOAD...]   numba-alloc bench at full size (each run recorded as it ends)
#   heap                    numba-alloc bench --heap: the device heap's kernel-level suite
#                           (each case recorded as it ends)
#   reclaim                 benchmarks/bench_reclaim_gpu.py: Numba arrays at 1x, 1.5x and 3x
#                           the pool's limit with reclaim on, the pinned copy peak, reclaim's
#                           bandwidth per block size against it, the hooks' cost per launch
#   hooks                   benchmarks/bench_launch_hooks.py: a 3-array launch with the
#                           launch hooks on against off, alternating rounds
#   growth                  benchmarks/bench_growth.py: growing a pool by 1.6 GiB and giving
#                           it back, whole segments against expandable_segments' pages;
#                           moving 128 MiB of pages by remapping against copying
#   conformance [PART...]   numba-cuda's tests, part by part, under both managers
#                           (parts: other cudapy-1 cudapy-2 cudapy-3; default: all four)
#   nrt                     NRT's np.empty served by the pool (nrt_heap_size): numba-cuda's
#                           NRT tests under the default manager, numba_alloc, and numba_alloc
#                           with the setting (JUnit compared), tests/test_gpu_nrt_heap.py,
#                           then benchmarks/bench_nrt_heap.py
# Options:
#   --dry-run               print what would run, with each step's limit
#   --budget SECONDS        stop starting steps so as to end within SECONDS
#                           (default 450; `all` defaults to 0, no budget)
# Environment: OUT (the device tool's output folder; default /tmp/gpu-session-out),
# GPU_SESSION_STORE (where the full results go; default /tmp/gpu-session),
# LIMIT_TESTS_GPU, LIMIT_TESTS_OTHER, LIMIT_DEMO, LIMIT_BENCH, LIMIT_DEFRAG, LIMIT_SWEEP, LIMIT_KERNELS,
# LIMIT_HEAP, LIMIT_RECLAIM, LIMIT_HOOKS, LIMIT_GROWTH, LIMIT_CONFORMANCE (per part and manager),
# LIMIT_NRT_NUMBA (each of the three runs), LIMIT_NRT_TESTS, LIMIT_NRT_BENCH in seconds,
# MIN_STEP (s: a step with less left is not started; default 20), KERNELS_SIZE,
# KERNELS_REPEAT, CONFORMANCE_WORKERS, PYTHON.
#
# Under $OUT (at most 8 files come back from a device call) this leaves
# machine.txt, timings.tsv, summary.txt, session.log and results.tar.gz, the
# whole store, packed again after every step, so a call cut off keeps what
# finished.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu-session-out}
STORE=${GPU_SESSION_STORE:-/tmp/gpu-session}
SITE=/tmp/site

LIMIT_TESTS_GPU=${LIMIT_TESTS_GPU:-120}       # tests/test_gpu*.py: the plugin under real programs
LIMIT_TESTS_OTHER=${LIMIT_TESTS_OTHER:-80}    # the other gpu-marked tests (bench, cli, ...)
LIMIT_DEMO=${LIMIT_DEMO:-25}
LIMIT_BENCH=${LIMIT_BENCH:-100}
LIMIT_DEFRAG=${LIMIT_DEFRAG:-60}
LIMIT_SWEEP=${LIMIT_SWEEP:-30}
LIMIT_KERNELS=${LIMIT_KERNELS:-300}
LIMIT_HEAP=${LIMIT_HEAP:-100}
LIMIT_RECLAIM=${LIMIT_RECLAIM:-100}
LIMIT_HOOKS=${LIMIT_HOOKS:-40}
LIMIT_GROWTH=${LIMIT_GROWTH:-30}
LIMIT_CONFORMANCE=${LIMIT_CONFORMANCE:-90}
LIMIT_NRT_NUMBA=${LIMIT_NRT_NUMBA:-55}         # numba-cuda's NRT tests, each of three runs
LIMIT_NRT_TESTS=${LIMIT_NRT_TESTS:-70}         # tests/test_gpu_nrt_heap.py: 3 processes
LIMIT_NRT_BENCH=${LIMIT_NRT_BENCH:-150}        # bench_nrt_heap.py: 7 processes, each compiling
LIMIT_MACHINE=60
KERNELS_SIZE=${KERNELS_SIZE:-large}
KERNELS_REPEAT=${KERNELS_REPEAT:-3}
CONFORMANCE_GRACE=20      # s before a part's limit at which its remaining tests are skipped
TEST_TIMEOUT=120          # s, one of our tests (pytest-timeout, where installed): a hang
CONFORMANCE_TEST_TIMEOUT=60   # s, one numba-cuda test: ends a hang before the part's limit
RESERVE=15                # s of the budget kept for packing the results
MIN_STEP=${MIN_STEP:-20}  # s: a step with less left is not started

STEPS=" tests demo bench defrag sweep kernels heap reclaim hooks growth conformance nrt "
PARTS="other cudapy-1 cudapy-2 cudapy-3"
WORKLOADS="cg stencil ragged churn"

usage() {
  sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

plan() {
  cat <<'EOF'
GPU session plan. A session has 15 minutes of device time, all calls
together: the machine's start (180 s planned; about 30 s each time on
2026-11-26), every call, every idle wait while the machine is held warm (it
goes back 30 s after a call) and every failed start count. A call runs at
most 10 minutes; no machine starts with under 4 minutes left. It first ran
on 2026-11-26, on an H100 (benchmarks/results/2026-11-26-gpu-session/):
tests-gpu took 58-63 s, tests-other was cut at its 80 s inside
test_bench.py, heap was cut at its 100-115 s after the goals' cases, reclaim
took 38-46 s, demo 3 s, bench 41 s; timings.tsv records each step. On
2026-11-27 (benchmarks/results/2026-11-27-gpu-session/) call 1 took 291 s
(tests-gpu 63 s, tests-other 80 s, finished) and the start about 30 s, so
call 2 ran bench and conformance other (113 s) and a third call
conformance cudapy-1 (109 s), with 340 s left. On 2026-11-30, on an H200
(benchmarks/results/2026-11-30-gpu-session/), call 1 took 221 s and call 2
107 s; the device heap failed 4 tests, and a third call checked its fix.
Its spread over a class's front, the trimmed launch hooks and
defragment()'s host work came after and are call 1's to measure.

Here, before the first call (once; .whl is ignored by git, 0.3 MB):
    bash benchmarks/fetch_gpu_wheels.sh              # cffi, pycparser, filecheck
    bash benchmarks/fetch_gpu_wheels.sh --with-rmm   # also RMM's 3 wheels (6 MB): RMM rows

Each call is the device tool's run with carry [".whl"] and the timeout_s
given below. The script installs the carried wheels, builds the compiled
core and planner in place where the checkout lacks them (Cython and a C
compiler are in the image: a few seconds) and records the machine (30 s of
the budget planned for all three), runs its steps and ends within its
budget (--budget, default 450 s; a kernels step adds up to 30 s to merge
its records). Since 2026-11-29 the pool's core is compiled ahead of time
(Cython), the copy kernel, reclaim's copies, the launch hooks and the
device heap were redone for speed (issue 36): call 1 runs our tests on
real hardware first, then the figures issue 36 asks for, each printed
beside its goal.

 1. bash benchmarks/gpu_session.sh tests heap defrag hooks
      timeout_s 480; limits: tests 200 s (our GPU tests 120 s, then the
      other gpu-marked ones 80 s), heap 100 s (numba-alloc bench --heap:
      16 B x 10^6 threads against CUDA's malloc, particle emission with
      malloc_warp; since 94c3987 a reservation's ticket names its bits and
      a front holds 2^17 blocks, which bench_heap_crowd.py's model puts at
      2.5x the bump floor at 16 B, 2.5x for a malloc_warp block, against
      9.1x and 29x for the heap the H200 ran: set the two side by side),
      defrag 60 s (bench_defrag.py: the copy kernel against
      cuMemcpyDtoD at 1 MiB to 1 GiB, a full compaction: copies, releases
      and the rest, and one that keeps its emptied segments), hooks 40 s (bench_launch_hooks.py, 11 rounds)
 2. bash benchmarks/gpu_session.sh --budget 180 sweep bench
      timeout_s 210, right after call 1, only if the device tool's status
      then shows the machine warm and budget_left_s at least 240;
      limits: sweep 30 s (the copy kernel's bandwidth for 1 to 16 chunks
      per resident block, and a block a chunk as before), bench 100 s
      (bench_malloc.py: the allocation path against Numba's default, and
      RMM's where its wheels travel)
Then give_back, so that no idle wait counts. The start and the two
timeouts come to 180 + 480 + 210 = 870 s of the 900; the rest is for the
transfers and the wait between the calls. If call 2 does not run, the
next session runs it as its own call 2.

With budget_left_s still at least 240 after call 2, a third call (timeout_s
at most budget_left_s - 60) takes what fits of the next of these (one
conformance part takes about 210 s: --budget 230, timeout_s 250). What does not fit goes
to later sessions, one main call each (timeout_s 480), in this order:
NRT served by the pool, reclaim and the demo, numba-cuda's tests under both managers (90 s
per part and manager; parts other and cudapy-1 ran on 2026-11-27), then
the full-size kernel workloads (300 s a call). NRT's call (issue 39) takes
about 420 s: numba-cuda's NRT tests three ways, our GPU NRT tests, its
benchmark:
    bash benchmarks/gpu_session.sh nrt
    bash benchmarks/gpu_session.sh reclaim demo
    bash benchmarks/gpu_session.sh conformance cudapy-2 cudapy-3
    bash benchmarks/gpu_session.sh kernels cg stencil
    bash benchmarks/gpu_session.sh kernels ragged churn
Every step keeps what it finished (JUnit XML of tests not reached say so;
kernel runs and heap cases are recorded one by one). A step or part cut
at its limit (see timings.tsv and summary.txt) runs again alone in a
later session, with a larger limit:
    LIMIT_CONFORMANCE=200 bash benchmarks/gpu_session.sh conformance cudapy-2
    LIMIT_KERNELS=350 bash benchmarks/gpu_session.sh kernels churn

After each call, here: keep what came back under
benchmarks/results/DATE-gpu-session/callN/ (DATE: the session's) and
unpack results.tar.gz there. Then, over the calls of every session:
    python3 benchmarks/conformance/conformance.py compare \
        --baseline benchmarks/results/*-gpu-session/call*/conformance/*-default.xml \
        --candidate benchmarks/results/*-gpu-session/call*/conformance/*-numba_alloc.xml
    numba-alloc bench --from-runs benchmarks/results/*-gpu-session/call*/kernels/*/runs.jsonl \
        --plot --out benchmarks/results/DATE-gpu-kernels
EOF
}

# -- the arguments ----------------------------------------------------------------

DRY_RUN=0
BUDGET=
ALL=0
steps=()        # "name arg arg ..." per step
while (( $# )); do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --dry-run) DRY_RUN=1 ;;
    --budget)
      [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "gpu_session.sh: --budget needs whole seconds" >&2; exit 2; }
      BUDGET=$2; shift ;;
    --budget=*)
      BUDGET=${1#--budget=}
      [[ $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu_session.sh: --budget needs whole seconds" >&2; exit 2; } ;;
    plan) plan; exit 0 ;;
    all) ALL=1; steps+=("tests" "demo" "bench" "defrag" "sweep" "kernels" "heap" "reclaim" "hooks" "growth" "conformance" "nrt") ;;
    -*) echo "gpu_session.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
      if [[ $STEPS == *" $1 "* ]]; then
        steps+=("$1")
      elif (( ${#steps[@]} )) && [[ ${steps[-1]%% *} == conformance ]]; then
        [[ " $PARTS " == *" $1 "* ]] || { echo "gpu_session.sh: unknown part $1 (parts: $PARTS)" >&2; exit 2; }
        steps[-1]+=" $1"
      elif (( ${#steps[@]} )) && [[ ${steps[-1]%% *} == kernels ]]; then
        [[ " $WORKLOADS " == *" $1 "* ]] || { echo "gpu_session.sh: unknown workload $1 (workloads: $WORKLOADS)" >&2; exit 2; }
        steps[-1]+=" $1"
      else
        echo "gpu_session.sh: unknown step $1 (steps:$STEPS; or plan, all)" >&2; exit 2
      fi ;;
  esac
  shift
done
if (( ! ${#steps[@]} )); then
  usage; exit 2
fi
if [[ -z $BUDGET ]]; then
  if (( ALL )); then BUDGET=0; else BUDGET=450; fi
fi
STARTED=$SECONDS
SHOW=           # what run_step prints instead of the command, when set
DRY_CLOCK=0     # a dry run's steps take their whole limit, so that it shows what the budget leaves

elapsed() {     # seconds of the budget spent: a dry run's clock is its steps' limits alone
  if (( DRY_RUN )); then echo "$DRY_CLOCK"; else echo $(( SECONDS - STARTED )); fi
}

# -- running a step ------------------------------------------------------------------

say() {
  if (( DRY_RUN )); then echo "$*"; else echo "$*" | tee -a "$OUT/session.log"; fi
}

record() {      # step limit seconds exit status
  (( DRY_RUN )) && return 0
  [[ -f $STORE/timings.tsv ]] || printf 'date\tstep\tlimit_s\tseconds\texit\tstatus\n' > "$STORE/timings.tsv"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$@" >> "$STORE/timings.tsv"
  cp "$STORE/timings.tsv" "$OUT/timings.tsv"
}

pack() {
  (( DRY_RUN )) && return 0
  make_summary
  tar -czf "$OUT/results.tar.gz.tmp" -C "$STORE" . 2>/dev/null \
    && mv -f "$OUT/results.tar.gz.tmp" "$OUT/results.tar.gz"
}

# run_step NAME LIMIT COMMAND...: run COMMAND under `timeout` (SIGINT at the
# limit, SIGKILL 15 s later), its output to the session log and to
# logs/NAME.txt; record its time. The limit shrinks to what the budget
# leaves; a step with less than MIN_STEP left is recorded as skipped.
run_step() {
  local name=$1 want=$2
  shift 2
  local lim=$want
  if (( BUDGET > 0 )); then
    local left=$(( BUDGET - $(elapsed) - RESERVE ))
    (( left < lim )) && lim=$left
  fi
  if (( lim < MIN_STEP )); then
    say "== $name: skipped, ${lim}s left in this call's budget"
    record "$name" "$want" 0 - "skipped: budget spent"
    return 0
  fi
  say "== $name (limit ${lim}s): ${SHOW:-$*}"
  SHOW=
  if (( DRY_RUN )); then
    DRY_CLOCK=$(( DRY_CLOCK + lim ))
    return 0
  fi
  export NUMBA_ALLOC_CONFORMANCE_DEADLINE=$(( $(date +%s) + lim - CONFORMANCE_GRACE ))
  local start rc status
  start=$(date +%s.%N)
  timeout -s INT -k 15 "$lim" "$@" 2>&1 | tee -a "$STORE/logs/$name.txt" "$OUT/session.log"
  rc=${PIPESTATUS[0]}
  unset NUMBA_ALLOC_CONFORMANCE_DEADLINE
  case $rc in
    0) status=ok ;;
    124) status="stopped at its limit" ;;
    137) status="killed after its limit" ;;
    *) status="exit $rc" ;;
  esac
  local took
  took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  say "== $name: $status after ${took}s"
  record "$name" "$lim" "$took" "$rc" "$status"
  pack
  return 0
}

have() { "$PY" -c "import $1" 2>/dev/null; }

# -- what is recorded of the machine ---------------------------------------------------

machine() {
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "checkout: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo 'unknown (no .git here)')"
    echo "budget of this call: ${BUDGET}s; steps: ${steps[*]}"
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 \
      || echo "nvidia-smi: not found"
    timeout 60 "$PY" - <<'EOF' 2>&1
import importlib.metadata as md
import os
import platform
import sys

print(f"python {platform.python_version()} ({sys.executable}); {os.cpu_count()} CPUs; "
      f"kernel {platform.release()}")
for name in ("numpy", "numba", "numba-cuda", "llvmlite", "cuda-bindings", "cuda-core",
             "cuda-pathfinder", "cuda-toolkit", "nvidia-nvjitlink", "pytest", "pytest-xdist",
             "pytest-benchmark", "pytest-timeout", "filecheck", "cffi", "pycparser",
             "ml-dtypes", "psutil", "cupy-cuda13x", "rmm-cu13", "librmm-cu13", "matplotlib",
             "tqdm", "nvidia-ml-py"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} not installed")
try:
    from cuda.bindings import driver
    err, version = driver.cuDriverGetVersion()
    print(f"CUDA driver API {version // 1000}.{version % 1000 // 10} ({err})")
except Exception as error:
    print(f"CUDA driver API: unknown ({error!r})")
try:
    from numba import cuda
    device = cuda.get_current_device()
    name = device.name.decode() if isinstance(device.name, bytes) else device.name
    print(f"GPU (Numba): {name}, compute capability {device.compute_capability}")
except Exception as error:
    print(f"GPU (Numba): none ({error!r})")
try:
    from numba.cuda.cudadrv import nvvm
    print(f"NVVM available to Numba: {nvvm.is_available()}")
except Exception as error:
    print(f"NVVM available to Numba: unknown ({error!r})")
try:
    from numba.cuda.cuda_paths import get_cuda_paths
    for what, found in get_cuda_paths().items():
        print(f"CUDA path {what}: {found}")
except Exception as error:
    print(f"CUDA paths: unknown ({error!r})")
try:
    from cuda.bindings import nvjitlink
    print(f"nvJitLink {'.'.join(map(str, nvjitlink.version()))}")
except Exception as error:
    print(f"nvJitLink: absent ({error!r})")
print("numba_alloc NumPy shim: " + ("present" if os.path.exists("numba_alloc/numpy_compat.py")
                                    else "absent"))
for module in ("filecheck", "cffi", "ml_dtypes", "psutil", "xdist", "pytest_benchmark",
               "pytest_timeout", "cupy", "rmm"):
    try:
        __import__(module)
        print(f"import {module}: ok")
    except Exception as error:
        print(f"import {module}: FAILED ({error!r})")
EOF
  } > "$STORE/machine.txt"
  cp "$STORE/machine.txt" "$OUT/machine.txt"
  cat "$STORE/machine.txt" >> "$OUT/session.log"
}

wheels() {
  shopt -s nullglob
  local found=(.whl/*.whl)
  shopt -u nullglob
  if (( ! ${#found[@]} )); then
    say "no wheels in .whl: numba-cuda's tests need cffi, pycparser and filecheck there" \
        "(bash benchmarks/fetch_gpu_wheels.sh here, then carry .whl)"
    return 0
  fi
  local listing
  listing=$(ls .whl)
  if [[ -f $SITE/.gpu-session-wheels && $(cat "$SITE/.gpu-session-wheels") == "$listing" ]]; then
    say "wheels: already installed in $SITE"
  elif (( DRY_RUN )); then
    say "wheels: $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl"
  elif "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl 2>&1 | tee -a "$OUT/session.log"; then
    echo "$listing" > "$SITE/.gpu-session-wheels"
    say "wheels: installed ${#found[@]} in $SITE"
  else
    say "wheels: pip install FAILED (the steps that need them will say so)"
  fi
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
}

make_summary() {
  {
    echo "GPU session summary ($(date -u +%FT%TZ)); the full results: results.tar.gz"
    echo
    [[ -f $STORE/timings.tsv ]] && column -t -s $'\t' "$STORE/timings.tsv" 2>/dev/null
    for f in "$STORE"/tests/summary.txt "$STORE"/conformance/compare.txt "$STORE"/kernels-results/results.md \
             "$STORE"/heap/results.md "$STORE"/nrt/compare.txt "$STORE"/nrt/results.md; do
      [[ -f $f ]] && { echo; echo "== ${f#"$STORE"/}"; head -c 20000 "$f"; }
    done
  } > "$OUT/summary.txt"
}

# -- the steps ---------------------------------------------------------------------------

# Our GPU tests run first, under their own limit: pytest takes files in
# alphabetical order, and test_bench.py and test_cli.py (many subprocesses
# each starting CUDA) would otherwise spend the limit before test_gpu*.py
# (on the first GPU session, 2026-11-26, test_bench.py alone spent the 80 s).
FIRST_TESTS="tests/test_gpu.py tests/test_gpu_defrag.py tests/test_gpu_device_heap.py tests/test_gpu_marks.py tests/test_gpu_reclaim.py"

step_tests() {
  local opts=(-p no:cacheprovider -rfEs) first file ignore=()
  if (( DRY_RUN )) || have pytest_timeout; then opts+=(--timeout "$TEST_TIMEOUT"); fi
  read -r -a first <<< "$FIRST_TESTS"
  for file in "${first[@]}"; do ignore+=(--ignore="$file"); done
  run_step tests-gpu "$LIMIT_TESTS_GPU" "$PY" -m pytest "${first[@]}" "${opts[@]}" \
    --junitxml="$STORE/tests/junit-gpu.xml"
  run_step tests-other "$LIMIT_TESTS_OTHER" "$PY" -m pytest tests -m gpu "${ignore[@]}" \
    "${opts[@]}" --junitxml="$STORE/tests/junit-other.xml"
  (( DRY_RUN )) || for part in gpu other; do
    echo "== tests-$part"
    tail -n 30 "$STORE/logs/tests-$part.txt" 2>/dev/null
  done > "$STORE/tests/summary.txt"
}

step_demo() {
  run_step demo "$LIMIT_DEMO" "$PY" -m numba_alloc.cli demo
}

step_bench() {
  run_step bench "$LIMIT_BENCH" "$PY" benchmarks/bench_malloc.py --repeat 3 --out "$STORE/bench"
}

step_defrag() {
  run_step defrag "$LIMIT_DEFRAG" "$PY" benchmarks/bench_defrag.py --out "$STORE/defrag"
}

step_sweep() {
  run_step sweep "$LIMIT_SWEEP" "$PY" benchmarks/bench_defrag.py --one-block-a-chunk 1024 \
    --chunks-per-block 1 2 4 8 16 --out "$STORE/sweep"
}

step_kernels() {
  local chosen=("$@")
  local tag=all
  (( ${#chosen[@]} )) && tag=$(IFS=-; echo "${chosen[*]}")
  local cmd=("$PY" -m numba_alloc.cli bench --size "$KERNELS_SIZE" --repeat "$KERNELS_REPEAT"
             --plot --out "$STORE/kernels/$tag")
  (( ${#chosen[@]} )) && cmd+=(--workloads "${chosen[@]}")
  run_step "kernels-$tag" "$LIMIT_KERNELS" "${cmd[@]}"
  # the results of every call's records so far (a cut-off run's too)
  if (( DRY_RUN )); then
    say "== kernels-results: $PY -m numba_alloc.cli bench --from-runs $STORE/kernels/*/runs.jsonl --plot --out $STORE/kernels-results"
    return 0
  fi
  shopt -s nullglob
  local records=("$STORE"/kernels/*/runs.jsonl)
  shopt -u nullglob
  if (( ${#records[@]} )); then
    local saved=$BUDGET
    BUDGET=0      # a few seconds, and worth having even at the end of the budget
    run_step kernels-results 30 "$PY" -m numba_alloc.cli bench --from-runs "${records[@]}" \
      --plot --out "$STORE/kernels-results"
    BUDGET=$saved
  fi
}

step_heap() {
  run_step heap "$LIMIT_HEAP" "$PY" -m numba_alloc.cli bench --heap --out "$STORE/heap"
}

step_reclaim() {
  run_step reclaim "$LIMIT_RECLAIM" "$PY" benchmarks/bench_reclaim_gpu.py --out "$STORE/reclaim"
}

step_hooks() {
  run_step hooks "$LIMIT_HOOKS" "$PY" benchmarks/bench_launch_hooks.py --rounds 11 \
    --out "$STORE/hooks"
}

step_growth() {
  run_step growth "$LIMIT_GROWTH" "$PY" benchmarks/bench_growth.py --rounds 5 \
    --out "$STORE/growth"
}

step_conformance() {
  local parts=("$@")
  (( ${#parts[@]} )) || read -r -a parts <<< "$PARTS"
  local conf=$ROOT/benchmarks/conformance
  local missing=()
  if (( ! DRY_RUN )); then
    for module in filecheck cffi ml_dtypes xdist; do
      have "$module" || missing+=("$module")
    done
  fi
  if (( ${#missing[@]} )); then
    say "== conformance: skipped, missing: ${missing[*]} (carry the wheels: bash benchmarks/fetch_gpu_wheels.sh)"
    record conformance 0 0 - "skipped: missing ${missing[*]}"
    return 0
  fi
  local opts=(-c "$conf/pytest.ini" -p numba_alloc_conformance -p no:cacheprovider
              -n "${CONFORMANCE_WORKERS:-$(nproc)}" --dist loadscope -rfE)
  if (( DRY_RUN )) || have pytest_benchmark; then opts+=(--benchmark-disable); fi
  if (( DRY_RUN )) || have pytest_timeout; then opts+=(--timeout "$CONFORMANCE_TEST_TIMEOUT"); fi
  local rootdir=SITE-PACKAGES
  if (( ! DRY_RUN )); then
    rootdir=$(PYTHONPATH=$conf${PYTHONPATH:+:$PYTHONPATH} "$PY" "$conf/conformance.py" rootdir) || rootdir=$ROOT
  fi
  opts+=(--rootdir "$rootdir")
  local i=0 part managers modules
  for part in "${parts[@]}"; do
    if (( DRY_RUN )); then
      modules="(the part's modules: python3 benchmarks/conformance/conformance.py modules $part)"
    else
      modules=$("$PY" "$conf/conformance.py" modules "$part")
    fi
    # alternate which manager goes first, so that order effects cancel
    if (( i % 2 == 0 )); then managers=(default numba_alloc); else managers=(numba_alloc default); fi
    for manager in "${managers[@]}"; do
      local env_cmd=(env -u NUMBA_CUDA_MEMORY_MANAGER)
      [[ $manager == numba_alloc ]] && env_cmd=(env NUMBA_CUDA_MEMORY_MANAGER=numba_alloc)
      SHOW="$([[ $manager == default ]] && echo "(default manager)" || echo "NUMBA_CUDA_MEMORY_MANAGER=numba_alloc") pytest ${opts[*]} --junitxml=$STORE/conformance/$part-$manager.xml --pyargs <the $(wc -w <<< "$modules") modules of part $part>"
      # shellcheck disable=SC2086  # the modules are words
      run_step "conformance-$part-$manager" "$LIMIT_CONFORMANCE" "${env_cmd[@]}" \
        PYTHONPATH="$conf${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest "${opts[@]}" \
        --junitxml="$STORE/conformance/$part-$manager.xml" --pyargs $modules
    done
    if (( ! DRY_RUN )); then
      "$PY" "$conf/conformance.py" compare "$STORE/conformance" > "$STORE/conformance/compare.txt" 2>&1
      head -n 14 "$STORE/conformance/compare.txt" | tee -a "$OUT/session.log"
      pack
    fi
    i=$(( i + 1 ))
  done
}

step_nrt() {
  # numba-cuda's tests are CUDATestCases: as in step_conformance, the plugin
  # gives them the fixture of numba-cuda's source tree (without it each one
  # errors at set-up under all three runs), and its pytest.ini keeps the
  # project's options (-n auto) out
  local conf=$ROOT/benchmarks/conformance
  local opts=(-c "$conf/pytest.ini" -p numba_alloc_conformance -p no:cacheprovider -rfEs)
  if (( DRY_RUN )) || have pytest_timeout; then opts+=(--timeout "$TEST_TIMEOUT"); fi
  local numba_tests=1
  if (( ! DRY_RUN )) && ! have filecheck; then
    numba_tests=0
    say "== nrt-numba: skipped, missing: filecheck (carry the wheels: bash benchmarks/fetch_gpu_wheels.sh)"
    record nrt-numba 0 0 - "skipped: missing filecheck"
  fi
  local run env_cmd
  for run in default numba_alloc nrt_heap; do
    (( numba_tests )) || break
    case $run in
      default) env_cmd=(env -u NUMBA_CUDA_MEMORY_MANAGER -u NUMBA_ALLOC_CONF) ;;
      numba_alloc) env_cmd=(env -u NUMBA_ALLOC_CONF NUMBA_CUDA_MEMORY_MANAGER=numba_alloc) ;;
      nrt_heap) env_cmd=(env NUMBA_CUDA_MEMORY_MANAGER=numba_alloc NUMBA_ALLOC_CONF=nrt_heap_size:256MiB) ;;
    esac
    run_step "nrt-numba-$run" "$LIMIT_NRT_NUMBA" "${env_cmd[@]}" \
      PYTHONPATH="$conf${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest \
      --pyargs numba.cuda.tests.nrt "${opts[@]}" --junitxml="$STORE/nrt/numba-$run.xml"
  done
  if (( ! DRY_RUN && numba_tests )); then
    for run in default numba_alloc; do
      "$PY" benchmarks/conformance/conformance.py compare --baseline "$STORE/nrt/numba-$run.xml" \
        --candidate "$STORE/nrt/numba-nrt_heap.xml" --names "$run" nrt_heap_size
    done > "$STORE/nrt/compare.txt" 2>&1
    head -n 30 "$STORE/nrt/compare.txt" | tee -a "$OUT/session.log"
  fi
  run_step nrt-tests "$LIMIT_NRT_TESTS" "$PY" -m pytest tests/test_gpu_nrt_heap.py \
    -p no:cacheprovider -rfEs --junitxml="$STORE/nrt/junit-gpu-nrt.xml"
  run_step nrt-bench "$LIMIT_NRT_BENCH" "$PY" benchmarks/bench_nrt_heap.py --out "$STORE/nrt"
}

# -- the call ------------------------------------------------------------------------------

export PYTHONUNBUFFERED=1
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
if (( ! DRY_RUN )); then
  mkdir -p "$OUT" "$STORE"/{logs,tests,conformance,kernels,nrt}
  say "gpu_session.sh ${steps[*]} (budget ${BUDGET}s; full results in $STORE, packed into $OUT/results.tar.gz)"
fi
wheels
if (( ! DRY_RUN )); then
  # the compiled core and planner (Cython, in the image): built in place
  # when the checkout lacks them, since it is used through PYTHONPATH
  t0=$(date +%s)
  if ! (cd /tmp && "$PY" -c "import numba_alloc.policy._core, numba_alloc.policy._planner" \
        > /dev/null 2>&1); then
    if (cd "$ROOT" && "$PY" setup.py -q build_ext --inplace > "$STORE/logs/build_ext.txt" 2>&1); then
      say "built the compiled core in place ($(( $(date +%s) - t0 )) s)"
    else
      say "building the compiled core FAILED: logs/build_ext.txt"
      tail -n 20 "$STORE/logs/build_ext.txt"
    fi
  fi
  t0=$(date +%s)
  machine
  record machine "$LIMIT_MACHINE" "$(( $(date +%s) - t0 ))" 0 ok
  pack
fi
for step in "${steps[@]}"; do
  read -r -a words <<< "$step"
  case ${words[0]} in
    tests) step_tests ;;
    demo) step_demo ;;
    bench) step_bench ;;
    defrag) step_defrag ;;
    sweep) step_sweep ;;
    kernels) step_kernels "${words[@]:1}" ;;
    heap) step_heap ;;
    reclaim) step_reclaim ;;
    hooks) step_hooks ;;
    growth) step_growth ;;
    conformance) step_conformance "${words[@]:1}" ;;
    nrt) step_nrt ;;
  esac
done
(( DRY_RUN )) || { pack; say "gpu_session.sh: done in ${SECONDS}s; see $OUT/summary.txt"; }
exit 0
