#!/usr/bin/env bash
# ranks_plan_idle.sh MPIRUN TANDEM FIXTURES: `--spread plan` (the default with --devices) whose plan
# leaves a rank without any part (a micro model fits one machine's devices) is refused on every
# rank, naming the idle ranks and what to do, rather than run with ranks that only wait.
set -euo pipefail
mpirun=$1 tandem=$2 fixtures=$3
model=$fixtures/micro-v3-F32.gguf
[[ -f $model ]] || { echo "shared fixtures not found in $fixtures" >&2; exit 1; }
if out=$(timeout 100 "$mpirun" -np 3 "$tandem" run "$model" -p Hello -n 4 --threads 1 \
  --devices sim:2x64MiB 2>&1); then
  echo "FAIL: a plan that leaves ranks idle ran"
  exit 1
fi
grep -q "puts nothing on rank(s) 1, 2" <<<"$out" || { echo "FAIL: no message naming the idle ranks:"; echo "$out"; exit 1; }
grep -q "Run on fewer ranks, pin parts to other machines. devices or RAM with --rules" <<<"$out" || { echo "FAIL: no fix named:"; echo "$out"; exit 1; }
echo "a plan that leaves ranks 1 and 2 idle is refused, named"
