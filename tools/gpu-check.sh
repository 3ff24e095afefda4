#!/usr/bin/env bash
# The one command that verifies the CUDA backend on a GPU machine, in about 5 minutes on one H100
# or H200 with 16 cores when nothing hangs (a device grant is 15, its start included; the run of
# 2026-12-04 took 125 s with fewer runs than now; the kernel profiles run only in what is left of
# 290 s; each step's own time limit is for a hang, not the plan):
#   1. the CUDA tests: every op against the CPU backend, captures, host tasks, the fixture models
#      on cuda:0 and on a hybrid plan (tests/cuda); then (informational) cuda_matmul_bench, the
#      decode products on a lite and a V3 layer's shapes against the copy bandwidth (the experts'
#      products as the MoE op runs them: issue 27 asks 60% of it);
#   2. the fixtures of tools/gpu/fixtures.txt (F32 and quantized, every architecture) with the
#      fixtures' own checker (check.py), on cuda:0 alone and on a hybrid plan (experts 0-3 of
#      every layer on the CPU), that one also with its prompts streaming the CPU's experts to the
#      GPU (--stream-experts 1);
#   3. the lite-shaped model (generated there, Q4_K_M, 9.7 GiB) with `tandem bench`, fully on
#      the GPU (the default precision, and --precision int16: F32 activations everywhere; graphs
#      on and off), on the CPU alone, and hybrid (every routed expert in RAM, as issue 28's
#      acceptance has it; and experts 0-31 of every layer, as the run of 2026-12-04): tokens/s,
#      the GPU's bandwidth roofline, the cost model's prediction; hybrid pp512 with the CPU's
#      experts streamed to the GPU against the CPU computing them. The summary ends with the
#      issues' acceptance figures (ratios of these runs, and their bars);
#   4. (informational, while the run is under its 5 minutes) a kernel profile of a short run on
#      the GPU by ncu, where it is installed: the kernels that take a decode step's time
#      (OUT/kernel_profile.txt), and 5. one decode step's launches in detail (bytes from memory,
#      occupancy, launch shape: OUT/ncu_detail.csv).
# OUT holds more than the 8 files a device run returns: pack it (tar) to bring it back.
# Writes OUT/gpu-check.log (everything) and OUT/gpu-check.json (the summary), and prints the
# summary last. Runs what tools/gpu-bundle.sh prepared (binaries built elsewhere: the machine has
# nvcc but no -dev libraries), from gpu-bundle/ or $BUNDLE.
#
# Usage: tools/gpu-check.sh OUT      (exit status 0 when every check passed)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/gpu-check.sh OUT}
bundle=${BUNDLE:-gpu-bundle}
mkdir -p "$out"
out=$(cd "$out" && pwd)
log=$out/gpu-check.log
results=$out/results.tsv  # check<TAB>status<TAB>detail, one per line
: >"$log"
: >"$results"
work=${TMPDIR:-/tmp}/tandem-gpu-check
rm -rf "$work"
mkdir -p "$work"
started=$(date +%s)

say() { echo "[$(($(date +%s) - started))s] $*" | tee -a "$log"; }
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$results"; }
# run NAME TIMEOUT CMD...: runs with a time limit, output to the log; records pass/fail.
run() {
  local name=$1 limit=$2
  shift 2
  say "== $name"
  timeout "$limit" "$@" >>"$log" 2>&1
  local status=$?
  if ((status == 0)); then
    record "$name" pass ""
    return 0
  fi
  record "$name" fail "exit $status$( ((status == 124)) && echo ' (timed out)')"
  say "   FAILED (exit $status)"
  return 1
}

[[ -f $bundle/binaries.tar.xz ]] || { echo "no $bundle/binaries.tar.xz: run tools/gpu-bundle.sh first" >&2; exit 2; }
tar -C "$work" -xJf "$bundle/binaries.tar.xz"
export LD_LIBRARY_PATH=$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$work/fixtures"
tar -C "$work/fixtures" -xJf "$bundle/fixtures.tar.xz"
export TANDEM_FIXTURES_DIR=$work/fixtures
export XDG_CACHE_HOME=$work/cache  # measured rates: fresh for this machine
tandem=$work/bin/tandem
fixtures=$TANDEM_FIXTURES_DIR
threads=$(nproc)

say "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.max.sm,clocks.max.mem --format=csv >>"$log" 2>&1
  say "$(nvidia-smi -L 2>&1 | head -4)"
else
  say "no nvidia-smi on this machine"
fi

# 1. Kernel and model tests against the CPU. A test that skipped did not see the GPU: a failure here.
run cuda_tests 240 "$work/bin/cuda_tests" --gtest_output="json:$out/cuda_tests.json" --gtest_brief=1
skipped=$(grep -c '"result": "SKIPPED"' "$out/cuda_tests.json" 2>/dev/null)
if ((${skipped:-0} > 0)); then
  record cuda_tests_saw_the_gpu fail "$skipped tests skipped: the GPU was not seen"
  say "   $skipped tests SKIPPED: no GPU seen"
fi

# 1b. (informational) The decode products on lite and V3 layers' shapes, each against the copy
#     bandwidth; the experts' ones also in the summary.
say "== cuda_matmul_bench (informational)"
timeout 90 "$work/bin/cuda_matmul_bench" --json "$out/cuda_matmul_bench.json" 2>&1 |
  tee "$out/cuda_matmul_bench.txt" >>"$log" || say "   exited $?"

# 2. The fixtures, judged by their own checker, on the GPU alone and on a hybrid plan, whose
#    prompts also run once with the host's experts streamed to the GPU (--stream-experts 1).
hybrid_rules=tests/fixtures/plans/attention_on_gpu_experts_split.yaml
fixture_refs=()
while read -r model; do
  [[ -z $model || $model == \#* ]] && continue
  refs=json
  [[ $model != *F32 ]] && refs=exact.json
  fixture_refs+=("$model".{p1,p2,chat}."$refs")
done <tools/gpu/fixtures.txt
for plan in gpu hybrid hybrid_streamed; do
  plan_args=(--devices cuda:0)
  [[ $plan == hybrid* ]] && plan_args+=(--rules "$hybrid_rules")
  [[ $plan == hybrid_streamed ]] && plan_args+=(--stream-experts 1)
  for ref in "${fixture_refs[@]}"; do
    model=${ref%%.*}
    candidate=$work/$plan.$ref
    run "fixture.$plan.${ref%.json}" 60 bash -c "\"$tandem\" eval \"$fixtures/$model.gguf\" --ref \"$fixtures/$ref\" \
      --out \"$candidate\" --threads $threads ${plan_args[*]} && python3 \"$fixtures/check.py\" --quiet \"$fixtures/$ref\" \"$candidate\""
  done
done

# 3. The lite model, fully on the GPU and hybrid; first the plan this machine gets, with the
#    links the driver reports (NVML) in its explanation. Informational.
lite=$work/lite-Q4_K_M.gguf
say "== plan_this_machine (informational)"
"$tandem" plan --preset deepseek-v3 --explain >"$out/plan_this_machine.txt" 2>&1 || true
grep -i "links" "$out/plan_this_machine.txt" | tee -a "$log"
if run gen_model_lite 240 "$tandem" gen-model --preset lite --format Q4_K_M -o "$lite" --threads "$threads"; then
  # The acceptance figures' runs first (issue 27: fully on the GPU, graphs on and off; issue 28's
  # pair, same machine, same run: every routed expert in RAM, prompts at the model's choice of
  # streaming them, and the CPU alone), then the informational ones.
  run bench_gpu 150 bash -c "\"$tandem\" bench \"$lite\" --devices cuda:0 -p 512 -n 128 -r 3 -t $threads --json > \"$out/bench_gpu.json\""
  run bench_gpu_no_graphs 120 bash -c "\"$tandem\" bench \"$lite\" --devices cuda:0 --no-graphs -p 0 -n 64 -r 2 -t $threads \
    --json > \"$out/bench_gpu_no_graphs.json\""
  run bench_hybrid_all 200 bash -c "\"$tandem\" bench \"$lite\" --devices cuda:0 --rules tools/gpu/lite_experts_on_host.yaml \
    -p 512 -n 64 -r 2 -t $threads --json > \"$out/bench_hybrid_all.json\""
  run bench_cpu 200 bash -c "\"$tandem\" bench \"$lite\" --devices cpu -p 512 -n 64 -r 2 -t $threads \
    --json > \"$out/bench_cpu.json\""
  # Half the experts in RAM, as the run of 2026-12-04.
  run bench_hybrid 200 bash -c "\"$tandem\" bench \"$lite\" --devices cuda:0 --rules tools/gpu/lite_half_experts_on_host.yaml \
    -p 512 -n 64 -r 2 -t $threads --json > \"$out/bench_hybrid.json\""
  # Hybrid prompts with the host's experts streamed to the GPU at every chunk, against the CPU
  # computing them (the cost model's choice is in bench_hybrid's stream_experts_min_tokens).
  for stream in 1 0; do
    run bench_hybrid_stream$stream 90 bash -c "\"$tandem\" bench \"$lite\" --devices cuda:0 \
      --rules tools/gpu/lite_half_experts_on_host.yaml --stream-experts $stream -p 512 -n 0 -r 2 -t $threads \
      --json > \"$out/bench_hybrid_stream$stream.json\""
  done
  # The feed-forward products with F32 activations (--precision int16) against the default's
  # 8-bit ones: what the dp4a steps buy at decode.
  run bench_gpu_int16 120 bash -c "\"$tandem\" bench \"$lite\" --devices cuda:0 --precision int16 -p 0 -n 64 -r 2 \
    -t $threads --json > \"$out/bench_gpu_int16.json\""
  # 4. Where the GPU's time goes: every kernel of a short run on cuda:0 (a two-token prompt, four
  #    decode steps, op by op so each launch is seen) timed by ncu, one metric and one pass per
  #    kernel, summed by kernel name (kernel_profile.txt / .json). Informational: not a check.
  # Only while the run is under its 5 minutes (a device grant is 15, starts included).
  left=$((290 - ($(date +%s) - started)))
  if ((left < 60)); then
    say "== kernel_profile skipped: ${left}s left of the 5 minutes"
  elif command -v ncu >/dev/null; then
    say "== kernel_profile (informational)"
    timeout $((left / 2)) ncu --metrics gpu__time_duration.sum --csv --print-units base --log-file "$out/ncu.csv" \
      "$tandem" run "$lite" --devices cuda:0 --no-graphs -p "Once upon" -n 4 --temp 0 -t "$threads" >>"$log" 2>&1 ||
      say "   ncu exited $?"
    python3 tools/gpu/kernel_profile.py "$out/ncu.csv" --steps 5 --json "$out/kernel_profile.json" \
      >"$out/kernel_profile.txt" 2>&1 && head -30 "$out/kernel_profile.txt" | tee -a "$log"
    # 5. The same run's launches of one decode step in more detail (bytes read from memory,
    #    achieved occupancy, launch shape): why the slowest kernels are slow. Informational.
    left=$((290 - ($(date +%s) - started)))
    if ((left < 30)); then
      say "== kernel_detail skipped: ${left}s left of the 5 minutes"
    else
      say "== kernel_detail (informational)"
      timeout "$left" ncu --launch-skip 1500 --launch-count 300 --csv --print-units base --log-file "$out/ncu_detail.csv" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size,launch__registers_per_thread \
        "$tandem" run "$lite" --devices cuda:0 --no-graphs -p "Once upon" -n 4 --temp 0 -t "$threads" >>"$log" 2>&1 ||
        say "   ncu exited $?"
    fi
  else
    say "== kernel_profile skipped: no ncu on this machine"
  fi
fi
rm -f "$lite"

say "== summary"
python3 - "$out" "$results" "$(($(date +%s) - started))" <<'EOF' | tee -a "$log"
import json, sys, os
out, results, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3])
checks = [dict(zip(("check", "status", "detail"), line.rstrip("\n").split("\t"))) for line in open(results)]
summary = {"seconds": seconds, "passed": sum(c["status"] == "pass" for c in checks),
           "failed": sum(c["status"] != "pass" for c in checks), "checks": checks}
try:
    tests = json.load(open(os.path.join(out, "cuda_tests.json")))
    summary["cuda_tests"] = {"tests": tests.get("tests"), "failures": tests.get("failures"),
                             "disabled": tests.get("disabled"),
                             "skipped": sum(1 for s in tests.get("testsuites", []) for t in s.get("testsuite", [])
                                            if t.get("result") == "SKIPPED")}
except (OSError, ValueError):
    pass
BENCHES = ("bench_gpu", "bench_hybrid", "bench_hybrid_all", "bench_cpu", "bench_hybrid_stream1",
           "bench_hybrid_stream0", "bench_gpu_int16", "bench_gpu_no_graphs")
try:
    products = json.load(open(os.path.join(out, "cuda_matmul_bench.json")))
    summary["expert_products_of_copy"] = {f"{p['model']} {p['product']}": round(p["of_copy"], 3)
                                          for p in products["products"] if p["expert"]}
except (OSError, ValueError, KeyError):
    pass
for name in BENCHES:
    try:
        b = json.load(open(os.path.join(out, name + ".json")))
    except (OSError, ValueError):
        continue
    gpu = (b.get("gpus") or [{}])[0]
    summary[name] = {k: b.get(k) for k in ("prefill_tokens_per_s", "prefill_tokens_per_s_sd", "decode_tokens_per_s",
                                            "decode_tokens_per_s_sd", "predicted_prefill_tokens_per_s",
                                            "predicted_decode_tokens_per_s", "bytes_read_per_token",
                                            "stream_experts_min_tokens")}
    summary[name]["gpu"] = gpu
    measured, predicted = b.get("decode_tokens_per_s") or 0, b.get("predicted_decode_tokens_per_s") or 0
    summary[name]["decode_predicted_over_measured"] = predicted / measured if measured else None
# The issues' acceptance figures: ratios of this run's benches, each with its bar (None where a
# bench is missing). Informational: the exit status stays the checks'.
def figure(name, key):
    return (summary.get(name) or {}).get(key) or None
def ratio(a, b):
    return a / b if a and b else None
acceptance = {}
def bar(name, value, at_least=None, at_most=None):
    met = None if value is None else ((at_least is None or value >= at_least) and (at_most is None or value <= at_most))
    acceptance[name] = {"value": value, "at_least": at_least, "at_most": at_most, "met": met}
bar("27: lite decode fully on the GPU, tokens/s", figure("bench_gpu", "decode_tokens_per_s"), at_least=600)
bar("27: decode with graphs over op by op", ratio(figure("bench_gpu", "decode_tokens_per_s"),
                                                  figure("bench_gpu_no_graphs", "decode_tokens_per_s")), at_least=1.0)
shares = list(summary.get("expert_products_of_copy", {}).values())
bar("27: slowest expert decode product, share of the copy bandwidth", min(shares) if shares else None, at_least=0.6)
bar("28: hybrid decode (every routed expert in RAM) over the CPU alone",
    ratio(figure("bench_hybrid_all", "decode_tokens_per_s"), figure("bench_cpu", "decode_tokens_per_s")), at_least=1.6)
bar("28: hybrid decode, predicted over measured", figure("bench_hybrid_all", "decode_predicted_over_measured"),
    at_least=1 / 1.2, at_most=1.2)
bar("28: hybrid pp512 over the CPU alone",
    ratio(figure("bench_hybrid_all", "prefill_tokens_per_s"), figure("bench_cpu", "prefill_tokens_per_s")), at_least=2.0)
bar("28: pp512 fully on the GPU, tokens/s", figure("bench_gpu", "prefill_tokens_per_s"), at_least=8000)
summary["acceptance"] = acceptance
json.dump(summary, open(os.path.join(out, "gpu-check.json"), "w"), indent=2)
print(f"{summary['passed']} passed, {summary['failed']} failed in {seconds} s")
for c in checks:
    if c["status"] != "pass":
        print(f"  FAILED {c['check']}: {c['detail']}")
for product, share in summary.get("expert_products_of_copy", {}).items():
    print(f"{product}: {100 * share:.0f}% of the copy bandwidth (issue 27 asks 60%)")
for name in BENCHES:
    if name in summary:
        s, g = summary[name], summary[name]["gpu"]
        gpu_part = (f"GPU roofline {g.get('decode_roofline_tokens_per_s', 0):.1f} t/s "
                    f"({100 * (g.get('decode_fraction_of_roofline') or 0):.0f}%), copy {g.get('copy_gb_per_s', 0):.0f} GB/s, "
                    f"decode kernel {g.get('decode_kernel_gb_per_s', 0):.0f} GB/s; " if g else "")
        print(f"{name}: pp {s['prefill_tokens_per_s'] or 0:.1f} t/s, tg {s['decode_tokens_per_s'] or 0:.1f} t/s; "
              f"{gpu_part}predicted/measured decode {s['decode_predicted_over_measured'] or 0:.2f}")
print("acceptance (issue: figure = value; bar):")
for name, a in acceptance.items():
    limits = " and ".join(f"{word} {limit:.4g}" for word, limit in (("at least", a["at_least"]), ("at most", a["at_most"]))
                          if limit is not None)
    state = "no figure" if a["met"] is None else ("met" if a["met"] else "NOT met")
    value = "-" if a["value"] is None else f"{a['value']:.4g}"
    print(f"  {name} = {value}; {limits}: {state}")
EOF
failed=$(awk -F'\t' '$2 != "pass"' "$results" | wc -l)
((failed == 0))
