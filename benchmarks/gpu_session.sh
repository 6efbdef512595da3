#!/usr/bin/env bash
# What a session lent a GPU runs there (one device call per part; each part
# ends well inside the device tool's 10-minute limit). Outputs go to $OUT.
#   bash benchmarks/gpu_session.sh tests        # our GPU tests + the demo
#   bash benchmarks/gpu_session.sh conformance  # numba-cuda's own suite, plugin vs default
#   bash benchmarks/gpu_session.sh bench        # benchmarks/bench_malloc.py
#   bash benchmarks/gpu_session.sh kernels [WORKLOAD...]  # numba-alloc bench, full size
#       (not yet timed on a GPU: if a call nears the tool's 10-minute limit,
#       name fewer workloads per call; results go to $OUT/kernels)
# The GPU image has numba-cuda, pytest and hypothesis but no network: the
# numba-cuda suite's extra needs (filecheck, ml_dtypes, psutil, pytest-xdist,
# pytest-benchmark) travel as wheels in .whl (see the device tool's README).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python3 -c "import numba, importlib.metadata as m; print('numba', numba.__version__, 'numba-cuda', m.version('numba-cuda'))"; } \
  > "$OUT/machine.txt" 2>&1
case "${1:-tests}" in
tests)
  python3 -m pytest tests -m gpu -v -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.txt"
  python3 -m numba_alloc.cli demo 2>&1 | tee "$OUT/demo.txt" ;;
conformance)
  for manager in numba_alloc default; do
    NUMBA_CUDA_MEMORY_MANAGER=$manager timeout 280 python3 -m pytest --pyargs numba.cuda.tests \
      -o consider_namespace_packages=true -p no:cacheprovider -q -n 16 \
      2>&1 | tail -40 > "$OUT/numba-cuda-tests-$manager.txt"
  done ;;
bench)
  python3 benchmarks/bench_malloc.py --repeat 3 --out "$OUT" 2>&1 | tee "$OUT/bench.txt" ;;
kernels)
  shift
  workloads=("$@")
  python3 -m numba_alloc.cli bench --size large --repeat 3 --plot --out "$OUT/kernels" \
    ${workloads[@]:+--workloads "${workloads[@]}"} 2>&1 | tee "$OUT/kernels.txt" ;;
esac
