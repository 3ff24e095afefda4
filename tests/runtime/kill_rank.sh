#!/usr/bin/env bash
# kill_rank.sh MPIRUN TRANSPORT_TESTS: rank 1 of 2 is killed while rank 0 waits for it (with a 30 s
# transport timeout). The run must end on its own well before that timeout (mpirun stops the other
# ranks when one dies), exit non-zero, and say which rank died.
set -u
mpirun=$1 tests=$2
start=$(date +%s)
out=$(timeout 100 "$mpirun" -np 2 "$tests" --gtest_also_run_disabled_tests \
        --gtest_filter='Transport.DISABLED_ARankThatDiesEndsTheRun' 2>&1)
rc=$?
elapsed=$(($(date +%s) - start))
echo "$out" | tail -20
echo "exit $rc after ${elapsed} s"
if ((rc == 0)); then echo "FAIL: the run went on as if nothing happened"; exit 1; fi
if ((rc == 124)); then echo "FAIL: the run hung until timeout(1) ended it"; exit 1; fi
if ((elapsed > 10)); then echo "FAIL: the other rank took ${elapsed} s to end (limit 10)"; exit 1; fi
if ! grep -qi "rank 1" <<<"$out"; then echo "FAIL: nothing names rank 1"; exit 1; fi
echo "the killed rank ended the run, named"
