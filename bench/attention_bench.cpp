// MLA attention on the CPU at decode: one token's heads against a KV cache of N tokens
// (DeepSeek-V2-Lite's shapes: 16 heads, latent 512 + rope 64, nope 128, v_head 128), through
// CpuBackend::mla_attention (absorbed key projection, scores, softmax, weighted sums, value
// projection; the projections Q5_0 and Q4_K as in lite Q4_K_M as downloaded: `tandem repack`
// makes them Q5_0_R16 and Q4_K_R16). Reports the cache bytes read per
// second: the cache is 2.25 KiB a token a layer, so at long context attention reads as much as a
// layer's weights. cache:1 runs the same over a BF16 cache (--cache-type-k/v bf16; half the bytes,
// vdpbf16ps): compare the two at one length for the speed-up, bytes_per_second counting each
// cache's own bytes. layers:27 cycles through 27 caches as a decode step over lite's 27 layers
// does, so that they come from DRAM, not L3.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/aligned_buffer.h"
#include "core/backend.h"
#include "core/half.h"
#include "quant/quant.h"

namespace tandem::cpu {
namespace {

void BM_MlaAttentionDecode(benchmark::State& state) {
  const int64_t n_keys = state.range(0), heads = 16, nope = 128, rope = 64, lora = 512, v_head = 128;
  const int threads = int(state.range(1));
  const bool bf16 = state.range(2) != 0;
  const int64_t layers = state.range(3);
  CpuBackend cpu(threads);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  const size_t cache_values = size_t(n_keys * (lora + rope));
  // On 2 MiB pages, as the engine's KV cache (AlignedBuffer): on 4 KiB pages a VM with shadow
  // page tables adds TLB misses a decode step does not have.
  const std::vector<float> values = random(cache_values * size_t(layers));
  AlignedBuffer cache_buffer(values.size() * (bf16 ? 2 : 4));
  float* cache = cache_buffer.as<float>();
  uint16_t* cache16 = cache_buffer.as<uint16_t>();
  for (size_t i = 0; i < values.size(); ++i)
    if (bf16)
      cache16[i] = f32_to_bf16(values[i]);
    else
      cache[i] = values[i];
  // The projections in the lite Q4_K_M file's formats (Q5_0 k_b, Q4_K v_b), so that their
  // share of the time is the engine's on that file (as F32 they took a third of it).
  auto quantized = [&](DType type, int64_t rows, int64_t cols) {
    const std::vector<float> weights = random(size_t(rows * cols));
    std::vector<uint8_t> q(size_t(rows) * row_bytes(type, uint64_t(cols)));
    for (int64_t r = 0; r < rows; ++r)
      quantize_row(type, weights.data() + r * cols,
                   q.data() + size_t(r) * row_bytes(type, uint64_t(cols)), cols);
    return q;
  };
  const std::vector<uint8_t> k_b = quantized(DType::Q5_0, heads * lora, nope);
  const std::vector<uint8_t> v_b = quantized(DType::Q4_K, heads * v_head, lora);
  std::vector<float> q = random(size_t(heads * (nope + rope))), out(size_t(heads * v_head));
  const int32_t position = int32_t(n_keys - 1), seq = 0;
  MlaAttentionOp op{.q = q.data(),
                    .k_b = {.type = DType::Q5_0,
                            .data = k_b.data(),
                            .cols = nope,
                            .rows = lora,
                            .n_mats = heads,
                            .row_bytes = row_bytes(DType::Q5_0, nope)},
                    .v_b = {.type = DType::Q4_K,
                            .data = v_b.data(),
                            .cols = lora,
                            .rows = v_head,
                            .n_mats = heads,
                            .row_bytes = row_bytes(DType::Q4_K, lora)},
                    .cache = {.data = cache_buffer.data(),
                              .n_seq = 1,
                              .n_ctx = n_keys,
                              .kv_lora_rank = lora,
                              .rope_dims = rope,
                              .type = bf16 ? DType::BF16 : DType::F32},
                    .positions = &position,
                    .seq_ids = &seq,
                    .n_tokens = 1,
                    .n_heads = heads,
                    .nope_dims = nope,
                    .v_head_dims = v_head,
                    .scale = 0.07f,
                    .output = out.data()};
  int64_t layer = 0;
  for (auto _ : state) {
    op.cache.data = bf16 ? static_cast<void*>(cache16 + size_t(layer) * cache_values)
                         : static_cast<void*>(cache + size_t(layer) * cache_values);
    layer = layer + 1 == layers ? 0 : layer + 1;
    cpu.mla_attention(op);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * n_keys * (lora + rope) * (bf16 ? 2 : 4));
}
BENCHMARK(BM_MlaAttentionDecode)
    ->ArgNames({"keys", "threads", "cache", "layers"})
    ->Args({512, 2, 0, 1})
    ->Args({4096, 1, 0, 1})
    ->Args({4096, 2, 0, 1})
    ->Args({4096, 2, 0, 27})
    ->Args({16384, 2, 0, 1})
    ->Args({512, 2, 1, 1})
    ->Args({4096, 1, 1, 1})
    ->Args({4096, 2, 1, 1})
    ->Args({4096, 2, 1, 27})
    ->Args({16384, 2, 1, 1})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tandem::cpu

BENCHMARK_MAIN();
