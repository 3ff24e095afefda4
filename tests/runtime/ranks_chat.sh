#!/usr/bin/env bash
# ranks_chat.sh MPIRUN TANDEM FIXTURES: `tandem chat` over 2 ranks (rank 0 reads the input and
# samples, rank 1 follows) gives the same greedy replies, turn after turn, as one process. Under
# mpirun the prompt "> " is shown though the input comes through a pipe; it is taken out here.
set -euo pipefail
mpirun=$1 tandem=$2 fixtures=$3
model=$fixtures/qwen3moe-micro-F32.gguf
[[ -f $model ]] || { echo "shared fixtures not found in $fixtures" >&2; exit 1; }
turns=$'Hello there\nAnd again, about the sea\n'
one=$(printf '%s' "$turns" | "$tandem" chat "$model" --temp 0 -n 12 --threads 1 2>/dev/null)
two=$(printf '%s' "$turns" | timeout 100 "$mpirun" -np 2 "$tandem" chat "$model" --temp 0 -n 12 \
  --threads 1 --spread mixed --rank-timeout 30 2>/dev/null)
two=${two//$'\n> '/}
two=${two#> }
while [[ $two == *$'\n' ]]; do two=${two%$'\n'}; done  # as $(...) strips one process's
if [[ "$one" != "$two" ]]; then
  echo "FAIL: the replies over 2 ranks differ from one process's"
  printf 'one process:\n%s\n2 ranks:\n%s\n' "$one" "$two"
  exit 1
fi
[[ $(grep -c . <<<"$one") -ge 2 ]] || { echo "FAIL: expected two replies, got: $one"; exit 1; }
echo "chat over 2 ranks: the same replies as one process, two turns"
