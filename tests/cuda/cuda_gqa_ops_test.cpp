// The CUDA backend's ops for the grouped-query architectures against the CPU backend: attention
// over a key/value cache with query groups, windows, sinks and ring caches (the keys stored by
// each backend's own kv_store); NeoX and partial rope; a product's bias; top-k-then-softmax
// routing; the MoE op with per-expert biases and the clamped SwiGLU. Without a GPU these skip (or
// run against the simulated stand-in: cuda_test_support.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cuda_test_support.h"

namespace tandem::test {
namespace {

std::vector<float> uniform(size_t n, uint32_t seed, float low = -1, float high = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Keys and values of positions 0 .. n-1 stored in steps of `step` into a cache of `rows` rows
// (a ring when fewer than n) on `be`, each step attended right after; the outputs of all tokens.
std::vector<float> attention_on(Backend& be, const AttentionOp& shape, int64_t n, int64_t step,
                                int64_t rows, const std::vector<float>& q,
                                const std::vector<float>& k, const std::vector<float>& v,
                                const std::vector<float>& sinks) {
  const int64_t kd = shape.n_kv_heads * shape.head_dim, vd = shape.n_kv_heads * shape.v_head_dim;
  const int64_t H = shape.n_heads;
  const auto cache = poisoned(be, size_t(2 * rows * (kd + vd)));
  const auto q_dev = to_device(be, q), k_dev = to_device(be, k), v_dev = to_device(be, v);
  const auto sinks_dev = to_device(be, sinks);
  const auto out = poisoned(be, size_t(n * H * shape.v_head_dim));
  const KvLayerView view{.data = cache.data(),
                         .n_seq = 2,
                         .n_ctx = rows,
                         .k_dims = kd,
                         .v_dims = vd,
                         .ring = rows < n};
  for (int64_t first = 0; first < n; first += step) {
    const int64_t T = std::min(step, n - first);
    std::vector<int32_t> pos(static_cast<size_t>(T)), seqs(static_cast<size_t>(T), 1);
    for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(first + t);
    const auto pos_dev = to_device(be, pos), seq_dev = to_device(be, seqs);
    be.kv_store({.rows = k_dev.data() + first * kd,
                 .cache = view,
                 .positions = pos_dev.data(),
                 .seq_ids = seq_dev.data(),
                 .n_tokens = T,
                 .values = v_dev.data() + first * vd});
    AttentionOp op = shape;
    op.q = q_dev.data() + first * H * shape.head_dim;
    op.cache = view;
    op.positions = pos_dev.data(), op.seq_ids = seq_dev.data(), op.n_tokens = T;
    op.output = out.data() + first * H * shape.v_head_dim;
    op.sinks = shape.sinks ? sinks_dev.data() : nullptr;
    be.attention(op);
    be.synchronize();  // the step's position arrays go out of scope
  }
  return to_host(be, out);
}

TEST_F(CudaBackendTest, GqaAttentionMatchesCpuWithGroupsWindowsSinksAndRings) {
  struct Case {
    int64_t heads, kv, hd, vd, window;
    bool sinks;
  };
  const float dummy = 0;
  const Case cases[] = {{8, 2, 64, 64, 0, false},
                        {64, 8, 64, 64, 16, true},
                        {32, 4, 128, 128, 0, false},
                        {4, 4, 256, 256, 40, true}};
  uint32_t seed = 900;
  const int64_t n = 150;
  for (const Case& c : cases) {
    const std::vector<float> q = uniform(size_t(n * c.heads * c.hd), ++seed);
    const std::vector<float> k = uniform(size_t(n * c.kv * c.hd), ++seed);
    const std::vector<float> v = uniform(size_t(n * c.kv * c.vd), ++seed);
    const std::vector<float> sinks = uniform(size_t(c.heads), ++seed, -1, 2);
    const AttentionOp shape{.n_heads = c.heads,
                            .n_kv_heads = c.kv,
                            .head_dim = c.hd,
                            .v_head_dim = c.vd,
                            .scale = 0.3f,
                            .window = c.window,
                            .sinks = c.sinks ? &dummy : nullptr};
    std::vector<std::pair<int64_t, int64_t>> runs = {{n, n}, {7, n}};
    if (c.window) runs.push_back({7, c.window + 7});
    for (const auto& [step, rows] : runs) {
      const std::vector<float> want = attention_on(cpu_, shape, n, step, rows, q, k, v, sinks);
      const std::vector<float> got = attention_on(gpu(), shape, n, step, rows, q, k, v, sinks);
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, double(std::fabs(got[i] - want[i])));
      // A convex combination of values in [-1, 1]: the two orders of summing agree closely.
      EXPECT_LT(worst, 2e-5) << fmt::format(
          "heads {}/{} dims {}/{} window {} sinks {} step {} rows {}", c.heads, c.kv, c.hd, c.vd,
          c.window, c.sinks, step, rows);
    }
  }
}

TEST_F(CudaBackendTest, NeoxAndPartialRopeMatchCpu) {
  const int64_t T = 5, H = 6, hd = 128;
  const std::vector<int32_t> positions = {0, 3, 700, 4097, 90000};
  const auto pos_dev = to_device(gpu(), positions);
  for (const RopeParams p : {RopeParams{.rope_dims = 128, .freq_base = 1e6f, .neox = true},
                             RopeParams{.rope_dims = 64, .freq_base = 1e6f, .neox = true},
                             RopeParams{.rope_dims = 128,
                             .freq_base = 150000.0f,
                             .neox = true,
                             .freq_scale = 1.0f / 32,
                             .ext_factor = 1.0f,
                             .original_ctx = 4096}}) {
    std::vector<float> x = uniform(size_t(T * H * hd), 77);
    const auto x_dev = to_device(gpu(), x);
    const RopeOp op{.positions = positions.data(),
                    .n_tokens = T,
                    .n_heads = H,
                    .head_stride = hd,
                    .token_stride = H * hd,
                    .offset = 0,
                    .params = p};
    RopeOp on_gpu = op;
    on_gpu.data = x_dev.data(), on_gpu.positions = pos_dev.data();
    gpu().rope(on_gpu);
    RopeOp on_cpu = op;
    on_cpu.data = x.data();
    cpu_.rope(on_cpu);
    const std::vector<float> got = to_host(gpu(), x_dev);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(got[i], x[i], 2e-6) << "rope dims " << p.rope_dims << " value " << i;
  }
}

TEST_F(CudaBackendTest, MatmulBiasIsAddedExactlyAfterTheProduct) {
  const int64_t rows = 96, cols = 256, T = 3;
  const std::vector<uint8_t> w = make_weights(DType::Q8_0, rows, cols, 31, 0.05f);
  const std::vector<float> x = gaussian(size_t(T * cols), 32), bias = uniform(size_t(rows), 33);
  const auto w_dev = to_device(gpu(), w);
  const auto x_dev = to_device(gpu(), x), bias_dev = to_device(gpu(), bias);
  const auto plain = poisoned(gpu(), size_t(T * rows)), with = poisoned(gpu(), size_t(T * rows));
  const WeightView view = weight_view(DType::Q8_0, w_dev.data(), rows, cols);
  gpu().matmul({.weight = view, .input = x_dev.data(), .output = plain.data(), .n_tokens = T});
  gpu().matmul({.weight = view,
                .input = x_dev.data(),
                .output = with.data(),
                .n_tokens = T,
                .bias = bias_dev.data()});
  const std::vector<float> a = to_host(gpu(), plain), b = to_host(gpu(), with);
  for (int64_t i = 0; i < T * rows; ++i)
    ASSERT_EQ(b[size_t(i)], a[size_t(i)] + bias[size_t(i % rows)]) << i;
}

TEST_F(CudaBackendTest, SoftmaxOfTopKRoutingChoosesTheCpusExperts) {
  const int64_t T = 7, E = 32, K = 4;
  std::vector<float> logits = uniform(size_t(T * E), 41, -4, 4);
  const auto logits_dev = to_device(gpu(), logits);
  const auto ids_dev = to_device(gpu(), std::vector<int32_t>(size_t(T * K), -1));
  const auto w_dev = poisoned(gpu(), size_t(T * K));
  std::vector<int32_t> ids(size_t(T * K));
  std::vector<float> weights(size_t(T * K));
  const MoeRouteOp op{.n_tokens = T,
                      .n_expert = E,
                      .top_k = K,
                      .gating = MoeGating::SoftmaxOfTopK,
                      .n_groups = 1,
                      .n_groups_used = 1,
                      .normalize = false,
                      .scale = 1.0f};
  MoeRouteOp on_gpu = op, on_cpu = op;
  on_gpu.logits = logits_dev.data(), on_gpu.expert_ids = ids_dev.data(),
  on_gpu.expert_weights = w_dev.data();
  on_cpu.logits = logits.data(), on_cpu.expert_ids = ids.data(),
  on_cpu.expert_weights = weights.data();
  gpu().moe_route(on_gpu);
  cpu_.moe_route(on_cpu);
  EXPECT_EQ(to_host(gpu(), ids_dev), ids);
  const std::vector<float> got = to_host(gpu(), w_dev);
  for (size_t i = 0; i < weights.size(); ++i) EXPECT_NEAR(got[i], weights[i], 1e-6) << i;
}

// F32 experts, so that the CPU and GPU products differ only in their order of summing.
TEST_F(CudaBackendTest, MoeWithExpertBiasesAndClampedSwigluMatchesCpu) {
  const int64_t E = 4, K = 2, D = 64, F = 96;
  const std::vector<float> gate = uniform(size_t(E * F * D), 51, -0.6f, 0.6f);
  const std::vector<float> up = uniform(size_t(E * F * D), 52, -0.6f, 0.6f);
  const std::vector<float> down = uniform(size_t(E * D * F), 53, -0.1f, 0.1f);
  const std::vector<float> gate_bias = uniform(size_t(E * F), 54),
                           up_bias = uniform(size_t(E * F), 55);
  const std::vector<float> down_bias = uniform(size_t(E * D), 56);
  const auto gate_dev = to_device(gpu(), gate), up_dev = to_device(gpu(), up);
  const auto down_dev = to_device(gpu(), down);
  const auto gb = to_device(gpu(), gate_bias), ub = to_device(gpu(), up_bias),
             db = to_device(gpu(), down_bias);
  for (int64_t T : {1, 3, 70}) {
    const std::vector<float> x = uniform(size_t(T * D), 57);
    std::vector<int32_t> ids(size_t(T * K));
    for (int64_t s = 0; s < T * K; ++s) ids[size_t(s)] = int32_t((s * 7 + s / K) % E);
    const auto x_dev = to_device(gpu(), x);
    const auto ids_dev = to_device(gpu(), ids);
    for (KernelChoice choice : kChoices) {
      const auto slots_dev = poisoned(gpu(), size_t(T * K * D));
      std::vector<float> slots(size_t(T * K * D), poison_value());
      const MoeOp op{.n_expert = E,
                     .n_tokens = T,
                     .top_k = K,
                     .dim = D,
                     .ffn_dims = F,
                     .kernels = choice,
                     .activation = FfnActivation::SwiGluClamped};
      MoeOp on_gpu = op, on_cpu = op;
      on_gpu.input = x_dev.data(), on_cpu.input = x.data();
      on_gpu.gate = weight_view(DType::F32, gate_dev.data(), F, D, E);
      on_gpu.up = weight_view(DType::F32, up_dev.data(), F, D, E);
      on_gpu.down = weight_view(DType::F32, down_dev.data(), D, F, E);
      on_cpu.gate = weight_view(DType::F32, gate.data(), F, D, E);
      on_cpu.up = weight_view(DType::F32, up.data(), F, D, E);
      on_cpu.down = weight_view(DType::F32, down.data(), D, F, E);
      on_gpu.expert_ids = ids_dev.data(), on_cpu.expert_ids = ids.data();
      on_gpu.slots = slots_dev.data(), on_cpu.slots = slots.data();
      on_gpu.gate_bias = gb.data(), on_gpu.up_bias = ub.data(), on_gpu.down_bias = db.data();
      on_cpu.gate_bias = gate_bias.data(), on_cpu.up_bias = up_bias.data();
      on_cpu.down_bias = down_bias.data();
      gpu().moe(on_gpu);
      cpu_.moe(on_cpu);
      const std::vector<float> got = to_host(gpu(), slots_dev);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], slots[i], 1e-4 * (1 + std::fabs(slots[i])))
            << "tokens " << T << " " << choice_name(choice) << " value " << i;
    }
  }
}

}  // namespace
}  // namespace tandem::test
