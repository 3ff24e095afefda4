#!/usr/bin/env bash
# ranks_eval.sh MPIRUN TANDEM PYTHON FIXTURES MODEL REF NP SPREAD [EXTRA TANDEM ARGS...]
#               [--ranks-only ARGS...]: evaluates MODEL.gguf on REF's input tokens in one process
# and under `mpirun -np NP` with `--spread SPREAD` (and the extra flags, e.g. --devices, on both;
# those after --ranks-only, e.g. --rules naming other machines' devices, over the ranks only). An
# F32 model must give bit-identical output (the same greedy tokens and every logit); every model
# must pass check.py over the ranks' output. RANKS_EXPECT_SAID in the environment: a grep -E
# pattern the ranks' stderr must match (the plan a run chose).
set -euo pipefail
mpirun=$1 tandem=$2 python=$3 fixtures=$4 model=$5 ref=$6 np=$7 spread=$8
shift 8
both=() ranks_only=()
while (($#)); do
  if [[ $1 == --ranks-only ]]; then
    shift
    ranks_only=("$@")
    break
  fi
  both+=("$1")
  shift
done
if [[ ! -f $fixtures/$model.gguf ]]; then
  echo "shared fixtures not found in $fixtures: the tests expect ../shared/fixtures beside the repository" >&2
  exit 1
fi
one=$(mktemp --suffix=.json) spread_out=$(mktemp --suffix=.json) said=$(mktemp)
trap 'rm -f "$one" "$spread_out" "$said"' EXIT
"$tandem" eval "$fixtures/$model.gguf" --ref "$fixtures/$ref" --out "$one" --threads 1 "${both[@]}"
status=0
timeout 100 "$mpirun" -np "$np" "$tandem" eval "$fixtures/$model.gguf" --ref "$fixtures/$ref" \
  --out "$spread_out" --threads 1 --spread "$spread" --rank-timeout 30 "${both[@]}" \
  "${ranks_only[@]}" 2>"$said" || status=$?
cat "$said" >&2
((status == 0)) || exit "$status"
if [[ -n ${RANKS_EXPECT_SAID:-} ]] && ! grep -qE -- "$RANKS_EXPECT_SAID" "$said"; then
  echo "FAIL: the ranks did not say: $RANKS_EXPECT_SAID"
  exit 1
fi
# Cuts between ranks, and the experts' exchange, go device to device where both ends are sim
# devices (the stand-in for NCCL), and through host memory from the CPU.
channel_lines=$(grep -c "directly (a simulated device channel)" "$said" || true)
expert_lines=$(grep -c "experts' exchange .*directly (a simulated device channel)" "$said" || true)
if [[ " ${both[*]} " == *" --devices sim"* ]]; then
  if ((channel_lines == 0)); then
    echo "FAIL: nothing between the ranks' sim devices went over their device channel"
    exit 1
  fi
  if [[ $spread == experts || $spread == mixed ]] && ((expert_lines == 0)); then
    echo "FAIL: the experts' exchange between sim devices did not go over their device channel"
    exit 1
  fi
elif ((channel_lines > 0)); then
  echo "FAIL: a transfer from a rank's CPU went over a device channel"
  exit 1
fi
"$python" "$fixtures/check.py" --quiet "$fixtures/$ref" "$spread_out"
if [[ $model == *F32* ]]; then
  if ! cmp -s "$one" "$spread_out"; then
    echo "FAIL: $np ranks ($spread) differ from one process on $model"
    "$python" - "$one" "$spread_out" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
print("greedy tokens, one process:", a["generated_tokens"])
print("greedy tokens, ranks:      ", b["generated_tokens"])
for pa, pb in zip(a["positions"], b["positions"]):
    if pa != pb:
        print("first difference at position", pa["pos"], pa["top"][:3], "vs", pb["top"][:3])
        break
PY
    exit 1
  fi
  echo "$np ranks ($spread): bit-identical to one process on $model"
fi
