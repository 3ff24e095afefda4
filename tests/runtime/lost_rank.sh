#!/usr/bin/env bash
# lost_rank.sh MPIRUN TANDEM FIXTURES SIGNAL: `tandem run` over 2 ranks (experts spread, a 3 s
# rank timeout) decodes a long answer; 2 s in, rank 1 gets SIGNAL: KILL (it dies; mpirun ends the
# others) or STOP (it hangs; rank 0's wait for its experts times out). Either way the run must end
# on its own within 10 s of the signal, exit non-zero and name rank 1 (and, for a hang, the step).
set -u
mpirun=$1 tandem=$2 fixtures=$3 signal=$4
model=$fixtures/micro-v3-F32.gguf
[[ -f $model ]] || { echo "shared fixtures not found in $fixtures" >&2; exit 1; }
start=$(date +%s)
out=$(timeout 100 "$mpirun" -np 2 bash -c '
  if [[ $OMPI_COMM_WORLD_RANK == 1 ]]; then (sleep 2; kill -'"$signal"' $$) & fi
  exec "$0" run "$1" -p hello -n 1000000 --ctx 60000 --temp 0 -t 1 --spread experts \
    --rank-timeout 3 >/dev/null' "$tandem" "$model" 2>&1)
rc=$?
elapsed=$(($(date +%s) - start))
pkill -9 -f "exec.*--rank-timeout 3" 2>/dev/null  # a stopped rank left behind, if any
echo "$out" | tail -12
echo "exit $rc after ${elapsed} s"
if ((rc == 0)); then echo "FAIL: the run went on as if nothing happened"; exit 1; fi
if ((rc == 124)); then echo "FAIL: the run hung until timeout(1) ended it"; exit 1; fi
if ((elapsed > 12)); then echo "FAIL: the run took ${elapsed} s to end (limit: 10 after the signal)"; exit 1; fi
if ! grep -qi "rank 1" <<<"$out"; then echo "FAIL: nothing names rank 1"; exit 1; fi
if [[ $signal == STOP ]] && ! grep -q "step [0-9]" <<<"$out"; then echo "FAIL: the step is not named"; exit 1; fi
echo "the lost rank ended the run, named"
