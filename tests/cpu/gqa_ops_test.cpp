// The CPU backend's ops for the grouped-query architectures (qwen3moe, gpt-oss, glm4moe) against
// scalar references: attention over a key/value cache with query groups, a sliding window, sinks
// and ring caches; NeoX and partial rope; top-k-then-softmax routing; product biases; per-expert
// biases with gpt-oss's clamped SwiGLU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/activations.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/ffn_activation.h"
#include "backends/moe_routing.h"
#include "backends/rope_angles.h"
#include "core/backend.h"
#include "quant/formats.h"

namespace tandem {
namespace {

std::vector<float> random_floats(size_t n, std::mt19937& rng, float low, float high) {
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// One sequence of keys and values stored through kv_store into `cache` (full or ring), then
// every token's attention; compared with the same attention in double over all positions.
struct AttentionCase {
  int64_t n_heads = 8, n_kv = 2, head_dim = 32, v_dim = 32;
  int64_t window = 0;
  bool sinks = false;
};

std::vector<double> exact_attention(const AttentionCase& c, const std::vector<float>& q,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    const std::vector<float>& sinks,
                                    const std::vector<int32_t>& pos, float scale) {
  const int64_t group = c.n_heads / c.n_kv;
  std::vector<double> out;
  for (size_t t = 0; t < pos.size(); ++t)
    for (int64_t h = 0; h < c.n_heads; ++h) {
      const int64_t g = h / group,
                    first = c.window ? std::max<int64_t>(0, pos[t] - c.window + 1) : 0;
      std::vector<double> z;
      double top = c.sinks ? sinks[size_t(h)] : -INFINITY;
      for (int64_t j = first; j <= pos[t]; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < c.head_dim; ++d)
          dot += double(q[(t * c.n_heads + h) * c.head_dim + d]) *
                 k[(j * c.n_kv + g) * c.head_dim + d];
        z.push_back(dot * scale);
        top = std::max(top, z.back());
      }
      double total = c.sinks ? std::exp(sinks[size_t(h)] - top) : 0.0;
      for (double& x : z) total += x = std::exp(x - top);
      for (int64_t d = 0; d < c.v_dim; ++d) {
        double sum = 0;
        for (int64_t j = first; j <= pos[t]; ++j)
          sum += z[size_t(j - first)] / total * v[(j * c.n_kv + g) * c.v_dim + d];
        out.push_back(sum);
      }
    }
  return out;
}

// Stores positions 0 .. n-1 in steps of `step` tokens into a cache of `rows` rows per sequence
// (a ring when fewer than n), attending each step's tokens right after storing them.
std::vector<float> run_attention(cpu::CpuBackend& cpu, const AttentionCase& c, int64_t n,
                                 int64_t step, int64_t rows, const std::vector<float>& q,
                                 const std::vector<float>& k, const std::vector<float>& v,
                                 const std::vector<float>& sinks, float scale) {
  const int64_t kd = c.n_kv * c.head_dim, vd = c.n_kv * c.v_dim, seq = 1;
  std::vector<float> cache(size_t(2 * rows * (kd + vd)), NAN);  // sequence 1 of 2
  const KvLayerView view{.data = cache.data(),
                         .n_seq = 2,
                         .n_ctx = rows,
                         .k_dims = kd,
                         .v_dims = vd,
                         .ring = rows < n};
  std::vector<float> out(size_t(n * c.n_heads * c.v_dim));
  for (int64_t first = 0; first < n; first += step) {
    const int64_t T = std::min(step, n - first);
    std::vector<int32_t> pos(static_cast<size_t>(T)), seqs(static_cast<size_t>(T), int32_t(seq));
    for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(first + t);
    cpu.kv_store({.rows = k.data() + first * kd,
                  .cache = view,
                  .positions = pos.data(),
                  .seq_ids = seqs.data(),
                  .n_tokens = T,
                  .values = v.data() + first * vd});
    cpu.attention({.q = q.data() + first * c.n_heads * c.head_dim,
                   .cache = view,
                   .positions = pos.data(),
                   .seq_ids = seqs.data(),
                   .n_tokens = T,
                   .n_heads = c.n_heads,
                   .n_kv_heads = c.n_kv,
                   .head_dim = c.head_dim,
                   .v_head_dim = c.v_dim,
                   .scale = scale,
                   .output = out.data() + first * c.n_heads * c.v_dim,
                   .window = c.window,
                   .sinks = c.sinks ? sinks.data() : nullptr});
  }
  return out;
}

TEST(GqaOps, AttentionMatchesExactSoftmaxWithGroupsWindowsSinksAndRings) {
  std::mt19937 rng(21);
  cpu::CpuBackend cpu(2);
  const int64_t n = 300;  // more than a block of keys (kAttendBlock, 256)
  for (const AttentionCase c :
       {AttentionCase{}, AttentionCase{.n_heads = 4, .n_kv = 4, .head_dim = 64, .v_dim = 48},
        AttentionCase{.window = 16, .sinks = true},
        AttentionCase{.n_heads = 20, .n_kv = 2, .head_dim = 64, .v_dim = 64, .window = 130},
        AttentionCase{.n_heads = 16, .n_kv = 1, .head_dim = 128, .v_dim = 128, .sinks = true}}) {
    const std::vector<float> q = random_floats(size_t(n * c.n_heads * c.head_dim), rng, -1, 1);
    const std::vector<float> k = random_floats(size_t(n * c.n_kv * c.head_dim), rng, -1, 1);
    const std::vector<float> v = random_floats(size_t(n * c.n_kv * c.v_dim), rng, -1, 1);
    const std::vector<float> sinks = random_floats(size_t(c.n_heads), rng, -1, 2);
    const float scale = 0.4f;
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) pos[size_t(t)] = int32_t(t);
    const std::vector<double> exact = exact_attention(c, q, k, v, sinks, pos, scale);
    const std::string what = "heads " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv) +
                             " window " + std::to_string(c.window) + (c.sinks ? " sinks" : "");
    // The whole prompt in one step with every row kept; then steps of 7 tokens, and for window
    // layers a ring of window + 7 rows.
    std::vector<std::pair<int64_t, int64_t>> runs = {{n, n}, {7, n}};
    if (c.window) runs.push_back({7, c.window + 7});
    for (const auto& [step, rows] : runs) {
      const std::vector<float> out = run_attention(cpu, c, n, step, rows, q, k, v, sinks, scale);
      for (size_t i = 0; i < out.size(); ++i)
        ASSERT_NEAR(out[i], exact[i], 3e-6)
            << what << " step " << step << " rows " << rows << " value " << i;
    }
  }
}

// A token's attention has the same bits in a prompt step and alone (batch invariance).
TEST(GqaOps, AttentionGivesATokenTheSameBitsAloneAndInAStep) {
  std::mt19937 rng(5);
  cpu::CpuBackend cpu(2);
  const AttentionCase c{
      .n_heads = 8, .n_kv = 2, .head_dim = 64, .v_dim = 64, .window = 40, .sinks = true};
  const int64_t n = 200;
  const std::vector<float> q = random_floats(size_t(n * c.n_heads * c.head_dim), rng, -1, 1);
  const std::vector<float> k = random_floats(size_t(n * c.n_kv * c.head_dim), rng, -1, 1);
  const std::vector<float> v = random_floats(size_t(n * c.n_kv * c.v_dim), rng, -1, 1);
  const std::vector<float> sinks = random_floats(size_t(c.n_heads), rng, -1, 2);
  const std::vector<float> whole = run_attention(cpu, c, n, n, n, q, k, v, sinks, 0.3f);
  const std::vector<float> one_by_one = run_attention(cpu, c, n, 1, n, q, k, v, sinks, 0.3f);
  for (size_t i = 0; i < whole.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(whole[i]), std::bit_cast<uint32_t>(one_by_one[i])) << i;
}

// NeoX rope pairs dim i with dim i + rope_dims / 2 and leaves dims past rope_dims alone (GLM
// rotates half of each head).
TEST(GqaOps, NeoxRopeTurnsPairsHalfARotationApart) {
  std::mt19937 rng(3);
  cpu::CpuBackend cpu(1);
  const int64_t n_tokens = 4, n_heads = 3, head_dim = 64;
  const std::vector<int32_t> positions = {0, 9, 1000, 70000};
  for (const int64_t rope_dims : {int64_t(64), int64_t(32)}) {
    const RopeParams p{.rope_dims = rope_dims, .freq_base = 1e6f, .neox = true};
    std::vector<float> data = random_floats(size_t(n_tokens * n_heads * head_dim), rng, -1, 1);
    const std::vector<float> before = data;
    cpu.rope({.data = data.data(),
              .positions = positions.data(),
              .n_tokens = n_tokens,
              .n_heads = n_heads,
              .head_stride = head_dim,
              .token_stride = n_heads * head_dim,
              .offset = 0,
              .params = p});
    const int64_t half = rope_dims / 2;
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t base = (t * n_heads + h) * head_dim;
        for (int64_t d = rope_dims; d < head_dim; ++d) EXPECT_EQ(data[base + d], before[base + d]);
        for (int64_t i = 0; i < half; ++i) {
          float c = 0, s = 0;
          rope_cos_sin(p, 0, 0, float(positions[t]), i, &c, &s);
          const float x0 = before[base + i], x1 = before[base + i + half];
          EXPECT_EQ(data[base + i], x0 * c - x1 * s);
          EXPECT_EQ(data[base + i + half], x0 * s + x1 * c);
        }
      }
  }
}

// gpt-oss: the k largest logits, weighted by their softmax over those k alone.
TEST(GqaOps, SoftmaxOfTopKRoutingWeighsTheChosenLogits) {
  std::mt19937 rng(8);
  const RouteParams p{.n_expert = 32, .top_k = 4, .gating = MoeGating::SoftmaxOfTopK};
  std::vector<float> probs(32), selection(32), groups(1), weights(4);
  std::vector<int32_t> ids(4);
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> logits = random_floats(32, rng, -3, 3);
    route_token(p, logits.data(), nullptr, probs.data(), selection.data(), groups.data(),
                ids.data(), weights.data());
    std::vector<int32_t> order(32);
    for (int32_t e = 0; e < 32; ++e) order[size_t(e)] = e;
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    double total = 0;
    for (int k = 0; k < 4; ++k) total += std::exp(double(logits[order[k]]) - logits[order[0]]);
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(ids[size_t(k)], order[size_t(k)]);
      EXPECT_NEAR(weights[size_t(k)], std::exp(double(logits[order[k]]) - logits[order[0]]) / total,
                  1e-6);
    }
  }
}

WeightView f32_matrix(const std::vector<float>& values, int64_t rows, int64_t cols,
                      int64_t n_mats = 1) {
  return {.type = DType::F32,
          .data = values.data(),
          .cols = cols,
          .rows = rows,
          .n_mats = n_mats,
          .row_bytes = uint64_t(cols) * 4};
}

float clamped(float gate, float up) {
  return ffn_activation(FfnActivation::SwiGluClamped, gate, up);
}

// MatmulOp::activations reaches the kernels: 8 bits are cpu::matmul's Int8 products bit for bit,
// and differ from the 16-bit ones (so the field is not ignored) by about the 8-bit rounding.
TEST(GqaOps, MatmulTakesTheActivationBitsItIsGiven) {
  std::mt19937 rng(6);
  cpu::CpuBackend cpu(2);
  const int64_t rows = 32, cols = 256;
  const std::vector<float> w = random_floats(size_t(rows * cols), rng, -1, 1);
  std::vector<BlockQ8_0> q8(size_t(rows * cols / 32));
  quant::quantize_q8_0(w.data(), q8.data(), int64_t(q8.size()));
  const WeightView view{.type = DType::Q8_0,
                        .data = q8.data(),
                        .cols = cols,
                        .rows = rows,
                        .n_mats = 1,
                        .row_bytes = uint64_t(cols / 32) * sizeof(BlockQ8_0)};
  ThreadPool pool(2);
  for (int64_t T : {1, 5, 40}) {
    const std::vector<float> x = random_floats(size_t(T * cols), rng, -1, 1);
    std::vector<float> eight(size_t(T * rows)), sixteen(size_t(T * rows)), direct(size_t(T * rows));
    cpu.matmul({.weight = view,
                .input = x.data(),
                .output = eight.data(),
                .n_tokens = T,
                .activations = ActivationBits::Eight});
    cpu.matmul({.weight = view, .input = x.data(), .output = sixteen.data(), .n_tokens = T});
    cpu::matmul({.weight_type = DType::Q8_0,
                 .weights = q8.data(),
                 .rows = rows,
                 .cols = cols,
                 .input = x.data(),
                 .n_tokens = T,
                 .output = direct.data(),
                 .precision = cpu::ActPrecision::Int8},
                pool);
    EXPECT_EQ(eight, direct) << T << " tokens";
    EXPECT_NE(eight, sixteen) << T << " tokens";
    for (size_t i = 0; i < eight.size(); ++i)
      EXPECT_NEAR(eight[i], sixteen[i], 0.05 * (1 + std::abs(sixteen[i]))) << T << " tokens, " << i;
  }
}

// A product's bias is the product and then an add, bit for bit.
TEST(GqaOps, MatmulBiasIsTheProductThenAnAdd) {
  std::mt19937 rng(4);
  cpu::CpuBackend cpu(2);
  const int64_t rows = 48, cols = 64, T = 5;
  const std::vector<float> w = random_floats(size_t(rows * cols), rng, -1, 1);
  const std::vector<float> x = random_floats(size_t(T * cols), rng, -1, 1);
  const std::vector<float> bias = random_floats(size_t(rows), rng, -1, 1);
  std::vector<float> with(size_t(T * rows)), plain(size_t(T * rows));
  cpu.matmul({.weight = f32_matrix(w, rows, cols),
              .input = x.data(),
              .output = with.data(),
              .n_tokens = T,
              .bias = bias.data()});
  cpu.matmul({.weight = f32_matrix(w, rows, cols),
              .input = x.data(),
              .output = plain.data(),
              .n_tokens = T});
  for (int64_t t = 0; t < T; ++t) cpu.add(plain.data() + t * rows, bias.data(), rows);
  EXPECT_EQ(with, plain);
}

// The MoE op with per-expert biases and the clamped SwiGLU against the sequence it stands for:
// each chosen expert's gate and up products plus their biases, the activation, the down product
// plus its bias. Gate and up weights are large enough that the clamps at ±7 are hit.
TEST(GqaOps, MoeWithExpertBiasesAndClampedSwigluMatchesTheSequence) {
  std::mt19937 rng(12);
  cpu::CpuBackend cpu(2);
  const int64_t E = 4, K = 2, T = 6, D = 64, F = 32;
  const std::vector<float> gate = random_floats(size_t(E * F * D), rng, -1.5f, 1.5f);
  const std::vector<float> up = random_floats(size_t(E * F * D), rng, -1.5f, 1.5f);
  const std::vector<float> down = random_floats(size_t(E * D * F), rng, -0.2f, 0.2f);
  const std::vector<float> gate_bias = random_floats(size_t(E * F), rng, -1, 1);
  const std::vector<float> up_bias = random_floats(size_t(E * F), rng, -1, 1);
  const std::vector<float> down_bias = random_floats(size_t(E * D), rng, -1, 1);
  const std::vector<float> x = random_floats(size_t(T * D), rng, -1, 1);
  const std::vector<int32_t> ids = {0, 3, 1, 0, 2, 3, 3, 1, 0, 2, 1, 2};
  std::vector<float> slots(size_t(T * K * D));
  cpu.moe({.input = x.data(),
           .gate = f32_matrix(gate, F, D, E),
           .up = f32_matrix(up, F, D, E),
           .down = f32_matrix(down, D, F, E),
           .expert_ids = ids.data(),
           .local_index = nullptr,
           .n_expert = E,
           .n_tokens = T,
           .top_k = K,
           .dim = D,
           .ffn_dims = F,
           .slots = slots.data(),
           .activation = FfnActivation::SwiGluClamped,
           .gate_bias = gate_bias.data(),
           .up_bias = up_bias.data(),
           .down_bias = down_bias.data()});
  int n_clamped = 0;
  for (int64_t s = 0; s < T * K; ++s) {
    const int64_t e = ids[size_t(s)], t = s / K;
    std::vector<double> act(static_cast<size_t>(F));
    for (int64_t f = 0; f < F; ++f) {
      double g = gate_bias[size_t(e * F + f)], u = up_bias[size_t(e * F + f)];
      for (int64_t d = 0; d < D; ++d) {
        g += double(gate[size_t((e * F + f) * D + d)]) * x[size_t(t * D + d)];
        u += double(up[size_t((e * F + f) * D + d)]) * x[size_t(t * D + d)];
      }
      n_clamped += g > 7 || std::abs(u) > 7;
      act[size_t(f)] = clamped(float(g), float(u));
    }
    for (int64_t d = 0; d < D; ++d) {
      double y = down_bias[size_t(e * D + d)];
      for (int64_t f = 0; f < F; ++f)
        y += double(down[size_t((e * D + d) * F + f)]) * act[size_t(f)];
      EXPECT_NEAR(slots[size_t(s * D + d)], y, 2e-3 * (1 + std::abs(y)))
          << "slot " << s << " dim " << d;
    }
  }
  EXPECT_GT(n_clamped, 0);  // the clamps were exercised
}

TEST(GqaOps, ClampedSwigluClampsGateAboveAndUpBothWays) {
  EXPECT_FLOAT_EQ(clamped(20.0f, 0.0f), clamped(7.0f, 0.0f));
  EXPECT_FLOAT_EQ(clamped(1.0f, 50.0f), clamped(1.0f, 7.0f));
  EXPECT_FLOAT_EQ(clamped(1.0f, -50.0f), clamped(1.0f, -7.0f));
  // g * sigmoid(1.702 g) * (u + 1) below the clamps; a negative gate is not clamped.
  EXPECT_NEAR(clamped(-2.0f, 0.5f), -2.0 / (1 + std::exp(3.404)) * 1.5, 1e-6);
  EXPECT_NEAR(clamped(1.0f, 2.0f), 1.0 / (1 + std::exp(-1.702)) * 3.0, 1e-6);
}

}  // namespace
}  // namespace tandem
