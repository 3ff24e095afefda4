#!/usr/bin/env bash
# ranks_cluster_refused.sh MPIRUN TANDEM FIXTURES CLUSTER: runs that cannot follow a cluster file
# are refused before loading, naming why: more ranks than machines, a rank with fewer devices
# than its machine lists, and a cluster file outside mpirun.
set -euo pipefail
mpirun=$1 tandem=$2 fixtures=$3 cluster=$4
model=$fixtures/micro-v3-F32.gguf
[[ -f $model ]] || { echo "shared fixtures not found in $fixtures" >&2; exit 1; }
refused() {  # refused EXPECTED COMMAND...: COMMAND fails and says EXPECTED (a grep -E pattern)
  local expected=$1 out
  shift
  if out=$(timeout 100 "$@" 2>&1); then
    echo "FAIL: ran: $*"
    exit 1
  fi
  grep -qE -- "$expected" <<<"$out" || { echo "FAIL: not said: $expected"; echo "$out"; exit 1; }
}
run=("$tandem" run "$model" -p Hello -n 2 --threads 1 --cluster "$cluster")
refused "lists 3 machines and this run has 2 ranks: start one rank per machine \(mpirun -np 3\)" \
  "$mpirun" -np 2 "${run[@]}" --devices sim:2x64MiB
# Every rank refuses alike; whichever prints first names itself.
refused "gives machine ([0-2]) \(rank \1\) 2 GPUs, and this rank has 1 device \(--devices sim:64MiB\)" \
  "$mpirun" -np 3 "${run[@]}" --devices sim:64MiB
refused "plans a run over MPI ranks, one per machine it lists" "${run[@]}" --devices sim:2x64MiB
refused "give one or the other" "$mpirun" -np 3 "${run[@]}" --devices sim:2x64MiB --spread mixed
echo "runs that cannot follow the cluster file are refused, named"
