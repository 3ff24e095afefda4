#!/usr/bin/env bash
# ranks_profile.sh MPIRUN TANDEM FIXTURES: `run --save-profile` and `profile` over 2 ranks (every
# MoE layer's experts spread over both) write the routing profile one process writes: each rank's
# layers counted once, none missing.
set -euo pipefail
mpirun=$1 tandem=$2 fixtures=$3
model=$fixtures/qwen3moe-micro-F32.gguf
[[ -f $model ]] || { echo "shared fixtures not found in $fixtures" >&2; exit 1; }
one=$(mktemp --suffix=.json) two=$(mktemp --suffix=.json) prompts=$(mktemp)
trap 'rm -f "$one" "$two" "$prompts"' EXIT
same() {  # same WHAT: $one and $two hold the same profile
  grep -q '"counts"' "$one" || { echo "FAIL: no counts in the one-process profile"; cat "$one"; exit 1; }
  if ! cmp -s "$one" "$two"; then
    echo "FAIL: $1 over 2 ranks differs from one process's"
    diff <(tr ',' '\n' <"$one") <(tr ',' '\n' <"$two") | head -20
    exit 1
  fi
}
run=(run "$model" -p "Tell me about the sea" -n 12 --temp 0 --threads 1)
"$tandem" "${run[@]}" --save-profile "$one" >/dev/null 2>&1
timeout 100 "$mpirun" -np 2 "$tandem" "${run[@]}" --spread mixed --rank-timeout 30 \
  --save-profile "$two" >/dev/null
same "run --save-profile"
printf 'Tell me about the sea\nAnd the rivers\n' >"$prompts"
"$tandem" profile "$model" --prompts "$prompts" -n 6 --threads 1 -o "$one" >/dev/null
timeout 100 "$mpirun" -np 2 "$tandem" profile "$model" --prompts "$prompts" -n 6 --threads 1 \
  --spread mixed --rank-timeout 30 -o "$two" >/dev/null
same "profile"
echo "the routing profiles of run and profile over 2 ranks are one process's"
