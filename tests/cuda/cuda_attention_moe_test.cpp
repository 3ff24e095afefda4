// The CUDA backend's attention and MoE ops against the CPU backend: kv_store and multi-head
// latent attention over a cache shared by several sequences, expert routing, the expert FFN of
// one shard of a layer's experts, and the weighted sum of the slots. Index arrays (positions,
// sequence ids, expert ids and weights, local indices) live in each backend's memory.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.h"

namespace tandem::test {
namespace {

// ---- kv_store + mla_attention ----

struct MlaShape {
  int64_t lora, rope, nope, v_head, heads;
};

// The tokens of one step and how far each sequence's cache was filled before it: rows at
// positions >= filled hold the poison (NaN), so attending to a position past a token's own
// shows up as a NaN output.
struct MlaStep {
  const char* name;
  std::vector<int32_t> positions, seq_ids;
  std::vector<int32_t> filled;  // [n_seq]
};

// out[t, h] = v_b[h] · Σ_j p_j c_j over the token's sequence up to its position, in double from
// the exact weights. `scale` per output element is Σ_c |v_b[h][v, c]| Σ_j p_j |c_jc|: the absolute
// sum of the last two steps (an error of e per product there gives at most e). Errors of the
// scores come on top: a score error δ moves p_j by at most 2δ relative, so they add up to 2 max|δ|.
struct MlaReference {
  std::vector<double> out, scale;  // [n_tokens, heads, v_head]
};

MlaReference exact_mla(const MlaShape& s, const std::vector<float>& k_b,
                       const std::vector<float>& v_b, const std::vector<float>& q,
                       const std::vector<float>& cache, int64_t n_ctx, const MlaStep& step,
                       float attention_scale) {
  const int64_t T = int64_t(step.positions.size()), H = s.heads, row = s.lora + s.rope;
  const int64_t q_stride = s.nope + s.rope;
  MlaReference ref{std::vector<double>(size_t(T * H * s.v_head)),
                   std::vector<double>(size_t(T * H * s.v_head))};
  std::vector<double> q_lat(size_t(s.lora)), o(size_t(s.lora)), o_abs(size_t(s.lora));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n_keys = step.positions[size_t(t)] + 1;
    const float* keys = cache.data() + int64_t(step.seq_ids[size_t(t)]) * n_ctx * row;
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q.data() + (t * H + h) * q_stride;
      for (int64_t c = 0; c < s.lora; ++c) {
        double sum = 0;
        for (int64_t n = 0; n < s.nope; ++n)
          sum += double(k_b[size_t((h * s.lora + c) * s.nope + n)]) * qh[n];
        q_lat[size_t(c)] = sum;
      }
      std::vector<double> p(static_cast<size_t>(n_keys));
      double max_score = -INFINITY;
      for (int64_t j = 0; j < n_keys; ++j) {
        double score = 0;
        for (int64_t c = 0; c < s.lora; ++c) score += q_lat[size_t(c)] * keys[j * row + c];
        for (int64_t r = 0; r < s.rope; ++r)
          score += double(qh[s.nope + r]) * keys[j * row + s.lora + r];
        p[size_t(j)] = score * attention_scale;
        max_score = std::max(max_score, p[size_t(j)]);
      }
      double sum = 0;
      for (double& v : p) sum += v = std::exp(v - max_score);
      for (double& v : p) v /= sum;
      std::fill(o.begin(), o.end(), 0.0);
      std::fill(o_abs.begin(), o_abs.end(), 0.0);
      for (int64_t j = 0; j < n_keys; ++j)
        for (int64_t c = 0; c < s.lora; ++c) {
          o[size_t(c)] += p[size_t(j)] * keys[j * row + c];
          o_abs[size_t(c)] += p[size_t(j)] * std::fabs(keys[j * row + c]);
        }
      for (int64_t v = 0; v < s.v_head; ++v) {
        double y = 0, scale = 0;
        for (int64_t c = 0; c < s.lora; ++c) {
          const double w = v_b[size_t((h * s.v_head + v) * s.lora + c)];
          y += w * o[size_t(c)];
          scale += std::fabs(w) * o_abs[size_t(c)];
        }
        ref.out[size_t((t * H + h) * s.v_head + v)] = y;
        ref.scale[size_t((t * H + h) * s.v_head + v)] = scale;
      }
    }
  }
  return ref;
}

// Bounds on the normalized error (cuda_test_support.h), and why. Data: q, cache rows ~ N(0, 1),
// k_b ~ N(0, 1/nope) so that q_lat ~ N(0, 1), scale 1/sqrt(kv_lora + rope): scores of order 1,
// so the softmax spreads over many keys and every position matters.
//
// GPU against the exact reference: F32 projections (as matmul: a few 1e-6 at worst), scores
// summed in F32 over kv_lora + rope products and expf within 2 ulp, which move the output by
// twice the score error, ~1e-6. Bound 2e-5, as for matmul. A scale 0.1% off costs 1.2e-4 to
// 2.8e-4 here (tried by hand); a key too many or too few, a wrong head or sequence, or a missing
// rope part costs far more.
constexpr double kMlaGpuVsExact = 2e-5;
// GPU against the CPU: with F32 k_b and v_b the CPU computes in f32 (1.2e-7 against the exact
// reference here): bound 2e-5 as above. With Q8_0 / Q5_0 it quantizes the activations of both
// projections to int16, and the q_lat error reaches the output through the scores too: measured
// 7.7e-6 against the exact reference (kv_lora 64), plus the GPU's: bound 5e-5.
double mla_bound_vs_cpu(DType type) {
  return type == DType::F32 ? 2e-5 : 5e-5;
}

TEST_F(CudaBackendTest, KvStoreAndMlaAttentionMatchCpu) {
  const MlaShape shapes[] = {{64, 16, 32, 32, 4}, {512, 64, 128, 128, 16}};
  const int64_t n_seq = 3, n_ctx = 96;
  const MlaStep steps[] = {
      // A prompt chunk of sequence 2 and a decode token of sequence 0 whose 71 keys span two
      // of the GPU kernel's tiles of 64. Sequence 1 is never read.
      {"chunk + decode", {10, 11, 12, 13, 14, 70}, {2, 2, 2, 2, 2, 0}, {70, 0, 10}},
      // 20 tokens (tiled projections under ByTokenCount) crossing position 64, and a decode
      // token of another sequence.
      {"20-token chunk + decode",
       {50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 15},
       {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2},
       {50, 0, 15}}};
  uint32_t seed = 3000;
  for (const MlaShape& s : shapes) {
    const int64_t H = s.heads, row = s.lora + s.rope, q_stride = s.nope + s.rope;
    const float attention_scale = 1.0f / std::sqrt(float(row));
    const KvLayerView cache_shape{
        .n_seq = n_seq, .n_ctx = n_ctx, .kv_lora_rank = s.lora, .rope_dims = s.rope};
    for (DType type : {DType::F32, DType::Q8_0, DType::Q5_0}) {
      Worst vs_cpu_all, vs_exact_all, cpu_vs_exact_all;
      // k_b: [H] x [kv_lora rows, nope cols]; v_b: [H] x [v_head rows, kv_lora cols].
      const std::vector<uint8_t> k_b =
          make_weights(type, H * s.lora, s.nope, ++seed, 1.0f / std::sqrt(float(s.nope)));
      const std::vector<uint8_t> v_b =
          make_weights(type, H * s.v_head, s.lora, ++seed, 1.0f / std::sqrt(float(s.lora)));
      const std::vector<float> k_b_exact = dequantized(type, k_b, H * s.lora, s.nope);
      const std::vector<float> v_b_exact = dequantized(type, v_b, H * s.v_head, s.lora);
      const auto k_b_dev = to_device(gpu(), k_b), v_b_dev = to_device(gpu(), v_b);
      for (const MlaStep& step : steps) {
        const int64_t T = int64_t(step.positions.size());
        const std::string context =
            fmt::format("kv_lora={} heads={} {} {}", s.lora, H, dtype_name(type), step.name);
        // The cache before the step: earlier positions of each sequence filled, the rest poison.
        std::vector<float> cache(size_t(n_seq * n_ctx * row), poison_value());
        const std::vector<float> earlier = gaussian(cache.size(), ++seed);
        for (int64_t q = 0; q < n_seq; ++q)
          std::copy_n(earlier.begin() + q * n_ctx * row, step.filled[size_t(q)] * row,
                      cache.begin() + q * n_ctx * row);
        const std::vector<float> rows = gaussian(size_t(T * row), ++seed);
        std::vector<float> q = gaussian(size_t(T * H * q_stride), ++seed);
        const auto cache_dev = to_device(gpu(), cache);
        const auto rows_dev = to_device(gpu(), rows), q_dev = to_device(gpu(), q);
        const auto positions_dev = to_device(gpu(), step.positions);
        const auto seq_ids_dev = to_device(gpu(), step.seq_ids);
        KvLayerView gpu_cache = cache_shape, cpu_cache = cache_shape;
        gpu_cache.data = cache_dev.data(), cpu_cache.data = cache.data();

        gpu().kv_store({.rows = rows_dev.data(),
                        .cache = gpu_cache,
                        .positions = positions_dev.data(),
                        .seq_ids = seq_ids_dev.data(),
                        .n_tokens = T});
        cpu_.kv_store({.rows = rows.data(),
                       .cache = cpu_cache,
                       .positions = step.positions.data(),
                       .seq_ids = step.seq_ids.data(),
                       .n_tokens = T});
        ASSERT_TRUE(same_bits(to_host(gpu(), cache_dev), cache))
            << context << ": the caches differ after kv_store";

        const MlaReference ref =
            exact_mla(s, k_b_exact, v_b_exact, q, cache, n_ctx, step, attention_scale);
        const size_t n_out = size_t(T * H * s.v_head);
        const auto out_dev = poisoned(gpu(), n_out);
        for (KernelChoice choice : kChoices) {
          poison(gpu(), out_dev);
          std::vector<float> out_cpu(n_out, poison_value());
          gpu().mla_attention({.q = q_dev.data(),
                               .k_b = weight_view(type, k_b_dev.data(), s.lora, s.nope, H),
                               .v_b = weight_view(type, v_b_dev.data(), s.v_head, s.lora, H),
                               .cache = gpu_cache,
                               .positions = positions_dev.data(),
                               .seq_ids = seq_ids_dev.data(),
                               .n_tokens = T,
                               .n_heads = H,
                               .nope_dims = s.nope,
                               .v_head_dims = s.v_head,
                               .scale = attention_scale,
                               .output = out_dev.data(),
                               .kernels = choice});
          cpu_.mla_attention({.q = q.data(),
                              .k_b = weight_view(type, k_b.data(), s.lora, s.nope, H),
                              .v_b = weight_view(type, v_b.data(), s.v_head, s.lora, H),
                              .cache = cpu_cache,
                              .positions = step.positions.data(),
                              .seq_ids = step.seq_ids.data(),
                              .n_tokens = T,
                              .n_heads = H,
                              .nope_dims = s.nope,
                              .v_head_dims = s.v_head,
                              .scale = attention_scale,
                              .output = out_cpu.data(),
                              .kernels = choice});
          const std::vector<float> out = to_host(gpu(), out_dev);
          Worst vs_cpu, vs_exact, cpu_vs_exact;
          for (size_t i = 0; i < n_out; ++i) {
            auto where = [&] {
              const size_t t = i / size_t(H * s.v_head), h = i / size_t(s.v_head) % size_t(H);
              return fmt::format("{} token {} (position {}) head {} dim {}", context, t,
                                 step.positions[t], h, i % size_t(s.v_head));
            };
            vs_cpu.add(normalized_error(out[i], out_cpu[i], ref.scale[i]), where);
            vs_exact.add(normalized_error(out[i], ref.out[i], ref.scale[i]), where);
            cpu_vs_exact.add(normalized_error(out_cpu[i], ref.out[i], ref.scale[i]), where);
          }
          const double exact_bound = is_standin(gpu()) ? mla_bound_vs_cpu(type) : kMlaGpuVsExact;
          EXPECT_LE(vs_cpu.error, mla_bound_vs_cpu(type)) << "GPU vs CPU at " << vs_cpu.where;
          EXPECT_LE(vs_exact.error, exact_bound) << "GPU vs exact at " << vs_exact.where;
          vs_cpu_all.add(vs_cpu);
          vs_exact_all.add(vs_exact);
          cpu_vs_exact_all.add(cpu_vs_exact);
        }
      }
      std::printf(
          "  kv_lora %3lld %-4s GPU vs CPU %.3g (bound %.3g), GPU vs exact %.3g, CPU vs exact "
          "%.3g\n",
          static_cast<long long>(s.lora), std::string(dtype_name(type)).c_str(), vs_cpu_all.error,
          mla_bound_vs_cpu(type), vs_exact_all.error, cpu_vs_exact_all.error);
    }
  }
}

// The queries' rope inside MLA (MlaAttentionOp::rotate_queries: each block rotates its copy as
// it loads them) gives the bits of rope then attention on the same device: a decode token and a
// prompt chunk, with a cache long enough for split kernels (96) and one short enough for the
// one-block-a-token kernel (64), 16 heads and 12 (a head group half padding); plain rope, YaRN
// and NeoX.
TEST_F(CudaBackendTest, MlaAttentionFusedQueryRopeIsTheSequence) {
  const int64_t lora = 512, rope_dims = 64, nope = 128, v_head = 128;
  const int64_t row = lora + rope_dims, q_stride = nope + rope_dims;
  uint32_t seed = 6400;
  const RopeParams yarn{.rope_dims = rope_dims,
                        .freq_base = 10000.0f,
                        .freq_scale = 0.025f,
                        .ext_factor = 1.0f,
                        .original_ctx = 4096};
  const RopeParams neox{.rope_dims = rope_dims, .neox = true};
  std::vector<int32_t> chunk(20);
  std::iota(chunk.begin(), chunk.end(), 40);
  struct Shape {
    int64_t n_ctx, heads;
  };
  for (const Shape shape : {Shape{96, 16}, Shape{64, 12}}) {
    const int64_t n_ctx = shape.n_ctx, H = shape.heads;
    const auto k_b_dev = to_device(
        gpu(), make_weights(DType::Q8_0, H * lora, nope, ++seed, 1.0f / std::sqrt(float(nope))));
    const auto v_b_dev = to_device(
        gpu(), make_weights(DType::Q8_0, H * v_head, lora, ++seed, 1.0f / std::sqrt(float(lora))));
    const auto cache_dev = to_device(gpu(), gaussian(size_t(n_ctx * row), ++seed));
    const KvLayerView cache{.data = cache_dev.data(),
                            .n_seq = 1,
                            .n_ctx = n_ctx,
                            .kv_lora_rank = lora,
                            .rope_dims = rope_dims};
    const std::vector<int32_t> decode = {int32_t(n_ctx) - 10};
    for (const RopeParams& rope : {RopeParams{.rope_dims = rope_dims}, yarn, neox}) {
      for (const std::vector<int32_t>& positions : {decode, chunk}) {
        const int64_t T = int64_t(positions.size());
        const std::vector<float> q = gaussian(size_t(T * H * q_stride), ++seed);
        const auto positions_dev = to_device(gpu(), positions);
        const auto seq_dev = to_device(gpu(), std::vector<int32_t>(size_t(T), 0));
        std::vector<float> out[3];
        for (int run = 0; run < 3; ++run) {  // rope then attention; fused; unrotated
          const auto q_dev = to_device(gpu(), q);
          const auto out_dev = poisoned(gpu(), size_t(T * H * v_head));
          MlaAttentionOp op{.q = q_dev.data(),
                            .k_b = weight_view(DType::Q8_0, k_b_dev.data(), lora, nope, H),
                            .v_b = weight_view(DType::Q8_0, v_b_dev.data(), v_head, lora, H),
                            .cache = cache,
                            .positions = positions_dev.data(),
                            .seq_ids = seq_dev.data(),
                            .n_tokens = T,
                            .n_heads = H,
                            .nope_dims = nope,
                            .v_head_dims = v_head,
                            .scale = 0.05f,
                            .output = out_dev.data()};
          op.rope = rope;
          if (run == 0) gpu().rope(query_rope(op));
          op.rotate_queries = run == 1;
          gpu().mla_attention(op);
          out[run] = to_host(gpu(), out_dev);
        }
        const std::string context = fmt::format("n_ctx={} heads={} T={} ext_factor={}{}", n_ctx, H,
                                                T, rope.ext_factor, rope.neox ? " neox" : "");
        EXPECT_TRUE(same_bits(out[1], out[0])) << context;
        EXPECT_FALSE(same_bits(out[2], out[0])) << context << ": rotating changes nothing?";
      }
    }
  }
}

// ---- moe_route ----

// Whether float rounding could choose differently for this token: two selection scores among
// the top_k + 1 best (or two group scores) within 1e-5 of each other (relative, plus 1e-5
// absolute for scores near zero). The GPU's expf differs from glibc's by an ulp or two, so the
// backends' scores differ by ~1e-7: gaps of 1e-5 order them alike. Computed in double.
bool near_tie(const MoeRouteOp& op, const float* logits, const float* bias) {
  auto close = [](double a, double b) {
    return std::fabs(a - b) <= 1e-5 * (1.0 + std::max(std::fabs(a), std::fabs(b)));
  };
  const int64_t n = op.n_expert;
  std::vector<double> selection(static_cast<size_t>(n));
  if (op.gating == MoeGating::Softmax) {
    const double max_logit = *std::max_element(logits, logits + n);
    double sum = 0;
    for (int64_t e = 0; e < n; ++e) sum += selection[size_t(e)] = std::exp(logits[e] - max_logit);
    for (double& s : selection) s /= sum;
  } else {
    for (int64_t e = 0; e < n; ++e)
      selection[size_t(e)] = 1.0 / (1.0 + std::exp(-double(logits[e])));
  }
  if (bias)
    for (int64_t e = 0; e < n; ++e) selection[size_t(e)] += bias[e];
  if (op.n_groups > 1 && op.n_groups_used < op.n_groups) {
    const int64_t per_group = n / op.n_groups;
    std::vector<double> group_scores;
    for (int64_t g = 0; g < op.n_groups; ++g) {
      std::vector<double> s(selection.begin() + g * per_group,
                            selection.begin() + (g + 1) * per_group);
      std::sort(s.rbegin(), s.rend());
      group_scores.push_back(op.gating == MoeGating::Sigmoid && per_group > 1 ? s[0] + s[1] : s[0]);
    }
    for (size_t g = 0; g < group_scores.size(); ++g)
      for (size_t h = g + 1; h < group_scores.size(); ++h)
        if (close(group_scores[g], group_scores[h])) return true;
    std::vector<double> sorted = group_scores;
    std::sort(sorted.rbegin(), sorted.rend());
    const double cutoff = sorted[size_t(op.n_groups_used - 1)];
    for (int64_t g = 0; g < op.n_groups; ++g)
      if (group_scores[size_t(g)] < cutoff)
        for (int64_t i = 0; i < per_group; ++i) selection[size_t(g * per_group + i)] = -INFINITY;
  }
  std::vector<double> sorted;
  for (double s : selection)
    if (std::isfinite(s)) sorted.push_back(s);
  std::sort(sorted.rbegin(), sorted.rend());
  for (size_t i = 0; i < size_t(op.top_k) && i + 1 < sorted.size(); ++i)
    if (close(sorted[i], sorted[i + 1])) return true;
  return false;
}

// The same routing code runs on both (backends/moe_routing.h), so expert ids are identical
// wherever no near tie lets an ulp decide, and weights agree to the math library's ulps: softmax
// or sigmoid within ~3 ulp, a division by the sum of a few, normalization and scale: ~15 ulp
// at most, 1.8e-6 relative. Bound 1e-5 relative. Counts must match exactly once the tokens with
// near ties are taken out of both.
TEST_F(CudaBackendTest, MoeRouteChoosesTheCpusExperts) {
  struct Case {
    MoeGating gating;
    int64_t n_expert, n_groups, n_groups_used, top_k;
    bool normalize;
    float scale;
    bool bias;
  };
  const Case cases[] = {
      {MoeGating::Softmax, 16, 1, 1, 2, false, 1.0f, false},  // V2-Lite style
      {MoeGating::Softmax, 64, 1, 1, 6, false, 1.0f, false},
      {MoeGating::Softmax, 64, 4, 2, 6, true, 16.0f, false},  // group-limited softmax (V2)
      {MoeGating::Sigmoid, 16, 4, 2, 4, true, 2.5f, true},    // the V3 fixtures
      {MoeGating::Sigmoid, 64, 4, 2, 8, true, 2.5f, true},
      {MoeGating::Sigmoid, 64, 1, 1, 8, false, 1.0f, true},
      {MoeGating::Sigmoid, 16, 1, 1, 2, true, 1.0f, false}};
  uint32_t seed = 4000;
  int case_index = 0;
  int64_t tokens_routed = 0, tokens_skipped = 0;
  for (const Case& c : cases) {
    for (int64_t n_tokens : {1, 37, 200}) {  // 200: several blocks of the GPU's 64 threads
      const bool with_counts = ++case_index % 2 == 1;  // and null counts every other time
      const std::string context =
          fmt::format("{} n_expert={} groups {}/{} top_k={}{} n_tokens={}",
                      c.gating == MoeGating::Softmax ? "softmax" : "sigmoid", c.n_expert,
                      c.n_groups_used, c.n_groups, c.top_k, c.bias ? " bias" : "", n_tokens);
      const size_t n_logits = size_t(n_tokens * c.n_expert), n_chosen = size_t(n_tokens * c.top_k);
      std::vector<float> logits =
          gaussian(n_logits, ++seed, c.gating == MoeGating::Softmax ? 3.0f : 2.0f);
      const std::vector<float> bias = gaussian(size_t(c.n_expert), ++seed);
      std::vector<uint64_t> counts(size_t(c.n_expert));
      for (size_t e = 0; e < counts.size(); ++e) counts[e] = 1000 + 7 * e;
      const auto logits_dev = to_device(gpu(), logits), bias_dev = to_device(gpu(), bias);
      const auto counts_dev = to_device(gpu(), counts);
      const auto ids_dev = to_device(gpu(), std::vector<int32_t>(n_chosen, -7));
      const auto weights_dev = poisoned(gpu(), n_chosen);
      std::vector<int32_t> ids_cpu(n_chosen, -7);
      std::vector<float> weights_cpu(n_chosen, poison_value());
      std::vector<uint64_t> counts_cpu = counts;
      MoeRouteOp op{.n_tokens = n_tokens,
                    .n_expert = c.n_expert,
                    .top_k = c.top_k,
                    .gating = c.gating,
                    .n_groups = c.n_groups,
                    .n_groups_used = c.n_groups_used,
                    .normalize = c.normalize,
                    .scale = c.scale};
      MoeRouteOp on_gpu = op, on_cpu = op;
      on_gpu.logits = logits_dev.data(), on_cpu.logits = logits.data();
      on_gpu.bias = c.bias ? bias_dev.data() : nullptr,
      on_cpu.bias = c.bias ? bias.data() : nullptr;
      on_gpu.expert_ids = ids_dev.data(), on_cpu.expert_ids = ids_cpu.data();
      on_gpu.expert_weights = weights_dev.data(), on_cpu.expert_weights = weights_cpu.data();
      on_gpu.counts = with_counts ? counts_dev.data() : nullptr;
      on_cpu.counts = with_counts ? counts_cpu.data() : nullptr;
      gpu().moe_route(on_gpu);
      cpu_.moe_route(on_cpu);
      const std::vector<int32_t> ids = to_host(gpu(), ids_dev);
      const std::vector<float> weights = to_host(gpu(), weights_dev);
      std::vector<uint64_t> counts_gpu = to_host(gpu(), counts_dev);

      int64_t skipped = 0;
      Worst weight_error;
      for (int64_t t = 0; t < n_tokens; ++t) {
        const size_t first = size_t(t * c.top_k);
        std::vector<int32_t> chosen(ids.begin() + first, ids.begin() + first + c.top_k);
        std::sort(chosen.begin(), chosen.end());
        EXPECT_TRUE(std::adjacent_find(chosen.begin(), chosen.end()) == chosen.end() &&
                    chosen.front() >= 0 && chosen.back() < c.n_expert)
            << context << ": token " << t << " has invalid or repeated expert ids";
        if (near_tie(op, logits.data() + t * c.n_expert, c.bias ? bias.data() : nullptr)) {
          ++skipped;
          if (with_counts)
            for (size_t k = first; k < first + size_t(c.top_k); ++k)
              --counts_gpu[size_t(ids[k])], --counts_cpu[size_t(ids_cpu[k])];
          continue;
        }
        for (size_t k = first; k < first + size_t(c.top_k); ++k) {
          EXPECT_EQ(ids[k], ids_cpu[k]) << context << ": token " << t << " choice " << k - first;
          weight_error.add(
              normalized_error(weights[k], weights_cpu[k], std::fabs(weights_cpu[k])),
              [&] { return fmt::format("{} token {} choice {}", context, t, k - first); });
        }
      }
      EXPECT_LE(weight_error.error, 1e-5) << weight_error.where;
      EXPECT_LE(skipped, n_tokens / 10) << context << ": too many near ties to mean anything";
      tokens_routed += n_tokens, tokens_skipped += skipped;
      EXPECT_EQ(counts_gpu, counts_cpu) << context << ": routing counts";
      if (!with_counts) {
        EXPECT_EQ(counts_gpu, counts) << context << ": counts written when null";
      }
    }
  }
  std::printf("  %lld tokens routed, %lld left out of the id comparison for near ties\n",
              static_cast<long long>(tokens_routed), static_cast<long long>(tokens_skipped));
}

// ---- moe, moe_reduce ----

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// One slot of the expert FFN in double from the exact weights: y = down · (silu(gate·x) ⊙ up·x).
// `scale` per element is the first-order sum of what an error of e per product in each of the
// three products moves it by, over e: Σ_f |down_df| (|act_f| + |silu'(g_f) u_f| G_f + |silu(g_f)|
// U_f) with G_f, U_f the absolute sums Σ_d |gate_fd x_d|, Σ_d |up_fd x_d|. As for one matmul, an
// error of e in every product gives at most ~e.
void exact_expert(const float* gate, const float* up, const float* down, const float* x,
                  int64_t dim, int64_t ffn, double* y, double* scale) {
  std::vector<double> act(static_cast<size_t>(ffn)), sensitivity(static_cast<size_t>(ffn));
  for (int64_t f = 0; f < ffn; ++f) {
    double g = 0, u = 0, g_abs = 0, u_abs = 0;
    for (int64_t d = 0; d < dim; ++d) {
      g += double(gate[f * dim + d]) * x[d], g_abs += std::fabs(double(gate[f * dim + d]) * x[d]);
      u += double(up[f * dim + d]) * x[d], u_abs += std::fabs(double(up[f * dim + d]) * x[d]);
    }
    const double s = sigmoid(g), silu = g * s, silu_slope = s * (1 + g * (1 - s));
    act[size_t(f)] = silu * u;
    sensitivity[size_t(f)] =
        std::fabs(act[size_t(f)]) + std::fabs(silu_slope * u) * g_abs + std::fabs(silu) * u_abs;
  }
  for (int64_t d = 0; d < dim; ++d) {
    double sum = 0, abs_sum = 0;
    for (int64_t f = 0; f < ffn; ++f) {
      sum += double(down[d * ffn + f]) * act[size_t(f)];
      abs_sum += std::fabs(double(down[d * ffn + f])) * sensitivity[size_t(f)];
    }
    y[d] = sum, scale[d] = abs_sum;
  }
}

// GPU against the exact reference: three F32 products (as matmul: a few 1e-6 at worst against
// their absolute sums, which `scale` bounds from above) and a SiLU with CUDA's expf (~3e-7 of the
// activation): bound 2e-5, as for matmul. GPU against the CPU: F32 weights as above; with Q4_K /
// Q6_K the CPU's int16 activations for x and for down's input add up to 8.6e-7 here: bound 3e-5.
// Two experts swapped cost 0.015 to 0.18 here (tried by hand).
constexpr double kMoeGpuVsExact = 2e-5;
double moe_bound_vs_cpu(DType type) {
  return type == DType::F32 ? 2e-5 : 3e-5;
}

// A shard holding experts 1, 2, 5 and 6 of 8 (local_index -1 for the others), top-3 routing,
// and a dense FFN (one expert, null local_index); 1 and 5 tokens take the rows kernels under
// ByTokenCount, 40 and 80 the tiles, 80 with more than 64 entries for one expert. Slots of
// experts held elsewhere must keep their bits on both backends.
TEST_F(CudaBackendTest, MoeShardWritesOnlyItsExpertsSlotsAndMatchesCpu) {
  struct Formats {
    DType gate_up, down;
    int64_t dim, ffn;  // 72 and 40: ragged rows and columns for the F32 tiles
  };
  struct Layout {
    const char* name;
    int64_t n_expert, top_k;
    std::vector<int32_t> local_index;  // empty: null (identity)
  };
  const Formats formats[] = {{DType::Q4_K, DType::Q6_K, 256, 512},
                             {DType::F32, DType::F32, 72, 40}};
  const Layout layouts[] = {{"shard of 4 of 8 experts", 8, 3, {-1, 0, 1, -1, -1, 2, 3, -1}},
                            {"dense", 1, 1, {}}};
  uint32_t seed = 5000;
  for (const Formats& f : formats) {
    for (const Layout& layout : layouts) {
      const int64_t held = layout.local_index.empty() ? 1 : 4, K = layout.top_k;
      const std::vector<uint8_t> gate =
          make_weights(f.gate_up, held * f.ffn, f.dim, ++seed, 1.0f / std::sqrt(float(f.dim)));
      const std::vector<uint8_t> up =
          make_weights(f.gate_up, held * f.ffn, f.dim, ++seed, 1.0f / std::sqrt(float(f.dim)));
      const std::vector<uint8_t> down =
          make_weights(f.down, held * f.dim, f.ffn, ++seed, 1.0f / std::sqrt(float(f.ffn)));
      const std::vector<float> gate_exact = dequantized(f.gate_up, gate, held * f.ffn, f.dim);
      const std::vector<float> up_exact = dequantized(f.gate_up, up, held * f.ffn, f.dim);
      const std::vector<float> down_exact = dequantized(f.down, down, held * f.dim, f.ffn);
      const auto gate_dev = to_device(gpu(), gate), up_dev = to_device(gpu(), up);
      const auto down_dev = to_device(gpu(), down);
      const auto local_dev = to_device(gpu(), layout.local_index);
      Worst vs_cpu_all, vs_exact_all, cpu_vs_exact_all;
      for (int64_t n_tokens : {1, 5, 40, 80}) {
        // Expert 2 in every token (one expert over 64 entries at 80 tokens), the others random.
        std::mt19937 rng(++seed);
        std::vector<int32_t> ids(size_t(n_tokens * K), 0);
        for (int64_t t = 0; t < n_tokens && K > 1; ++t) {
          std::vector<int32_t> experts = {0, 1, 3, 4, 5, 6, 7};
          std::shuffle(experts.begin(), experts.end(), rng);
          for (int64_t k = 0; k < K; ++k)
            ids[size_t(t * K + k)] = k == t % K ? 2 : experts[size_t(k)];
        }
        const std::vector<float> x = gaussian(size_t(n_tokens * f.dim), ++seed);
        const auto x_dev = to_device(gpu(), x);
        const auto ids_dev = to_device(gpu(), ids);
        // The exact slots of held experts.
        const size_t n_slots_floats = size_t(n_tokens * K * f.dim);
        std::vector<double> ref(n_slots_floats), ref_scale(n_slots_floats);
        std::vector<bool> held_slot(size_t(n_tokens * K));
        for (int64_t s = 0; s < n_tokens * K; ++s) {
          const int32_t e = ids[size_t(s)];
          const int32_t m = layout.local_index.empty() ? e : layout.local_index[size_t(e)];
          if (!(held_slot[size_t(s)] = m >= 0)) continue;
          exact_expert(gate_exact.data() + m * f.ffn * f.dim, up_exact.data() + m * f.ffn * f.dim,
                       down_exact.data() + m * f.dim * f.ffn, x.data() + (s / K) * f.dim, f.dim,
                       f.ffn, ref.data() + s * f.dim, ref_scale.data() + s * f.dim);
        }
        const auto slots_dev = poisoned(gpu(), n_slots_floats);
        for (KernelChoice choice : kChoices) {
          const std::string context =
              fmt::format("{}/{} {} n_tokens={} {}", dtype_name(f.gate_up), dtype_name(f.down),
                          layout.name, n_tokens, choice_name(choice));
          poison(gpu(), slots_dev);
          std::vector<float> slots_cpu(n_slots_floats, poison_value());
          const MoeOp op{.n_expert = layout.n_expert,
                         .n_tokens = n_tokens,
                         .top_k = K,
                         .dim = f.dim,
                         .ffn_dims = f.ffn,
                         .kernels = choice};
          MoeOp on_gpu = op, on_cpu = op;
          on_gpu.input = x_dev.data(), on_cpu.input = x.data();
          on_gpu.gate = weight_view(f.gate_up, gate_dev.data(), f.ffn, f.dim, held);
          on_gpu.up = weight_view(f.gate_up, up_dev.data(), f.ffn, f.dim, held);
          on_gpu.down = weight_view(f.down, down_dev.data(), f.dim, f.ffn, held);
          on_cpu.gate = weight_view(f.gate_up, gate.data(), f.ffn, f.dim, held);
          on_cpu.up = weight_view(f.gate_up, up.data(), f.ffn, f.dim, held);
          on_cpu.down = weight_view(f.down, down.data(), f.dim, f.ffn, held);
          on_gpu.expert_ids = ids_dev.data(), on_cpu.expert_ids = ids.data();
          on_gpu.local_index = layout.local_index.empty() ? nullptr : local_dev.data();
          on_cpu.local_index = layout.local_index.empty() ? nullptr : layout.local_index.data();
          on_gpu.slots = slots_dev.data(), on_cpu.slots = slots_cpu.data();
          gpu().moe(on_gpu);
          cpu_.moe(on_cpu);
          const std::vector<float> slots = to_host(gpu(), slots_dev);
          Worst vs_cpu, vs_exact, cpu_vs_exact;
          size_t foreign_written = 0;
          for (size_t i = 0; i < n_slots_floats; ++i) {
            const size_t slot = i / size_t(f.dim);
            if (!held_slot[slot]) {
              foreign_written += !is_poison(slots[i]) + !is_poison(slots_cpu[i]);
              continue;
            }
            auto where = [&] {
              return fmt::format("{} token {} choice {} (expert {}) element {}", context,
                                 slot / size_t(K), slot % size_t(K), ids[slot], i % size_t(f.dim));
            };
            vs_cpu.add(normalized_error(slots[i], slots_cpu[i], ref_scale[i]), where);
            vs_exact.add(normalized_error(slots[i], ref[i], ref_scale[i]), where);
            cpu_vs_exact.add(normalized_error(slots_cpu[i], ref[i], ref_scale[i]), where);
          }
          const double exact_bound = is_standin(gpu()) ? moe_bound_vs_cpu(f.down) : kMoeGpuVsExact;
          EXPECT_EQ(foreign_written, 0u) << context << ": slots of experts held elsewhere written";
          EXPECT_LE(vs_cpu.error, moe_bound_vs_cpu(f.down)) << "GPU vs CPU at " << vs_cpu.where;
          EXPECT_LE(vs_exact.error, exact_bound) << "GPU vs exact at " << vs_exact.where;
          vs_cpu_all.add(vs_cpu);
          vs_exact_all.add(vs_exact);
          cpu_vs_exact_all.add(cpu_vs_exact);
        }
      }
      std::printf(
          "  %s/%s %-24s GPU vs CPU %.3g (bound %.3g), GPU vs exact %.3g, CPU vs exact %.3g\n",
          std::string(dtype_name(f.gate_up)).c_str(), std::string(dtype_name(f.down)).c_str(),
          layout.name, vs_cpu_all.error, moe_bound_vs_cpu(f.down), vs_exact_all.error,
          cpu_vs_exact_all.error);
    }
  }
}

// Decode with 8-bit activations (MoeOp::activations = Eight, the feed-forward default): the GPU
// quantizes x and the SiLU product per 32 and takes dp4a steps (quant/block_dot_q8.h), the CPU
// its own 8-bit kernels. Both against the exact slots: the CPU's measured 1.6e-4 to 3.2e-4 here
// (its 8-bit bound for one matmul is 1e-2, tests/cpu/matmul_test.cpp); bound 3e-3, where a wrong
// scale or nibble costs 1e-2 or more. And the GPU's 8-bit result must differ from its F32 one
// (else the 8-bit path was not taken).
TEST_F(CudaBackendTest, MoeWithEightBitActivationsStaysWithinTheirError) {
  struct Formats {
    DType gate_up, down;
  };
  const int64_t dim = 512, ffn = 256, n_expert = 4, K = 2;
  uint32_t seed = 7000;
  for (const Formats f : {Formats{DType::Q4_K, DType::Q6_K}, Formats{DType::Q5_0, DType::Q8_0},
                          Formats{DType::IQ4_XS, DType::Q5_K}, Formats{DType::IQ2_XXS, DType::IQ3_XXS}}) {
    const std::vector<uint8_t> gate =
        make_weights(f.gate_up, n_expert * ffn, dim, ++seed, 1.0f / std::sqrt(float(dim)));
    const std::vector<uint8_t> up =
        make_weights(f.gate_up, n_expert * ffn, dim, ++seed, 1.0f / std::sqrt(float(dim)));
    const std::vector<uint8_t> down =
        make_weights(f.down, n_expert * dim, ffn, ++seed, 1.0f / std::sqrt(float(ffn)));
    const std::vector<float> gate_exact = dequantized(f.gate_up, gate, n_expert * ffn, dim);
    const std::vector<float> up_exact = dequantized(f.gate_up, up, n_expert * ffn, dim);
    const std::vector<float> down_exact = dequantized(f.down, down, n_expert * dim, ffn);
    const auto gate_dev = to_device(gpu(), gate), up_dev = to_device(gpu(), up);
    const auto down_dev = to_device(gpu(), down);
    for (int64_t n_tokens : {1, 5}) {
      std::vector<int32_t> ids(size_t(n_tokens * K));
      for (size_t s = 0; s < ids.size(); ++s) ids[s] = int32_t((s * 3 + s / 2) % n_expert);
      const std::vector<float> x = gaussian(size_t(n_tokens * dim), ++seed);
      const auto x_dev = to_device(gpu(), x);
      const auto ids_dev = to_device(gpu(), ids);
      const size_t n_floats = size_t(n_tokens * K * dim);
      std::vector<double> ref(n_floats), ref_scale(n_floats);
      for (int64_t s = 0; s < n_tokens * K; ++s) {
        const int32_t e = ids[size_t(s)];
        exact_expert(gate_exact.data() + e * ffn * dim, up_exact.data() + e * ffn * dim,
                     down_exact.data() + e * dim * ffn, x.data() + (s / K) * dim, dim, ffn,
                     ref.data() + s * dim, ref_scale.data() + s * dim);
      }
      const auto slots_dev = poisoned(gpu(), n_floats);
      std::vector<float> by_bits[2];
      std::vector<float> slots_cpu(n_floats);
      for (ActivationBits bits : {ActivationBits::Sixteen, ActivationBits::Eight}) {
        MoeOp op{.n_expert = n_expert, .n_tokens = n_tokens, .top_k = K, .dim = dim,
                 .ffn_dims = ffn, .kernels = KernelChoice::ByTokenCount, .activations = bits};
        MoeOp on_cpu = op;
        op.input = x_dev.data(), on_cpu.input = x.data();
        op.gate = weight_view(f.gate_up, gate_dev.data(), ffn, dim, n_expert);
        op.up = weight_view(f.gate_up, up_dev.data(), ffn, dim, n_expert);
        op.down = weight_view(f.down, down_dev.data(), dim, ffn, n_expert);
        on_cpu.gate = weight_view(f.gate_up, gate.data(), ffn, dim, n_expert);
        on_cpu.up = weight_view(f.gate_up, up.data(), ffn, dim, n_expert);
        on_cpu.down = weight_view(f.down, down.data(), dim, ffn, n_expert);
        op.expert_ids = ids_dev.data(), on_cpu.expert_ids = ids.data();
        op.slots = slots_dev.data(), on_cpu.slots = slots_cpu.data();
        poison(gpu(), slots_dev);
        gpu().moe(op);
        by_bits[bits == ActivationBits::Eight] = to_host(gpu(), slots_dev);
        if (bits == ActivationBits::Eight) cpu_.moe(on_cpu);
      }
      const std::string context = fmt::format("{}/{} n_tokens={}", dtype_name(f.gate_up),
                                              dtype_name(f.down), n_tokens);
      Worst gpu_vs_exact, cpu_vs_exact;
      size_t differ = 0;
      for (size_t i = 0; i < n_floats; ++i) {
        auto where = [&] { return fmt::format("{} element {}", context, i); };
        gpu_vs_exact.add(normalized_error(by_bits[1][i], ref[i], ref_scale[i]), where);
        cpu_vs_exact.add(normalized_error(slots_cpu[i], ref[i], ref_scale[i]), where);
        differ += by_bits[1][i] != by_bits[0][i];
      }
      EXPECT_LE(gpu_vs_exact.error, 3e-3) << "GPU (8-bit) vs exact at " << gpu_vs_exact.where;
      EXPECT_LE(cpu_vs_exact.error, 3e-3) << "CPU (8-bit) vs exact at " << cpu_vs_exact.where;
      if (!is_standin(gpu())) {
        EXPECT_GT(differ, n_floats / 2) << context << ": the 8-bit path gave the F32 path's bits";
      }
      std::printf("  %s: GPU 8-bit vs exact %.3g, CPU 8-bit vs exact %.3g\n", context.c_str(),
                  gpu_vs_exact.error, cpu_vs_exact.error);
    }
  }
}

// Routing with the router's product in front (MoeRouteOp::router: the routing in the product's
// last block at decode) gives the bits of the matmul and routing it stands for, on one device:
// softmax (lite) and grouped sigmoid with a selection bias (V3), with and without a router bias,
// one token to a prompt chunk (past 8 tokens: the sequence); twice in a row (the counter resets).
TEST_F(CudaBackendTest, MoeRouteFusedWithTheRouterIsTheSequence) {
  struct Case {
    int64_t n_expert, top_k, n_groups, n_groups_used;
    MoeGating gating;
    bool router_bias;
  };
  const int64_t dim = 1024;
  uint32_t seed = 7500;
  for (const Case c : {Case{64, 6, 1, 1, MoeGating::Softmax, false},
                       Case{256, 8, 8, 4, MoeGating::Sigmoid, true}}) {
    const std::vector<float> router = gaussian(size_t(c.n_expert * dim), ++seed, 0.03f);
    const auto router_dev = to_device(gpu(), router);
    const auto router_bias_dev = to_device(gpu(), gaussian(size_t(c.n_expert), ++seed));
    const auto bias_dev = to_device(gpu(), gaussian(size_t(c.n_expert), ++seed, 0.01f));
    for (int64_t n_tokens : {1, 3, 8, 40}) {
      const auto h_dev = to_device(gpu(), gaussian(size_t(n_tokens * dim), ++seed));
      const size_t n_chosen = size_t(n_tokens * c.top_k);
      MoeRouteOp op{.logits = nullptr,
                    .bias = c.gating == MoeGating::Sigmoid ? bias_dev.data() : nullptr,
                    .n_tokens = n_tokens,
                    .n_expert = c.n_expert,
                    .top_k = c.top_k,
                    .gating = c.gating,
                    .n_groups = c.n_groups,
                    .n_groups_used = c.n_groups_used,
                    .normalize = true,
                    .scale = 2.5f,
                    .expert_ids = nullptr,
                    .expert_weights = nullptr};
      op.router = weight_view(DType::F32, router_dev.data(), c.n_expert, dim);
      op.input = h_dev.data();
      op.router_bias = c.router_bias ? router_bias_dev.data() : nullptr;
      std::vector<float> sequence_logits, sequence_weights;
      std::vector<int32_t> sequence_ids;
      for (int run = 0; run < 3; ++run) {  // the sequence, then the fused op twice
        const auto logits_dev = poisoned(gpu(), size_t(n_tokens * c.n_expert));
        const auto ids_dev = to_device(gpu(), std::vector<int32_t>(n_chosen, -7));
        const auto weights_dev = poisoned(gpu(), n_chosen);
        MoeRouteOp r = op;
        r.logits = logits_dev.data(), r.expert_ids = ids_dev.data();
        r.expert_weights = weights_dev.data();
        if (run == 0) {
          gpu().matmul({.weight = r.router,
                        .input = r.input,
                        .output = r.logits,
                        .n_tokens = n_tokens,
                        .bias = r.router_bias});
          r.router = {};
        }
        gpu().moe_route(r);
        const std::vector<float> logits = to_host(gpu(), logits_dev);
        const std::vector<float> weights = to_host(gpu(), weights_dev);
        const std::vector<int32_t> ids = to_host(gpu(), ids_dev);
        if (run == 0) {
          sequence_logits = logits, sequence_weights = weights, sequence_ids = ids;
          continue;
        }
        const std::string context =
            fmt::format("{} experts, n_tokens={}, fused run {}", c.n_expert, n_tokens, run);
        const std::string kernels =
            kernel_list(kernels_for([&](cuda::OpLaunches& ops) { ops.moe_route(r); }));
        if (n_tokens <= 8) {
          EXPECT_EQ(kernels, "router_route_kernel") << context;
        }
        EXPECT_TRUE(same_bits(logits, sequence_logits)) << context << ": logits";
        EXPECT_EQ(ids, sequence_ids) << context << ": choices";
        EXPECT_TRUE(same_bits(weights, sequence_weights)) << context << ": weights";
      }
    }
  }
}

// Two products over one input (MatmulOp::second, a layer's q and kv_a) give the bits of two
// matmuls on the same device: one launch at decode, two tile launches for a prompt; a pair in
// two formats runs as two ops.
TEST_F(CudaBackendTest, MatmulPairFusedIsTwoMatmuls) {
  const int64_t cols = 512, rows = 3072, second_rows = 576;
  uint32_t seed = 7400;
  for (DType second_type : {DType::Q4_K, DType::Q6_K}) {
    const std::vector<uint8_t> w1 = make_weights(DType::Q4_K, rows, cols, ++seed, 0.05f);
    const std::vector<uint8_t> w2 = make_weights(second_type, second_rows, cols, ++seed, 0.05f);
    const auto w1_dev = to_device(gpu(), w1), w2_dev = to_device(gpu(), w2);
    for (int64_t n_tokens : {1, 3, 40}) {
      const auto x_dev = to_device(gpu(), gaussian(size_t(n_tokens * cols), ++seed));
      const MatmulOp first{.weight = weight_view(DType::Q4_K, w1_dev.data(), rows, cols),
                           .input = x_dev.data(),
                           .output = nullptr,
                           .n_tokens = n_tokens};
      const WeightView second = weight_view(second_type, w2_dev.data(), second_rows, cols);
      std::vector<float> outputs[2][2];
      for (bool fused : {false, true}) {
        const auto a_dev = poisoned(gpu(), size_t(n_tokens * rows));
        const auto b_dev = poisoned(gpu(), size_t(n_tokens * second_rows));
        MatmulOp op = first;
        op.output = a_dev.data();
        if (fused) {
          op.second = second, op.second_output = b_dev.data();
          gpu().matmul(op);
        } else {
          gpu().matmul(op);
          gpu().matmul({.weight = second,
                        .input = x_dev.data(),
                        .output = b_dev.data(),
                        .n_tokens = n_tokens});
        }
        outputs[fused][0] = to_host(gpu(), a_dev);
        outputs[fused][1] = to_host(gpu(), b_dev);
      }
      const std::string context =
          fmt::format("{} second, n_tokens={}", dtype_name(second_type), n_tokens);
      const size_t n_kernels = kernels_for([&](cuda::OpLaunches& ops) {
                                 MatmulOp op = first;
                                 op.second = second;
                                 ops.matmul(op);
                               }).size();
      EXPECT_EQ(n_kernels, second_type == DType::Q4_K && n_tokens <= 8 ? 1u : 2u)
          << context << ": one rows launch for a pair of one format";
      EXPECT_TRUE(same_bits(outputs[1][0], outputs[0][0])) << context << ": first product";
      EXPECT_TRUE(same_bits(outputs[1][1], outputs[0][1])) << context << ": second product";
      size_t finite = 0;
      for (float v : outputs[1][1]) finite += std::isfinite(v);
      EXPECT_EQ(finite, outputs[1][1].size()) << context << ": second product not all written";
    }
  }
}

// The shared experts inside the routed experts' launches (MoeOp::shared) give the bits of the
// sequence they stand for, run on the same device: shared experts as a dense FFN, the one-slot
// reduce, then the routed experts; at decode (fused) and for a prompt chunk (the sequence), both
// precisions, with a local index that leaves some experts to another device.
TEST_F(CudaBackendTest, MoeWithSharedExpertsFusedIsTheSequence) {
  const int64_t dim = 512, ffn = 256, shared_ffn = 512, n_expert = 4, K = 2;
  uint32_t seed = 7300;
  const float gate_scale = 1.0f / std::sqrt(float(dim));
  auto weights = [&](DType type, int64_t rows, int64_t cols, float scale) {
    return make_weights(type, rows, cols, ++seed, scale);
  };
  const std::vector<uint8_t> gate = weights(DType::Q4_K, n_expert * ffn, dim, gate_scale);
  const std::vector<uint8_t> up = weights(DType::Q4_K, n_expert * ffn, dim, gate_scale);
  const std::vector<uint8_t> down = weights(DType::Q6_K, n_expert * dim, ffn, 0.0625f);
  const std::vector<uint8_t> sh_gate = weights(DType::Q4_K, shared_ffn, dim, gate_scale);
  const std::vector<uint8_t> sh_up = weights(DType::Q4_K, shared_ffn, dim, gate_scale);
  const std::vector<uint8_t> sh_down = weights(DType::Q6_K, dim, shared_ffn, 0.044f);
  const auto gate_dev = to_device(gpu(), gate), up_dev = to_device(gpu(), up);
  const auto down_dev = to_device(gpu(), down), sh_gate_dev = to_device(gpu(), sh_gate);
  const auto sh_up_dev = to_device(gpu(), sh_up), sh_down_dev = to_device(gpu(), sh_down);
  const auto local_dev = to_device(gpu(), std::vector<int32_t>{0, -1, 1, 2});
  for (int64_t n_tokens : {1, 3, 40}) {
    std::vector<int32_t> ids(size_t(n_tokens * K));
    for (size_t s = 0; s < ids.size(); ++s) ids[s] = int32_t((s * 3 + s / 2) % n_expert);
    const auto x_dev = to_device(gpu(), gaussian(size_t(n_tokens * dim), ++seed));
    const auto ids_dev = to_device(gpu(), ids);
    const auto zeros_dev = to_device(gpu(), std::vector<int32_t>(size_t(n_tokens), 0));
    const auto ones_dev = to_device(gpu(), std::vector<float>(size_t(n_tokens), 1.0f));
    const size_t slot_floats = size_t(n_tokens * K * dim), out_floats = size_t(n_tokens * dim);
    for (ActivationBits bits : {ActivationBits::Sixteen, ActivationBits::Eight}) {
      MoeOp op{.input = x_dev.data(),
               .gate = weight_view(DType::Q4_K, gate_dev.data(), ffn, dim, 3),
               .up = weight_view(DType::Q4_K, up_dev.data(), ffn, dim, 3),
               .down = weight_view(DType::Q6_K, down_dev.data(), dim, ffn, 3),
               .expert_ids = ids_dev.data(),
               .local_index = local_dev.data(),
               .n_expert = n_expert,
               .n_tokens = n_tokens,
               .top_k = K,
               .dim = dim,
               .ffn_dims = ffn,
               .slots = nullptr,
               .kernels = KernelChoice::ByTokenCount,
               .activations = bits};
      const auto slot_dev = poisoned(gpu(), out_floats);
      op.shared = {.gate = weight_view(DType::Q4_K, sh_gate_dev.data(), shared_ffn, dim, 1),
                   .up = weight_view(DType::Q4_K, sh_up_dev.data(), shared_ffn, dim, 1),
                   .down = weight_view(DType::Q6_K, sh_down_dev.data(), dim, shared_ffn, 1),
                   .ffn_dims = shared_ffn,
                   .zero_ids = zeros_dev.data(),
                   .one_weights = ones_dev.data(),
                   .slot = slot_dev.data(),
                   .output = nullptr};
      std::vector<float> slots[2], outputs[2];
      for (bool fused : {false, true}) {
        const auto slots_dev = to_device(gpu(), std::vector<float>(slot_floats, 0.0f));
        const auto out_dev = poisoned(gpu(), out_floats);
        MoeOp run = op;
        run.slots = slots_dev.data();
        run.shared.output = out_dev.data();
        if (fused) {
          gpu().moe(run);
        } else {
          gpu().moe(shared_experts_moe(run));
          gpu().moe_reduce(shared_experts_reduce(run));
          run.shared = {};
          gpu().moe(run);
        }
        slots[fused] = to_host(gpu(), slots_dev);
        outputs[fused] = to_host(gpu(), out_dev);
      }
      const std::string context =
          fmt::format("n_tokens={} {}-bit", n_tokens, bits == ActivationBits::Eight ? 8 : 16);
      EXPECT_TRUE(same_bits(slots[1], slots[0])) << context << ": routed slots";
      EXPECT_TRUE(same_bits(outputs[1], outputs[0])) << context << ": shared experts";
      // Decode (rows kernels): the shared experts inside one gate/up and one down launch.
      const std::string kernels = kernel_list(kernels_for([&](cuda::OpLaunches& ops) {
        MoeOp run = op;
        run.slots = run.shared.output = nullptr;
        ops.moe(run);
      }));
      const std::string fused = bits == ActivationBits::Eight
                                    ? "quantize_q8_kernel expert_gate_up_rows quantize_q8_kernel "
                                      "expert_down_rows"
                                    : "expert_gate_up_rows expert_down_rows";
      if (n_tokens < 16) {
        EXPECT_EQ(kernels, fused) << context;
      }
      size_t finite = 0;
      for (float v : outputs[1]) finite += std::isfinite(v);
      EXPECT_EQ(finite, out_floats) << context << ": shared experts not all written";
    }
  }
}

// The experts' 8-bit input quantized in the router's launch (MoeRouteOp::prepare_experts_input,
// MoeOp::input_prepared) gives the slots of the sequence on the same device, and the experts'
// op then launches no quantize of its own; a MoeOp marked prepared after a routing that did not
// prepare quantizes as before.
TEST_F(CudaBackendTest, MoeRouteFusedQuantizesTheExpertsInput) {
  const int64_t dim = 512, ffn = 256, n_expert = 8, K = 2;
  uint32_t seed = 7700;
  const float gate_scale = 1.0f / std::sqrt(float(dim));
  const auto router_dev = to_device(gpu(), gaussian(size_t(n_expert * dim), ++seed, 0.05f));
  const auto gate_dev =
      to_device(gpu(), make_weights(DType::Q4_K, n_expert * ffn, dim, ++seed, gate_scale));
  const auto up_dev =
      to_device(gpu(), make_weights(DType::Q4_K, n_expert * ffn, dim, ++seed, gate_scale));
  const auto down_dev =
      to_device(gpu(), make_weights(DType::Q6_K, n_expert * dim, ffn, ++seed, 0.0625f));
  for (int64_t n_tokens : {1, 3}) {
    const auto x_dev = to_device(gpu(), gaussian(size_t(n_tokens * dim), ++seed));
    const size_t n_chosen = size_t(n_tokens * K), slot_floats = size_t(n_tokens * K * dim);
    MoeRouteOp route{.logits = nullptr,
                     .bias = nullptr,
                     .n_tokens = n_tokens,
                     .n_expert = n_expert,
                     .top_k = K,
                     .gating = MoeGating::Softmax,
                     .n_groups = 1,
                     .n_groups_used = 1,
                     .normalize = false,
                     .scale = 1.0f,
                     .expert_ids = nullptr,
                     .expert_weights = nullptr};
    route.router = weight_view(DType::F32, router_dev.data(), n_expert, dim);
    route.input = x_dev.data();
    MoeOp moe{.input = x_dev.data(),
              .gate = weight_view(DType::Q4_K, gate_dev.data(), ffn, dim, n_expert),
              .up = weight_view(DType::Q4_K, up_dev.data(), ffn, dim, n_expert),
              .down = weight_view(DType::Q6_K, down_dev.data(), dim, ffn, n_expert),
              .expert_ids = nullptr,
              .local_index = nullptr,
              .n_expert = n_expert,
              .n_tokens = n_tokens,
              .top_k = K,
              .dim = dim,
              .ffn_dims = ffn,
              .slots = nullptr,
              .kernels = KernelChoice::ByTokenCount,
              .activations = ActivationBits::Eight};
    std::vector<float> slots[2];
    std::vector<int32_t> ids[2];
    // The fused run first: the unfused one would leave this very input's quantized copy in the
    // scratch, where a router that quantized nothing would go unnoticed.
    for (bool fused : {true, false}) {
      const auto logits_dev = poisoned(gpu(), size_t(n_tokens * n_expert));
      const auto ids_dev = to_device(gpu(), std::vector<int32_t>(n_chosen, -7));
      const auto weights_dev = poisoned(gpu(), n_chosen);
      const auto slots_dev = poisoned(gpu(), slot_floats);
      MoeRouteOp r = route;
      r.logits = logits_dev.data(), r.expert_ids = ids_dev.data();
      r.expert_weights = weights_dev.data();
      r.prepare_experts_input = fused;
      MoeOp m = moe;
      m.expert_ids = ids_dev.data(), m.slots = slots_dev.data();
      m.input_prepared = fused;
      gpu().moe_route(r);
      gpu().moe(m);
      slots[fused] = to_host(gpu(), slots_dev);
      ids[fused] = to_host(gpu(), ids_dev);
    }
    const std::string context = fmt::format("n_tokens={}", n_tokens);
    EXPECT_EQ(ids[1], ids[0]) << context << ": choices";
    EXPECT_TRUE(same_bits(slots[1], slots[0])) << context << ": slots";
    auto kernels = [&](bool prepare, bool prepared) {
      return kernel_list(kernels_for([&](cuda::OpLaunches& ops) {
        MoeRouteOp r = route;
        r.prepare_experts_input = prepare;
        MoeOp m = moe;
        m.input_prepared = prepared;
        ops.moe_route(r);
        ops.moe(m);
      }));
    };
    EXPECT_EQ(kernels(true, true),
              "router_route_kernel expert_gate_up_rows quantize_q8_kernel expert_down_rows")
        << context;
    EXPECT_EQ(kernels(false, true),
              "router_route_kernel quantize_q8_kernel expert_gate_up_rows quantize_q8_kernel "
              "expert_down_rows")
        << context;
  }
}

// A rank given only the tokens routed to its experts (a run over ranks) computes them with the
// kernels the whole step would choose (MoeOp::step_tokens), so its slots are the bits one machine
// gets: here a step of 20 tokens (tiles on the GPU) and the rank's 7 (rows without step_tokens).
TEST_F(CudaBackendTest, MoeOnARanksTokensGivesTheWholeStepsBits) {
  const int64_t dim = 256, ffn = 512, n_expert = 4, K = 2, step = 20;
  const std::vector<int32_t> local_index = {-1, 0, -1, -1};  // the rank holds expert 1
  const std::vector<uint8_t> gate = make_weights(DType::Q4_K, ffn, dim, 8101, 0.0625f);
  const std::vector<uint8_t> up = make_weights(DType::Q4_K, ffn, dim, 8102, 0.0625f);
  const std::vector<uint8_t> down = make_weights(DType::Q6_K, dim, ffn, 8103, 0.044f);
  const auto gate_dev = to_device(gpu(), gate), up_dev = to_device(gpu(), up);
  const auto down_dev = to_device(gpu(), down);
  const auto local_dev = to_device(gpu(), local_index);
  std::vector<int32_t> ids(size_t(step * K));
  for (size_t s = 0; s < ids.size(); ++s) ids[s] = int32_t((s * 5 + s / 3) % n_expert);
  const std::vector<float> x = gaussian(size_t(step * dim), 8104);
  std::vector<int32_t> mine;  // the tokens routed to expert 1, in order
  for (int64_t t = 0; t < step; ++t)
    if (ids[size_t(t * K)] == 1 || ids[size_t(t * K + 1)] == 1) mine.push_back(int32_t(t));
  ASSERT_GE(mine.size(), 2u);
  ASSERT_LT(mine.size(), 16u);  // fewer than the GPU's tiles take
  std::vector<int32_t> mine_ids;
  std::vector<float> mine_x;
  for (int32_t t : mine) {
    mine_ids.insert(mine_ids.end(), ids.begin() + t * K, ids.begin() + (t + 1) * K);
    mine_x.insert(mine_x.end(), x.begin() + t * dim, x.begin() + (t + 1) * dim);
  }
  auto slots_of = [&](const std::vector<float>& input, const std::vector<int32_t>& routing,
                      int64_t step_tokens) {
    const int64_t n = int64_t(input.size()) / dim;
    const auto x_dev = to_device(gpu(), input);
    const auto ids_dev = to_device(gpu(), routing);
    const auto slots_dev = poisoned(gpu(), size_t(n * K * dim));
    gpu().moe({.input = x_dev.data(),
               .gate = weight_view(DType::Q4_K, gate_dev.data(), ffn, dim, 1),
               .up = weight_view(DType::Q4_K, up_dev.data(), ffn, dim, 1),
               .down = weight_view(DType::Q6_K, down_dev.data(), dim, ffn, 1),
               .expert_ids = ids_dev.data(),
               .local_index = local_dev.data(),
               .n_expert = n_expert,
               .n_tokens = n,
               .top_k = K,
               .dim = dim,
               .ffn_dims = ffn,
               .slots = slots_dev.data(),
               .kernels = KernelChoice::ByTokenCount,
               .step_tokens = step_tokens,
               .activations = ActivationBits::Eight});
    return to_host(gpu(), slots_dev);
  };
  const std::vector<float> whole = slots_of(x, ids, 0);
  const std::vector<float> given = slots_of(mine_x, mine_ids, step);
  const std::vector<float> alone = slots_of(mine_x, mine_ids, 0);
  size_t compared = 0, alone_differs = 0;
  for (size_t i = 0; i < mine.size(); ++i)
    for (int64_t j = 0; j < K; ++j) {
      if (mine_ids[i * K + size_t(j)] != 1) continue;
      const float* a = whole.data() + (mine[i] * K + j) * dim;
      const float* b = given.data() + (int64_t(i) * K + j) * dim;
      const float* c = alone.data() + (int64_t(i) * K + j) * dim;
      for (int64_t d = 0; d < dim; ++d, ++compared) {
        ASSERT_EQ(std::bit_cast<uint32_t>(a[d]), std::bit_cast<uint32_t>(b[d]))
            << "token " << mine[i] << " slot " << j << " element " << d;
        alone_differs += a[d] != c[d];
      }
    }
  EXPECT_EQ(compared, size_t(dim) * std::count(mine_ids.begin(), mine_ids.end(), 1));
  // On the GPU, 7 tokens alone take rows and 8-bit activations: other bits, which is the point.
  if (!is_standin(gpu())) {
    EXPECT_GT(alone_differs, 0u);
  }
}

// Both sum weight · slot over k in routing order from 0, one f32 multiply and one add per term,
// each rounded (the GPU with __fmul_rn/__fadd_rn, the CPU without contraction): the same bits.
TEST_F(CudaBackendTest, MoeReduceIsExact) {
  uint32_t seed = 6000;
  for (int64_t n_tokens : {1, 40}) {
    for (int64_t top_k : {1, 3, 8}) {
      const int64_t dim = 256;
      const std::vector<float> slots = gaussian(size_t(n_tokens * top_k * dim), ++seed);
      const std::vector<float> weights = gaussian(size_t(n_tokens * top_k), ++seed);
      const auto slots_dev = to_device(gpu(), slots), weights_dev = to_device(gpu(), weights);
      const auto out_dev = poisoned(gpu(), size_t(n_tokens * dim));
      std::vector<float> out_cpu(size_t(n_tokens * dim), poison_value());
      gpu().moe_reduce({.slots = slots_dev.data(),
                        .weights = weights_dev.data(),
                        .n_tokens = n_tokens,
                        .top_k = top_k,
                        .dim = dim,
                        .output = out_dev.data()});
      cpu_.moe_reduce({.slots = slots.data(),
                       .weights = weights.data(),
                       .n_tokens = n_tokens,
                       .top_k = top_k,
                       .dim = dim,
                       .output = out_cpu.data()});
      EXPECT_TRUE(same_bits(to_host(gpu(), out_dev), out_cpu))
          << "n_tokens=" << n_tokens << " top_k=" << top_k;
    }
  }
}

// The fused residual add (MoeReduceOp::residual, ::shared; core/backend.h): the GPU's one kernel
// gives the CPU's bits, which are those of moe_reduce, add, add (tests/cpu/fused_ops_test.cpp).
TEST_F(CudaBackendTest, MoeReduceFusedResidualAddIsExact) {
  uint32_t seed = 6100;
  for (int64_t n_tokens : {1, 40}) {
    for (bool with_shared : {false, true}) {
      const int64_t top_k = 6, dim = 256;
      const size_t n = size_t(n_tokens * dim);
      const std::vector<float> slots = gaussian(size_t(n_tokens * top_k * dim), ++seed);
      const std::vector<float> weights = gaussian(size_t(n_tokens * top_k), ++seed);
      const std::vector<float> shared = gaussian(n, ++seed), x0 = gaussian(n, ++seed);
      const auto slots_dev = to_device(gpu(), slots), weights_dev = to_device(gpu(), weights);
      const auto shared_dev = to_device(gpu(), shared);
      auto x_dev = to_device(gpu(), x0);
      const auto out_dev = poisoned(gpu(), n);
      std::vector<float> out_cpu(n, poison_value()), x_cpu = x0;
      gpu().moe_reduce({.slots = slots_dev.data(),
                        .weights = weights_dev.data(),
                        .n_tokens = n_tokens,
                        .top_k = top_k,
                        .dim = dim,
                        .output = out_dev.data(),
                        .residual = x_dev.data(),
                        .shared = with_shared ? shared_dev.data() : nullptr});
      cpu_.moe_reduce({.slots = slots.data(),
                       .weights = weights.data(),
                       .n_tokens = n_tokens,
                       .top_k = top_k,
                       .dim = dim,
                       .output = out_cpu.data(),
                       .residual = x_cpu.data(),
                       .shared = with_shared ? shared.data() : nullptr});
      EXPECT_TRUE(same_bits(to_host(gpu(), out_dev), out_cpu)) << "n_tokens=" << n_tokens;
      EXPECT_TRUE(same_bits(to_host(gpu(), x_dev), x_cpu))
          << "n_tokens=" << n_tokens << (with_shared ? " shared" : "");
    }
  }
}

// The next layer's norm fused into the reduce (MoeReduceOp::norm_weight) gives the bits of the
// reduce, then rms_norm, on the same device: the sums and the residual as above, the norm as the
// norm kernel's (the same block steps).
TEST_F(CudaBackendTest, MoeReduceFusedNextNormIsTheSequence) {
  uint32_t seed = 6150;
  for (int64_t n_tokens : {1, 40}) {
    const int64_t top_k = 6, dim = 2048;
    const size_t n = size_t(n_tokens * dim);
    const auto slots_dev = to_device(gpu(), gaussian(size_t(n_tokens * top_k * dim), ++seed));
    const auto weights_dev = to_device(gpu(), gaussian(size_t(n_tokens * top_k), ++seed));
    const auto shared_dev = to_device(gpu(), gaussian(n, ++seed));
    const auto norm_dev = to_device(gpu(), gaussian(size_t(dim), ++seed));
    const std::vector<float> x0 = gaussian(n, ++seed);
    std::vector<float> x[2], h[2];
    for (bool fused : {false, true}) {
      auto x_dev = to_device(gpu(), x0);
      const auto out_dev = poisoned(gpu(), n), h_dev = poisoned(gpu(), n);
      MoeReduceOp op{.slots = slots_dev.data(),
                     .weights = weights_dev.data(),
                     .n_tokens = n_tokens,
                     .top_k = top_k,
                     .dim = dim,
                     .output = out_dev.data(),
                     .residual = x_dev.data(),
                     .shared = shared_dev.data()};
      if (fused) {
        op.norm_weight = norm_dev.data(), op.norm_eps = 1e-6f, op.norm_output = h_dev.data();
        gpu().moe_reduce(op);
      } else {
        gpu().moe_reduce(op);
        gpu().rms_norm({.input = x_dev.data(),
                        .weight = norm_dev.data(),
                        .output = h_dev.data(),
                        .n_rows = n_tokens,
                        .dim = dim,
                        .input_stride = dim,
                        .output_stride = dim,
                        .eps = 1e-6f});
      }
      x[fused] = to_host(gpu(), x_dev);
      h[fused] = to_host(gpu(), h_dev);
    }
    const std::string kernels = kernel_list(kernels_for([&](cuda::OpLaunches& ops) {
      ops.moe_reduce({.slots = slots_dev.data(),
                      .weights = weights_dev.data(),
                      .n_tokens = n_tokens,
                      .top_k = top_k,
                      .dim = dim,
                      .output = nullptr,
                      .residual = nullptr,
                      .norm_weight = norm_dev.data(),
                      .norm_eps = 1e-6f,
                      .norm_output = nullptr});
    }));
    EXPECT_EQ(kernels, "reduce_norm_kernel");
    EXPECT_TRUE(same_bits(x[1], x[0])) << "n_tokens=" << n_tokens << ": the residual";
    EXPECT_TRUE(same_bits(h[1], h[0])) << "n_tokens=" << n_tokens << ": the next layer's input";
    EXPECT_FALSE(same_bits(h[1], x[1])) << "the norm was not applied";
  }
}

// The fused latent store (q LoRA's norm, the latent's norm, rope and store in one launch) gives
// the CPU's sequence's bits, in the q LoRA rows, the latent rows and the cache: a prompt chunk
// beside another sequence's token, a decode token past the end of a ring cache; plain rope, YaRN
// and NeoX.
TEST_F(CudaBackendTest, LatentStoreFusedIsExact) {
  uint32_t seed = 6200;
  const int64_t lora = 512, rope_dims = 64, row = lora + rope_dims, n_seq = 2, n_ctx = 16;
  const RopeParams yarn{.rope_dims = rope_dims,
                        .freq_base = 10000.0f,
                        .freq_scale = 0.025f,
                        .ext_factor = 1.0f,
                        .original_ctx = 4096};
  const RopeParams neox{.rope_dims = rope_dims, .neox = true};
  struct Step {
    std::vector<int32_t> positions, seq_ids;
    bool ring;
  };
  const Step steps[] = {{{3, 4, 5, 6, 9}, {1, 1, 1, 1, 0}, false}, {{21}, {1}, true}};
  for (const RopeParams& rope : {RopeParams{.rope_dims = rope_dims}, yarn, neox}) {
    for (const Step& step : steps) {
      const std::vector<int32_t>& positions = step.positions;
      const std::vector<int32_t>& seq_ids = step.seq_ids;
      const int64_t n_tokens = int64_t(positions.size());
      const std::vector<float> rows = gaussian(size_t(n_tokens * row), ++seed);
      const std::vector<float> norm_weight = gaussian(size_t(lora), ++seed);
      const std::vector<float> cache0 = gaussian(size_t(n_seq * n_ctx * row), ++seed);
      // q LoRA's rows (DeepSeek-V3), normed in the same launch.
      const int64_t q_lora = 1536;
      const std::vector<float> q_rows = gaussian(size_t(n_tokens * q_lora), ++seed);
      const std::vector<float> q_norm = gaussian(size_t(q_lora), ++seed);
      auto q_rows_dev = to_device(gpu(), q_rows);
      const auto q_norm_dev = to_device(gpu(), q_norm);
      std::vector<float> q_rows_cpu = q_rows;
      auto rows_dev = to_device(gpu(), rows), cache_dev = to_device(gpu(), cache0);
      const auto weight_dev = to_device(gpu(), norm_weight);
      const auto positions_dev = to_device(gpu(), positions), seq_dev = to_device(gpu(), seq_ids);
      const KvLayerView shape{.n_seq = n_seq,
                              .n_ctx = n_ctx,
                              .kv_lora_rank = lora,
                              .rope_dims = rope_dims,
                              .ring = step.ring};
      KvLayerView on_gpu = shape, on_cpu = shape;
      on_gpu.data = cache_dev.data();
      std::vector<float> rows_cpu = rows, cache_cpu = cache0;
      on_cpu.data = cache_cpu.data();
      gpu().store_latent({.rows = rows_dev.data(),
                          .norm_weight = weight_dev.data(),
                          .norm_dims = lora,
                          .eps = 1e-6f,
                          .rope = rope,
                          .cache = on_gpu,
                          .positions = positions_dev.data(),
                          .seq_ids = seq_dev.data(),
                          .n_tokens = n_tokens,
                          .query_lora = q_rows_dev.data(),
                          .query_lora_norm = q_norm_dev.data(),
                          .query_lora_dims = q_lora});
      cpu_.store_latent({.rows = rows_cpu.data(),
                         .norm_weight = norm_weight.data(),
                         .norm_dims = lora,
                         .eps = 1e-6f,
                         .rope = rope,
                         .cache = on_cpu,
                         .positions = positions.data(),
                         .seq_ids = seq_ids.data(),
                         .n_tokens = n_tokens,
                         .query_lora = q_rows_cpu.data(),
                         .query_lora_norm = q_norm.data(),
                         .query_lora_dims = q_lora});
      const std::string where = "n_tokens=" + std::to_string(n_tokens) +
                                " ext_factor=" + std::to_string(rope.ext_factor) +
                                (rope.neox ? " neox" : "");
      EXPECT_TRUE(same_bits(to_host(gpu(), q_rows_dev), q_rows_cpu)) << where;
      EXPECT_TRUE(same_bits(to_host(gpu(), rows_dev), rows_cpu)) << where;
      EXPECT_TRUE(same_bits(to_host(gpu(), cache_dev), cache_cpu)) << where;
    }
  }
}

// Copies of experts: the GPU's pick (one thread runs core/replica_choice.h's rule) gives each
// shard the CPU's step index, on one-token and prompt-sized routings, with and without a busy
// layer device.
TEST_F(CudaBackendTest, PickReplicasMatchesCpu) {
  std::mt19937 rng(6100);
  const int32_t n_expert = 256, n_shards = 8, max_holders = 3, k = 8;
  std::vector<int32_t> holders(size_t(n_expert * max_holders), -1);
  for (int32_t e = 0; e < n_expert; ++e) {
    const int32_t home = e * n_shards / n_expert;
    holders[size_t(e * max_holders)] = home;
    if (e % 3) holders[size_t(e * max_holders + 1)] = (home + 1 + e % 5) % n_shards;
    if (e % 7 == 0) holders[size_t(e * max_holders + 2)] = (home + 6) % n_shards;
  }
  const auto holders_dev = to_device(gpu(), holders);
  for (int64_t n_tokens : {1, 4, 512}) {
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::vector<int32_t> all(size_t(n_expert), 0);
      for (int32_t e = 0; e < n_expert; ++e) all[size_t(e)] = e;
      std::shuffle(all.begin(), all.end(), rng);
      ids.insert(ids.end(), all.begin(), all.begin() + k);
    }
    const auto ids_dev = to_device(gpu(), ids);
    for (int32_t busy : {-1, 2}) {
      for (int32_t shard = 0; shard < n_shards; ++shard) {
        std::vector<int32_t> local(size_t(n_expert), -1);
        int32_t held = 0;
        for (int32_t e = 0; e < n_expert; ++e)
          for (int32_t h = 0; h < max_holders; ++h)
            if (holders[size_t(e * max_holders + h)] == shard) local[size_t(e)] = held++;
        const auto local_dev = to_device(gpu(), local);
        const auto step_dev = to_device(gpu(), std::vector<int32_t>(size_t(n_expert), 99));
        std::vector<int32_t> step_cpu(size_t(n_expert), 99);
        ReplicaPickOp op{.expert_ids = ids.data(), .n_slots = int64_t(ids.size()),
                         .holders = holders.data(), .max_holders = max_holders,
                         .n_expert = n_expert, .shard = shard, .busy_shard = busy,
                         .busy_load = 1, .local_index = local.data(),
                         .step_local_index = step_cpu.data()};
        cpu_.pick_replicas(op);
        op.expert_ids = ids_dev.data(), op.holders = holders_dev.data();
        op.local_index = local_dev.data(), op.step_local_index = step_dev.data();
        gpu().pick_replicas(op);
        EXPECT_EQ(to_host(gpu(), step_dev), step_cpu)
            << n_tokens << " tokens, shard " << shard << ", busy " << busy;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::test
