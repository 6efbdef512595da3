#!/usr/bin/env bash
# Download the wheels listed in benchmarks/gpu-wheels.txt into .whl (in the
# repository's root; ignored by git through .git/info/exclude), for the GPU
# machine's Python 3.12, in the form the device tool's README gives. Run it
# here, where pip reaches PyPI, before the device calls; each call then
# names .whl in carry, and benchmarks/gpu_session.sh installs them there.
#
#   bash benchmarks/fetch_gpu_wheels.sh              # what numba-cuda's tests need
#   bash benchmarks/fetch_gpu_wheels.sh --with-rmm   # and RMM (about 6 MB more)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
with_rmm=0
case ${1:-} in
  --with-rmm) with_rmm=1 ;;
  "") ;;
  *) echo "usage: bash benchmarks/fetch_gpu_wheels.sh [--with-rmm]" >&2; exit 2 ;;
esac

wanted=()
while IFS= read -r line; do
  spec=${line%%#*}
  spec=${spec//[[:space:]]/}
  [[ -z $spec ]] && continue
  comment=${line#*#}
  if [[ $line == *"#"* && ${comment# } == rmm:* ]] && (( ! with_rmm )); then
    continue
  fi
  wanted+=("$spec")
done < benchmarks/gpu-wheels.txt

if [[ -d .git ]] && ! grep -qxF '/.whl/' .git/info/exclude 2>/dev/null; then
  mkdir -p .git/info
  echo /.whl/ >> .git/info/exclude
fi
mkdir -p .whl
for spec in "${wanted[@]}"; do
  name=${spec%%==*}
  # one version of each: a wheel of another version of it would stop the install there
  norm=${name//-/_}
  for old in .whl/*.whl; do
    [[ -e $old ]] || continue
    base=$(basename "$old")
    dist=${base%%-*}
    if [[ ${dist,,} == "${norm,,}" && $base != "${dist}-${spec#*==}-"* ]]; then
      echo "removing $old (another version)"; rm -f "$old"
    fi
  done
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "$spec"
done
echo
ls -l .whl
du -sh .whl
