#!/usr/bin/env bash
# Issue 23's show: the README's two commands, three times in a row, each in a
# fresh clone and fresh venv, on a loaded machine (a CPU burner runs throughout).
set -u
COMMIT=$1
python3 -c "while True: pass" &
BURN=$!
trap 'kill $BURN' EXIT
for i in 1 2 3; do
  d=/tmp/v23/round$i
  rm -rf $d && git clone -q /work/main $d && cd $d && git checkout -q $COMMIT
  python3 -m venv .venv && . .venv/bin/activate
  start=$(date +%s)
  ( pip install -q -e . && numba-alloc demo ) > /tmp/v23/demo$i.log 2>&1
  echo "round $i demo rc=$? $(( $(date +%s) - start )) s load=$(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/v23/summary.txt
  start=$(date +%s)
  ( pip install -q -e ".[test,cu13]" && python -m pytest ) > /tmp/v23/test$i.log 2>&1
  echo "round $i test rc=$? $(( $(date +%s) - start )) s load=$(cut -d' ' -f1-3 /proc/loadavg) $(tail -1 /tmp/v23/test$i.log)" >> /tmp/v23/summary.txt
  deactivate
done
