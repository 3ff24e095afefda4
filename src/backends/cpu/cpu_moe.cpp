// Expert routing (backends/moe_routing.h, per token) and the mixture-of-experts FFN on the CPU.
#include <algorithm>

#include "backends/cpu/activations.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/matmul.h"
#include "backends/moe_routing.h"
#include "core/error.h"
#include "core/replica_choice.h"

namespace tandem::cpu {

void CpuBackend::moe_route(const MoeRouteOp& op) {
  if (op.router.data) matmul(router_product(op));  // the router's product first
  const RouteParams p = route_params(op);
  TANDEM_CHECK(p.top_k >= 1 && p.top_k <= p.n_expert && p.n_groups >= 1 &&
               p.n_expert % p.n_groups == 0);
  float* probs = grow(scratch_a_, size_t(p.n_expert));
  float* selection = grow(scratch_b_, size_t(p.n_expert));
  float* group_scores = grow(scratch_c_, size_t(p.n_groups));
  for (int64_t t = 0; t < op.n_tokens; ++t)
    route_token(p, op.logits + t * p.n_expert, op.bias, probs, selection, group_scores,
                op.expert_ids + t * p.top_k, op.expert_weights + t * p.top_k);
  if (op.counts)
    for (int64_t i = 0; i < op.n_tokens * p.top_k; ++i) ++op.counts[op.expert_ids[i]];
}

void CpuBackend::moe(const MoeOp& op) {
  const int64_t T = op.n_tokens, K = op.top_k, D = op.dim, F = op.ffn_dims;
  // The shared experts (SharedExpertsOp) ride in the routed experts' parallel jobs, as one more
  // expert that every token takes, straight from `input` into their slot: each product is the
  // one shared_experts_moe(op) runs (same kernel, rows and activations), so the bits are too.
  const SharedExpertsOp& shared = op.shared;
  const int64_t shared_ffn = shared.gate.data ? shared.ffn_dims : 0;
  const int64_t held = op.gate.n_mats;
  // Slots grouped by the expert's local matrix, so each held expert's weights are read once.
  if (index_scratch_.size() < size_t(held + 1 + T * K)) index_scratch_.resize(size_t(held + 1 + T * K));
  int32_t* offsets = index_scratch_.data();  // [held + 1]
  int32_t* order = offsets + held + 1;       // [<= T * K] slot indices, by local expert
  std::fill(offsets, offsets + held + 1, 0);
  auto local = [&](int64_t slot) -> int32_t {
    const int32_t e = op.expert_ids[slot];
    TANDEM_CHECK(e >= 0 && e < op.n_expert);
    return op.local_index ? op.local_index[e] : e;
  };
  for (int64_t s = 0; s < T * K; ++s)
    if (const int32_t m = local(s); m >= 0) ++offsets[m + 1];
  for (int64_t m = 0; m < held; ++m) offsets[m + 1] += offsets[m];
  expert_fill_.assign(offsets, offsets + held);
  for (int64_t s = 0; s < T * K; ++s)
    if (const int32_t m = local(s); m >= 0) order[expert_fill_[size_t(m)]++] = int32_t(s);

  const int64_t n_slots = offsets[held];
  float* x = grow(scratch_a_, size_t(T * K * D));
  // The shared experts' gate and up rows after the routed slots' (one activation job for both).
  float* gate = grow(scratch_b_, size_t(n_slots * F + T * shared_ffn));
  float* up = grow(scratch_c_, size_t(n_slots * F + T * shared_ffn));
  float* down = grow(scratch_d_, size_t(T * K * D));
  float* shared_gate = gate + n_slots * F;
  float* shared_up = up + n_slots * F;
  // Expert m's n tokens occupy rows [first, first + n) of x, gate, up and down. All experts'
  // gate and up projections run as one parallel job, then all the down projections: at decode
  // the threads share out a dozen small matrices instead of meeting after each one.
  auto for_each_used_expert = [&](auto&& fn) {
    for (int64_t m = 0; m < held; ++m)
      if (const int64_t n = offsets[m + 1] - offsets[m]; n > 0) fn(m, int64_t(offsets[m]), n);
  };
  auto args_of = [&](const WeightView& w, const float* input, int64_t n, float* output) {
    return matmul_args(w, input, n, output, op.activations, op.kernels);
  };
  matmul_args_.clear();
  for_each_used_expert([&](int64_t m, int64_t first, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(op.input + (order[first + i] / K) * D, D, x + (first + i) * D);
    matmul_args_.push_back(args_of(op.gate.matrix(m), x + first * D, n, gate + first * F));
    matmul_args_.push_back(args_of(op.up.matrix(m), x + first * D, n, up + first * F));
  });
  if (shared_ffn > 0) {
    matmul_args_.push_back(args_of(shared.gate, op.input, T, shared_gate));
    matmul_args_.push_back(args_of(shared.up, op.input, T, shared_up));
  }
  cpu::matmul_many(matmul_args_, pool_);
  // Biases by the local matrix of each sorted slot's expert: a row each, added in place.
  auto add_bias = [&](float* rows, const float* bias, int64_t width) {
    if (!bias) return;
    for_each_used_expert([&](int64_t m, int64_t first, int64_t n) {
      for (int64_t i = first; i < first + n; ++i) add(rows + i * width, bias + m * width, width);
    });
  };
  add_bias(gate, op.gate_bias, F);
  add_bias(up, op.up_bias, F);
  // The shared experts' activation is SwiGLU (shared_experts_moe).
  if (op.activation == FfnActivation::SwiGluClamped) {
    swiglu_clamped(gate, up, n_slots * F, pool_);
    if (shared_ffn > 0) silu_mul(shared_gate, shared_up, T * shared_ffn, pool_);
  } else {
    silu_mul(gate, up, n_slots * F + T * shared_ffn, pool_);
  }
  matmul_args_.clear();
  for_each_used_expert([&](int64_t m, int64_t first, int64_t n) {
    matmul_args_.push_back(args_of(op.down.matrix(m), gate + first * F, n, down + first * D));
  });
  if (shared_ffn > 0) matmul_args_.push_back(args_of(shared.down, shared_gate, T, shared.slot));
  cpu::matmul_many(matmul_args_, pool_);
  if (shared_ffn > 0) moe_reduce(shared_experts_reduce(op));
  add_bias(down, op.down_bias, D);
  for (int64_t i = 0; i < n_slots; ++i)
    std::copy_n(down + i * D, D, op.slots + int64_t(order[i]) * D);
}

void CpuBackend::moe_reduce(const MoeReduceOp& op) {
  TANDEM_CHECK((!op.shared && !op.norm_weight) || op.residual);
  TANDEM_CHECK(!op.norm_weight || op.norm_output);
  const int64_t K = op.top_k, D = op.dim;
  for (int64_t t = 0; t < op.n_tokens; ++t) {
    float* out = op.output + t * D;
    std::fill(out, out + D, 0.0f);
    for (int64_t k = 0; k < K; ++k) {
      const float w = op.weights[t * K + k];
      const float* slot = op.slots + (t * K + k) * D;
      for (int64_t d = 0; d < D; ++d) out[d] += w * slot[d];
    }
  }
  // The fused residual add: the unfused sequence, as defined.
  if (op.residual) add(op.residual, op.output, op.n_tokens * D);
  if (op.residual && op.shared) add(op.residual, op.shared, op.n_tokens * D);
  if (op.norm_weight)  // the next layer's norm (MoeReduceOp::norm_weight)
    rms_norm({.input = op.residual,
              .weight = op.norm_weight,
              .output = op.norm_output,
              .n_rows = op.n_tokens,
              .dim = D,
              .input_stride = D,
              .output_stride = D,
              .eps = op.norm_eps});
}

void CpuBackend::pick_replicas(const ReplicaPickOp& op) {
  thread_local std::vector<int32_t> chosen;  // no allocation per layer and step
  chosen.assign(size_t(op.n_expert), -1);
  int32_t load[kMaxReplicaShards];
  choose_replicas(op.expert_ids, op.n_slots, op.holders, op.max_holders, op.n_expert,
                  op.busy_shard, op.busy_load, chosen.data(), load);
  for (int64_t e = 0; e < op.n_expert; ++e)
    op.step_local_index[e] = chosen[size_t(e)] == op.shard ? op.local_index[e] : -1;
}

}  // namespace tandem::cpu
