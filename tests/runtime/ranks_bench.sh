#!/usr/bin/env bash
# ranks_bench.sh MPIRUN TANDEM PYTHON FIXTURES: `tandem bench --json` over 2 ranks reports the
# transfer cost of a decode step, measured and predicted, with the link and the traffic behind
# them, and with --parallel 4 the decode of 4 sequences in one step and in 2 overlapping steps
# (numbers are checked for presence and sense, never for speed).
set -euo pipefail
mpirun=$1 tandem=$2 python=$3 fixtures=$4
model=$fixtures/small-v3-Q4_K_M.gguf
[[ -f $model ]] || { echo "shared fixtures not found in $fixtures" >&2; exit 1; }
out=$(timeout 200 "$mpirun" -np 2 "$tandem" bench "$model" -p 16 -n 16 -r 1 -t 1 --spread pipeline --parallel 4 --json)
"$python" - "$out" <<'PY'
import json, sys
ranks = json.loads(sys.argv[1])["ranks"]
print(ranks)
assert ranks["n_ranks"] == 2 and ranks["spread"] == "pipeline", ranks
# Per step: the residual stream at the cut and the logits back; besides them rank 0's
# announcement (header and inputs) to rank 1.
assert ranks["messages_per_step"] == 2 and ranks["announced_messages_per_step"] == 2, ranks
assert ranks["prediction_comparable"] is True, ranks
assert ranks["bytes_per_step"] > 0 and ranks["link_latency_s"] > 0 and ranks["link_bytes_per_s"] > 0
assert ranks["predicted_transfer_s_per_step"] > 0
assert ranks["decode_tokens_per_s"] > 0 and ranks["decode_alone_tokens_per_s"] > 0
# A pipeline of 2 ranks: a step on each.
assert ranks["parallel"] == 4 and ranks["overlapping_steps"] == 2, ranks
assert ranks["parallel_one_step_tokens_per_s"] > 0 and ranks["parallel_overlapped_tokens_per_s"] > 0
print("bench over 2 ranks reports the transfer cost per step")
PY
