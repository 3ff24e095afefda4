// core/backend.h's fused ops give the bits of the sequences they replace (issue 27: GPUs launch
// them as one kernel; the CPU runs the sequence, or for MoeOp::shared and MatmulOp::second the
// same products in one parallel job, and these tests pin down that definition): a
// MoE layer's slot sum with the residual add and the shared experts' add (MoeReduceOp::residual,
// ::shared) against moe_reduce, add, add; an MLA latent made ready and stored with q LoRA's norm
// (LatentStoreOp) against rms_norm, rms_norm, rope, kv_store; MLA with its queries' rope
// (MlaAttentionOp::rotate_queries) against rope, mla_attention; the residual add in front of a norm
// (RmsNormOp::residual) against add, rms_norm; two products over one input (MatmulOp::second)
// against two matmuls; routing with the router's product in front (MoeRouteOp::router) against
// matmul, moe_route; the next layer's norm after the reduce (MoeReduceOp::norm_weight) against
// moe_reduce, rms_norm; the shared experts carried by the routed experts' op (MoeOp::shared)
// against the dense-FFN moe, its one-slot reduce and the routed moe.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "test_weights.h"

namespace tandem {
namespace {

// Magnitudes that differ from seed to seed, so that the adds round.
std::vector<float> gaussian(size_t n, uint32_t seed) {
  return test::gaussian(n, seed, 1.0f + float(seed % 5) * 100.0f);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(FusedOps, MoeReduceWithTheResidualAndSharedAddsIsTheSequence) {
  cpu::CpuBackend cpu(2);
  uint32_t seed = 70;
  for (int64_t n_tokens : {1, 3, 40}) {
    for (int64_t top_k : {1, 6, 8}) {
      for (bool with_shared : {false, true}) {
        const int64_t dim = 320;
        const size_t n = size_t(n_tokens * dim);
        const std::vector<float> slots = gaussian(size_t(n_tokens * top_k * dim), ++seed);
        const std::vector<float> weights = gaussian(size_t(n_tokens * top_k), ++seed);
        const std::vector<float> shared = gaussian(n, ++seed), x0 = gaussian(n, ++seed);
        const MoeReduceOp reduce{.slots = slots.data(),
                                 .weights = weights.data(),
                                 .n_tokens = n_tokens,
                                 .top_k = top_k,
                                 .dim = dim,
                                 .output = nullptr};
        std::vector<float> out_seq(n), x_seq = x0;
        MoeReduceOp plain = reduce;
        plain.output = out_seq.data();
        cpu.moe_reduce(plain);
        cpu.add(x_seq.data(), out_seq.data(), n_tokens * dim);
        if (with_shared) cpu.add(x_seq.data(), shared.data(), n_tokens * dim);

        std::vector<float> out_fused(n), x_fused = x0;
        MoeReduceOp fused = reduce;
        fused.output = out_fused.data();
        fused.residual = x_fused.data();
        fused.shared = with_shared ? shared.data() : nullptr;
        cpu.moe_reduce(fused);
        const std::string where = "n_tokens=" + std::to_string(n_tokens) +
                                  " top_k=" + std::to_string(top_k) +
                                  (with_shared ? " shared" : "");
        EXPECT_TRUE(same_bits(out_fused, out_seq)) << where;
        EXPECT_TRUE(same_bits(x_fused, x_seq)) << where;
        // Not a test that cannot fail: the adds in the other order round differently.
        if (with_shared) {
          std::vector<float> x_other = x0;
          cpu.add(x_other.data(), shared.data(), n_tokens * dim);
          cpu.add(x_other.data(), out_seq.data(), n_tokens * dim);
          EXPECT_FALSE(same_bits(x_other, x_seq)) << where;
        }
      }
    }
  }
}

TEST(FusedOps, LatentStoreIsRmsNormRopeAndKvStore) {
  cpu::CpuBackend cpu(2);
  uint32_t seed = 90;
  const int64_t lora = 96, rope_dims = 32, row = lora + rope_dims, n_seq = 2, n_ctx = 8;
  const std::vector<int32_t> positions = {0, 1, 2, 5}, seq_ids = {1, 1, 1, 0};
  const int64_t n_tokens = int64_t(positions.size());
  RopeParams yarn{.rope_dims = rope_dims,
                  .freq_base = 10000.0f,
                  .freq_scale = 0.25f,
                  .ext_factor = 1.0f,
                  .original_ctx = 4096};
  const RopeParams neox{.rope_dims = rope_dims, .neox = true};
  for (const RopeParams& rope : {RopeParams{.rope_dims = rope_dims}, yarn, neox}) {
    const std::vector<float> rows0 = gaussian(size_t(n_tokens * row), ++seed);
    const std::vector<float> norm_weight = gaussian(size_t(lora), ++seed);
    const std::vector<float> cache0 = gaussian(size_t(n_seq * n_ctx * row), ++seed);
    const int64_t q_lora = 72;
    const std::vector<float> q_lora0 = gaussian(size_t(n_tokens * q_lora), ++seed);
    const std::vector<float> q_lora_norm = gaussian(size_t(q_lora), ++seed);
    auto view_of = [&](std::vector<float>& cache) {
      return KvLayerView{.data = cache.data(),
                         .n_seq = n_seq,
                         .n_ctx = n_ctx,
                         .kv_lora_rank = lora,
                         .rope_dims = rope_dims};
    };

    std::vector<float> rows_seq = rows0, cache_seq = cache0, q_lora_seq = q_lora0;
    cpu.rms_norm({.input = q_lora_seq.data(),
                  .weight = q_lora_norm.data(),
                  .output = q_lora_seq.data(),
                  .n_rows = n_tokens,
                  .dim = q_lora,
                  .input_stride = q_lora,
                  .output_stride = q_lora,
                  .eps = 1e-6f});
    cpu.rms_norm({.input = rows_seq.data(),
                  .weight = norm_weight.data(),
                  .output = rows_seq.data(),
                  .n_rows = n_tokens,
                  .dim = lora,
                  .input_stride = row,
                  .output_stride = row,
                  .eps = 1e-6f});
    cpu.rope({.data = rows_seq.data(),
              .positions = positions.data(),
              .n_tokens = n_tokens,
              .n_heads = 1,
              .head_stride = row,
              .token_stride = row,
              .offset = lora,
              .params = rope});
    cpu.kv_store({.rows = rows_seq.data(),
                  .cache = view_of(cache_seq),
                  .positions = positions.data(),
                  .seq_ids = seq_ids.data(),
                  .n_tokens = n_tokens});

    std::vector<float> rows_fused = rows0, cache_fused = cache0, q_lora_fused = q_lora0;
    cpu.store_latent({.rows = rows_fused.data(),
                      .norm_weight = norm_weight.data(),
                      .norm_dims = lora,
                      .eps = 1e-6f,
                      .rope = rope,
                      .cache = view_of(cache_fused),
                      .positions = positions.data(),
                      .seq_ids = seq_ids.data(),
                      .n_tokens = n_tokens,
                      .query_lora = q_lora_fused.data(),
                      .query_lora_norm = q_lora_norm.data(),
                      .query_lora_dims = q_lora});
    EXPECT_TRUE(same_bits(q_lora_fused, q_lora_seq)) << "ext_factor " << rope.ext_factor;
    EXPECT_FALSE(same_bits(q_lora_fused, q_lora0)) << "q LoRA's rows were not normed";
    EXPECT_TRUE(same_bits(rows_fused, rows_seq)) << "ext_factor " << rope.ext_factor;
    EXPECT_TRUE(same_bits(cache_fused, cache_seq)) << "ext_factor " << rope.ext_factor;
    // Not a test that cannot fail: both parts of the row were changed before the store.
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* stored =
          cache_fused.data() + (int64_t(seq_ids[size_t(t)]) * n_ctx + positions[size_t(t)]) * row;
      EXPECT_NE(std::memcmp(stored, rows0.data() + t * row, size_t(lora) * sizeof(float)), 0);
      if (positions[size_t(t)] > 0) {
        EXPECT_NE(std::memcmp(stored + lora, rows0.data() + t * row + lora,
                              size_t(rope_dims) * sizeof(float)),
                  0);
      }
    }
  }
}

TEST(FusedOps, MlaAttentionRotatingItsQueriesIsRopeThenAttention) {
  cpu::CpuBackend cpu(2);
  uint32_t seed = 100;
  const int64_t lora = 64, rope_dims = 16, row = lora + rope_dims, nope = 32, v_head = 24;
  const int64_t heads = 3, q_row = nope + rope_dims, n_ctx = 8;
  const std::vector<int32_t> positions = {3, 4}, seq_ids = {0, 0};
  const int64_t n_tokens = int64_t(positions.size());
  const RopeParams yarn{.rope_dims = rope_dims,
                        .freq_base = 10000.0f,
                        .freq_scale = 0.25f,
                        .ext_factor = 1.0f,
                        .original_ctx = 4096};
  const RopeParams neox{.rope_dims = rope_dims, .neox = true};
  for (const RopeParams& rope : {RopeParams{.rope_dims = rope_dims}, yarn, neox}) {
    // Small values: scores of a few units, so every key has weight in the softmax.
    std::vector<float> cache = test::gaussian(size_t(n_ctx * row), ++seed, 0.5f);
    const std::vector<float> k_b = test::gaussian(size_t(heads * lora * nope), ++seed, 0.1f);
    const std::vector<float> v_b = test::gaussian(size_t(heads * v_head * lora), ++seed, 0.1f);
    const std::vector<float> q0 = test::gaussian(size_t(n_tokens * heads * q_row), ++seed, 0.5f);
    auto stack = [](const std::vector<float>& w, int64_t rows, int64_t cols) {
      return WeightView{.type = DType::F32,
                        .data = w.data(),
                        .cols = cols,
                        .rows = rows,
                        .n_mats = 3,
                        .row_bytes = uint64_t(cols) * sizeof(float)};
    };
    const MlaAttentionOp attend{.q = nullptr,
                                .k_b = stack(k_b, lora, nope),
                                .v_b = stack(v_b, v_head, lora),
                                .cache = {.data = cache.data(),
                                          .n_seq = 1,
                                          .n_ctx = n_ctx,
                                          .kv_lora_rank = lora,
                                          .rope_dims = rope_dims},
                                .positions = positions.data(),
                                .seq_ids = seq_ids.data(),
                                .n_tokens = n_tokens,
                                .n_heads = heads,
                                .nope_dims = nope,
                                .v_head_dims = v_head,
                                .scale = 0.1f,
                                .output = nullptr};
    std::vector<float> q_seq = q0, out_seq(size_t(n_tokens * heads * v_head));
    cpu.rope({.data = q_seq.data(),
              .positions = positions.data(),
              .n_tokens = n_tokens,
              .n_heads = heads,
              .head_stride = q_row,
              .token_stride = heads * q_row,
              .offset = nope,
              .params = rope});
    MlaAttentionOp plain = attend;
    plain.q = q_seq.data();
    plain.output = out_seq.data();
    cpu.mla_attention(plain);

    std::vector<float> q_fused = q0, out_fused(out_seq.size());
    MlaAttentionOp fused = attend;
    fused.q = q_fused.data();
    fused.output = out_fused.data();
    fused.rotate_queries = true;
    fused.rope = rope;
    cpu.mla_attention(fused);
    EXPECT_TRUE(same_bits(out_fused, out_seq)) << "ext_factor " << rope.ext_factor;
    // Not a test that cannot fail: unrotated queries score the keys differently.
    std::vector<float> q_unrotated = q0, out_unrotated(out_seq.size());
    plain.q = q_unrotated.data();
    plain.output = out_unrotated.data();
    cpu.mla_attention(plain);
    EXPECT_FALSE(same_bits(out_unrotated, out_seq)) << "ext_factor " << rope.ext_factor;
  }
}

TEST(FusedOps, RmsNormWithTheResidualAddIsAddThenRmsNorm) {
  cpu::CpuBackend cpu(2);
  uint32_t seed = 110;
  for (int64_t n_rows : {1, 7}) {
    const int64_t dim = 320;
    const size_t n = size_t(n_rows * dim);
    const std::vector<float> x0 = gaussian(n, ++seed), out = gaussian(n, ++seed);
    const std::vector<float> weight = gaussian(size_t(dim), ++seed);
    const RmsNormOp norm{.input = nullptr,
                         .weight = weight.data(),
                         .output = nullptr,
                         .n_rows = n_rows,
                         .dim = dim,
                         .input_stride = dim,
                         .output_stride = dim,
                         .eps = 1e-6f};
    std::vector<float> x_seq = x0, h_seq(n);
    cpu.add(x_seq.data(), out.data(), n_rows * dim);
    RmsNormOp plain = norm;
    plain.input = x_seq.data();
    plain.output = h_seq.data();
    cpu.rms_norm(plain);

    std::vector<float> x_fused = x0, h_fused(n);
    RmsNormOp fused = norm;
    fused.input = x_fused.data();
    fused.output = h_fused.data();
    fused.residual = x_fused.data();
    fused.add = out.data();
    cpu.rms_norm(fused);
    EXPECT_TRUE(same_bits(x_fused, x_seq)) << n_rows << " rows";
    EXPECT_TRUE(same_bits(h_fused, h_seq)) << n_rows << " rows";
    EXPECT_FALSE(same_bits(x_fused, x0)) << "the residual was not added to";
  }
}

TEST(FusedOps, MatmulWithASecondProductIsTwoMatmuls) {
  cpu::CpuBackend cpu(2);
  const int64_t cols = 512, rows = 96, second_rows = 160;
  const std::vector<uint8_t> w1 = test::make_weights(DType::Q4_K, rows, cols, 120, 0.05f);
  const std::vector<uint8_t> w2 = test::make_weights(DType::Q4_K, second_rows, cols, 121, 0.05f);
  auto view = [&](const std::vector<uint8_t>& w, int64_t n_rows) {
    return WeightView{.type = DType::Q4_K,
                      .data = w.data(),
                      .cols = cols,
                      .rows = n_rows,
                      .row_bytes = row_bytes(DType::Q4_K, uint64_t(cols))};
  };
  for (int64_t n_tokens : {1, 5, 40}) {
    for (ActivationBits bits : {ActivationBits::Sixteen, ActivationBits::Eight}) {
      const std::vector<float> x = gaussian(size_t(n_tokens * cols), 122 + uint32_t(n_tokens));
      std::vector<float> a_seq(size_t(n_tokens * rows)), b_seq(size_t(n_tokens * second_rows));
      cpu.matmul({.weight = view(w1, rows),
                  .input = x.data(),
                  .output = a_seq.data(),
                  .n_tokens = n_tokens,
                  .activations = bits});
      cpu.matmul({.weight = view(w2, second_rows),
                  .input = x.data(),
                  .output = b_seq.data(),
                  .n_tokens = n_tokens,
                  .activations = bits});
      std::vector<float> a(a_seq.size()), b(b_seq.size());
      cpu.matmul({.weight = view(w1, rows),
                  .input = x.data(),
                  .output = a.data(),
                  .n_tokens = n_tokens,
                  .activations = bits,
                  .second = view(w2, second_rows),
                  .second_output = b.data()});
      const std::string where = std::to_string(n_tokens) + " tokens, " +
                                (bits == ActivationBits::Eight ? "8" : "16") + "-bit";
      EXPECT_TRUE(same_bits(a, a_seq)) << where;
      EXPECT_TRUE(same_bits(b, b_seq)) << where;
      EXPECT_FALSE(same_bits(a, b)) << "the two products are different matrices";
    }
  }
}

TEST(FusedOps, RoutingWithTheRouterProductIsMatmulThenRoute) {
  cpu::CpuBackend cpu(2);
  const int64_t dim = 256, n_expert = 64, top_k = 6;
  const std::vector<float> router = gaussian(size_t(n_expert * dim), 130);
  const std::vector<float> router_bias = gaussian(size_t(n_expert), 131);
  const WeightView view{.type = DType::F32,
                        .data = router.data(),
                        .cols = dim,
                        .rows = n_expert,
                        .row_bytes = uint64_t(dim) * sizeof(float)};
  for (int64_t n_tokens : {1, 9}) {
    const std::vector<float> h = gaussian(size_t(n_tokens * dim), 132 + uint32_t(n_tokens));
    const MoeRouteOp route{.logits = nullptr,
                           .bias = nullptr,
                           .n_tokens = n_tokens,
                           .n_expert = n_expert,
                           .top_k = top_k,
                           .gating = MoeGating::Softmax,
                           .n_groups = 1,
                           .n_groups_used = 1,
                           .normalize = false,
                           .scale = 1.0f,
                           .expert_ids = nullptr,
                           .expert_weights = nullptr};
    const size_t n_chosen = size_t(n_tokens * top_k);
    std::vector<float> logits_seq(size_t(n_tokens * n_expert)), weights_seq(n_chosen);
    std::vector<int32_t> ids_seq(n_chosen);
    cpu.matmul({.weight = view,
                .input = h.data(),
                .output = logits_seq.data(),
                .n_tokens = n_tokens,
                .bias = router_bias.data()});
    MoeRouteOp plain = route;
    plain.logits = logits_seq.data(), plain.expert_ids = ids_seq.data();
    plain.expert_weights = weights_seq.data();
    cpu.moe_route(plain);

    std::vector<float> logits(logits_seq.size()), weights(n_chosen);
    std::vector<int32_t> ids(n_chosen, -1);
    MoeRouteOp fused = route;
    fused.logits = logits.data(), fused.expert_ids = ids.data();
    fused.expert_weights = weights.data();
    fused.router = view, fused.input = h.data(), fused.router_bias = router_bias.data();
    cpu.moe_route(fused);
    EXPECT_TRUE(same_bits(logits, logits_seq)) << n_tokens << " tokens";
    EXPECT_EQ(ids, ids_seq) << n_tokens << " tokens";
    EXPECT_TRUE(same_bits(weights, weights_seq)) << n_tokens << " tokens";
  }
}

TEST(FusedOps, MoeReduceWithTheNextNormIsReduceThenRmsNorm) {
  cpu::CpuBackend cpu(2);
  const int64_t n_tokens = 3, top_k = 6, dim = 320;
  const size_t n = size_t(n_tokens * dim);
  const std::vector<float> slots = gaussian(size_t(n_tokens * top_k * dim), 140);
  const std::vector<float> weights = gaussian(size_t(n_tokens * top_k), 141);
  const std::vector<float> shared = gaussian(n, 142), x0 = gaussian(n, 143);
  const std::vector<float> norm = gaussian(size_t(dim), 144);
  std::vector<float> out_seq(n), x_seq = x0, h_seq(n);
  const MoeReduceOp reduce{.slots = slots.data(),
                           .weights = weights.data(),
                           .n_tokens = n_tokens,
                           .top_k = top_k,
                           .dim = dim,
                           .output = out_seq.data(),
                           .residual = x_seq.data(),
                           .shared = shared.data()};
  cpu.moe_reduce(reduce);
  cpu.rms_norm({.input = x_seq.data(),
                .weight = norm.data(),
                .output = h_seq.data(),
                .n_rows = n_tokens,
                .dim = dim,
                .input_stride = dim,
                .output_stride = dim,
                .eps = 1e-6f});
  std::vector<float> out(n), x = x0, h(n);
  MoeReduceOp fused = reduce;
  fused.output = out.data(), fused.residual = x.data();
  fused.norm_weight = norm.data(), fused.norm_eps = 1e-6f, fused.norm_output = h.data();
  cpu.moe_reduce(fused);
  EXPECT_TRUE(same_bits(out, out_seq));
  EXPECT_TRUE(same_bits(x, x_seq));
  EXPECT_TRUE(same_bits(h, h_seq));
  EXPECT_FALSE(same_bits(h, x)) << "the norm was not applied";
}

TEST(FusedOps, MoeWithSharedExpertsIsSharedMoeReduceThenRoutedMoe) {
  cpu::CpuBackend cpu(2);
  const int64_t dim = 256, ffn = 256, shared_ffn = 512, n_expert = 4, top_k = 2;
  auto weights = [](int64_t rows, int64_t cols, uint32_t seed) {
    return test::make_weights(DType::Q4_K, rows, cols, seed, 0.06f);
  };
  auto view = [](const std::vector<uint8_t>& w, int64_t rows, int64_t cols, int64_t n_mats) {
    return WeightView{.type = DType::Q4_K,
                      .data = w.data(),
                      .cols = cols,
                      .rows = rows,
                      .n_mats = n_mats,
                      .row_bytes = row_bytes(DType::Q4_K, uint64_t(cols))};
  };
  const std::vector<uint8_t> gate = weights(n_expert * ffn, dim, 150),
                             up = weights(n_expert * ffn, dim, 151);
  const std::vector<uint8_t> down = weights(n_expert * dim, ffn, 152);
  const std::vector<uint8_t> sh_gate = weights(shared_ffn, dim, 153),
                             sh_up = weights(shared_ffn, dim, 154);
  const std::vector<uint8_t> sh_down = weights(dim, shared_ffn, 155);
  // Decode and prompt sizes (8-bit activations take the token-lanes kernels from a few tokens
  // on), both precisions, and a local index that leaves expert 1 to another device.
  const std::vector<int32_t> local = {0, -1, 1, 2};
  for (int64_t n_tokens : {1, 5, 24}) {
    for (ActivationBits bits : {ActivationBits::Sixteen, ActivationBits::Eight}) {
      for (bool some_elsewhere : {false, true}) {
        const std::vector<float> x = gaussian(size_t(n_tokens * dim), 156 + uint32_t(n_tokens));
        std::vector<int32_t> ids(size_t(n_tokens * top_k));
        for (size_t k = 0; k < ids.size(); ++k) ids[k] = int32_t((k * 3 + k / 5) % n_expert);
        const std::vector<int32_t> zeros(size_t(n_tokens), 0);
        const std::vector<float> ones(size_t(n_tokens), 1.0f);
        const int64_t held = some_elsewhere ? 3 : n_expert;
        MoeOp op{.input = x.data(),
                 .gate = view(gate, ffn, dim, held),
                 .up = view(up, ffn, dim, held),
                 .down = view(down, dim, ffn, held),
                 .expert_ids = ids.data(),
                 .local_index = some_elsewhere ? local.data() : nullptr,
                 .n_expert = n_expert,
                 .n_tokens = n_tokens,
                 .top_k = top_k,
                 .dim = dim,
                 .ffn_dims = ffn,
                 .slots = nullptr,
                 .activations = bits};
        op.shared = {.gate = view(sh_gate, shared_ffn, dim, 1),
                     .up = view(sh_up, shared_ffn, dim, 1),
                     .down = view(sh_down, dim, shared_ffn, 1),
                     .ffn_dims = shared_ffn,
                     .zero_ids = zeros.data(),
                     .one_weights = ones.data(),
                     .slot = nullptr,
                     .output = nullptr};
        std::vector<float> slots_seq(size_t(n_tokens * top_k * dim)),
            shared_seq(size_t(n_tokens * dim)), slot_seq(size_t(n_tokens * dim));
        MoeOp seq = op;
        seq.slots = slots_seq.data(), seq.shared.output = shared_seq.data();
        seq.shared.slot = slot_seq.data();
        cpu.moe(shared_experts_moe(seq));
        cpu.moe_reduce(shared_experts_reduce(seq));
        seq.shared = {};
        cpu.moe(seq);

        std::vector<float> slots(slots_seq.size()), shared(shared_seq.size()),
            slot(slot_seq.size());
        MoeOp fused = op;
        fused.slots = slots.data(), fused.shared.output = shared.data();
        fused.shared.slot = slot.data();
        cpu.moe(fused);
        const std::string where = std::to_string(n_tokens) + " tokens, " +
                                  (bits == ActivationBits::Eight ? "8" : "16") + "-bit" +
                                  (some_elsewhere ? ", expert 1 elsewhere" : "");
        EXPECT_TRUE(same_bits(slots, slots_seq)) << where << ": routed slots";
        EXPECT_TRUE(same_bits(shared, shared_seq)) << where << ": shared experts";
        EXPECT_FALSE(same_bits(shared, std::vector<float>(shared.size(), 0.0f)))
            << where << ": not written";
      }
    }
  }
}

}  // namespace
}  // namespace tandem
