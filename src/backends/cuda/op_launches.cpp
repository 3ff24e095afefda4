#include "backends/cuda/op_launches.h"

#include <algorithm>

#include "backends/cuda/kernels.h"
#include "quant/block_dot_q8.h"

namespace tandem::cuda {
namespace {

// From this many tokens on, ByTokenCount takes the tensor-core tiles: below it the rows kernel
// reads each weight once per 8 tokens, above it a 64-token tile reads it once for all of them.
// A first guess until a GPU measures the crossing (matmul_bench on the device).
constexpr int64_t kTiledMinTokens = 16;

constexpr size_t kActQ8Bytes = sizeof(blocks::ActQ8);  // one block of 32 activations

bool tiled(KernelChoice kernels, int64_t n_tokens) {
  switch (kernels) {
    case KernelChoice::PerToken:
      return false;
    case KernelChoice::Tiled:
      return true;
    case KernelChoice::ByTokenCount:
      return n_tokens >= kTiledMinTokens;
  }
  return false;
}

// A one-matrix MatmulOp as the matmul kernels take it (its pair and bias aside).
MatmulLaunch launch_of(const MatmulOp& op) {
  return {.type = op.weight.type,
          .weights = op.weight.data,
          .rows = op.weight.rows,
          .cols = op.weight.cols,
          .row_bytes = op.weight.row_bytes,
          .mat_bytes = op.weight.matrix_bytes(),
          .input = op.input,
          .input_stride = op.weight.cols,
          .output = op.output,
          .output_stride = op.weight.rows,
          .n_tokens = op.n_tokens};
}

}  // namespace

blocks::ActQ8* OpLaunches::input_q8(int64_t n) {
  return static_cast<blocks::ActQ8*>(scratch_(Scratch::InputQ8, size_t(n / 32) * kActQ8Bytes));
}

void OpLaunches::get_rows(const WeightView& table, const int32_t* ids, int64_t n, float* output) {
  if (n == 0) return;
  cuda::get_rows(table, ids, n, output, stream_);
}

void OpLaunches::matmul(const MatmulOp& op) {
  if (op.n_tokens == 0) return;
  MatmulLaunch m = launch_of(op);
  // The pair in one launch where both are one matrix of one format and width.
  const bool pair = op.second.data && op.second.type == op.weight.type &&
                    op.second.cols == op.weight.cols && op.weight.n_mats == 1 &&
                    op.second.n_mats == 1;
  if (pair) {
    m.second_weights = op.second.data;
    m.second_rows = op.second.rows;
    m.second_output = op.second_output;
  }
  tiled(op.kernels, op.n_tokens) ? matmul_tiled(m, stream_) : matmul_rows(m, stream_);
  if (op.bias) add_row_bias(op.output, op.bias, op.n_tokens, op.weight.rows, stream_);
  if (op.second.data && !pair)
    matmul({.weight = op.second,
            .input = op.input,
            .output = op.second_output,
            .n_tokens = op.n_tokens,
            .kernels = op.kernels});
}

void OpLaunches::rms_norm(const RmsNormOp& op) {
  if (op.n_rows == 0) return;
  cuda::rms_norm(op, stream_);
}

void OpLaunches::rope(const RopeOp& op) {
  if (op.n_tokens == 0) return;
  cuda::rope(op, stream_);
}

void OpLaunches::kv_store(const KvStoreOp& op) {
  if (op.n_tokens == 0) return;
  cuda::kv_store(op, stream_);
}

void OpLaunches::store_latent(const LatentStoreOp& op) {
  if (op.n_tokens == 0) return;
  cuda::store_latent(op, stream_);
}

// k_b absorbed into the query per head, attention over the latent cache, v_b per head: the two
// projections are matmuls over the heads with strided inputs and outputs.
void OpLaunches::mla_attention(const MlaAttentionOp& op) {
  const int64_t T = op.n_tokens, H = op.n_heads, lora = op.cache.kv_lora_rank;
  if (T == 0) return;
  const int64_t q_stride = op.nope_dims + op.cache.rope_dims;
  auto* q_lat = scratch<float>(Scratch::QueryLatent, T * H * lora);
  auto* o_lat = scratch<float>(Scratch::OutputLatent, T * H * lora);
  const bool use_tiles = tiled(op.kernels, T);
  const MatmulLaunch absorb{.type = op.k_b.type,
                            .weights = op.k_b.data,
                            .rows = op.k_b.rows,
                            .cols = op.k_b.cols,
                            .row_bytes = op.k_b.row_bytes,
                            .mat_bytes = op.k_b.matrix_bytes(),
                            .input = op.q,
                            .input_stride = H * q_stride,
                            .input_mat_stride = q_stride,
                            .output = q_lat,
                            .output_stride = H * lora,
                            .output_mat_stride = lora,
                            .n_tokens = T,
                            .n_mats = H};
  use_tiles ? matmul_tiled(absorb, stream_) : matmul_rows(absorb, stream_);
  const int64_t partial_floats = mla_partial_floats(op.cache, T, H);
  float* partial =
      partial_floats ? scratch<float>(Scratch::AttentionSplits, partial_floats) : nullptr;
  mla_scores_softmax_sums(q_lat, op.q, q_stride, op.nope_dims, op.cache, op.positions, op.seq_ids,
                          T, H, op.scale, op.rotate_queries ? &op.rope : nullptr, o_lat, partial,
                          stream_);
  const MatmulLaunch expand{.type = op.v_b.type,
                            .weights = op.v_b.data,
                            .rows = op.v_b.rows,
                            .cols = op.v_b.cols,
                            .row_bytes = op.v_b.row_bytes,
                            .mat_bytes = op.v_b.matrix_bytes(),
                            .input = o_lat,
                            .input_stride = H * lora,
                            .input_mat_stride = lora,
                            .output = op.output,
                            .output_stride = H * op.v_head_dims,
                            .output_mat_stride = op.v_head_dims,
                            .n_tokens = T,
                            .n_mats = H};
  use_tiles ? matmul_tiled(expand, stream_) : matmul_rows(expand, stream_);
}

void OpLaunches::attention(const AttentionOp& op) {
  if (op.n_tokens == 0) return;
  cuda::gqa_attention(op, stream_);
}

void OpLaunches::moe_route(const MoeRouteOp& op) {
  prepared_input_ = nullptr;
  if (op.n_tokens == 0) return;
  if (op.router.data && !tiled(op.kernels, op.n_tokens) && can_route_with_router(op)) {
    // The experts' 8-bit input quantized in the same launch, for the moe that follows.
    const int64_t n = op.n_tokens * op.router.cols;
    blocks::ActQ8* q8 = nullptr;
    if (op.prepare_experts_input && op.router.cols % 32 == 0) {
      q8 = input_q8(n);
      prepared_input_ = op.input;
      prepared_floats_ = n;
    }
    return router_then_route(launch_of(router_product(op)), op,
                             scratch<unsigned>(Scratch::RouteDone, 1), q8, stream_);
  }
  if (op.router.data) matmul(router_product(op));  // the sequence MoeRouteOp::router stands for
  cuda::moe_route(op, stream_);
}

// The slots of the experts held here, for the tiles (prompts) sorted by expert on the device (no
// host round trip), for the rows kernels (decode) taken straight from the routing; then gate/up
// with the activation and down over the entries: one launch each for all the experts, the layer's
// shared experts (MoeOp::shared) among them at decode when their matrices are in the routed ones'
// formats. CudaBackend::moe has checked the formats (gate and up alike, rows a multiple of 8).
void OpLaunches::moe(const MoeOp& op) {
  // The router's launch quantized this input already (MoeOp::input_prepared).
  const bool input_quantized =
      op.input_prepared && prepared_input_ == op.input && prepared_floats_ == op.n_tokens * op.dim;
  prepared_input_ = nullptr;
  const int64_t n_slots = op.n_tokens * op.top_k, held = op.gate.n_mats;
  if (n_slots == 0) return;
  const bool use_tiles = tiled(op.kernels, op.step_tokens > 0 ? op.step_tokens : op.n_tokens);
  const SharedExpertsOp& shared = op.shared;
  // The kernels address the shared gate/up rows with the routed ones' row size.
  const bool fuse_shared = shared.gate.data && !use_tiles && shared.gate.type == op.gate.type &&
                           shared.up.type == op.gate.type && shared.down.type == op.down.type &&
                           shared.gate.row_bytes == op.gate.row_bytes && op.ffn_dims % 32 == 0 &&
                           shared.ffn_dims % 32 == 0;
  if (shared.gate.data && !fuse_shared) {  // the sequence SharedExpertsOp stands for
    moe(shared_experts_moe(op));
    moe_reduce(shared_experts_reduce(op));
  }
  ExpertSlots s{.max_slots = n_slots, .top_k = op.top_k};
  if (use_tiles) {  // the tiles take an expert's entries together: sorted on the device
    const int64_t max_tiles = (n_slots + 63) / 64 + std::min(held, n_slots);
    s.order = scratch<int32_t>(Scratch::Order, n_slots);
    s.expert_of = scratch<int32_t>(Scratch::ExpertOf, n_slots);
    int32_t* counters = scratch<int32_t>(Scratch::Counters, 2);
    s.n_active = counters;
    s.n_tiles = counters + 1;
    s.tile_first = scratch<int32_t>(Scratch::TileFirst, max_tiles);
    s.tile_count = scratch<int32_t>(Scratch::TileCount, max_tiles);
    s.max_tiles = max_tiles;
    moe_sort(op.expert_ids, op.local_index, n_slots, held, const_cast<int32_t*>(s.order),
             const_cast<int32_t*>(s.expert_of), counters, const_cast<int32_t*>(s.tile_first),
             const_cast<int32_t*>(s.tile_count), counters + 1, max_tiles, stream_);
  } else {  // the rows kernels: each entry its own warps, straight from the routing
    s.expert_ids = op.expert_ids;
    s.local_index = op.local_index;
  }
  // The activations of all entries, the shared experts' rows after the routed ones'.
  int64_t act_floats = n_slots * op.ffn_dims;
  if (fuse_shared) {
    s.shared = {.gate = static_cast<const uint8_t*>(shared.gate.data),
                .up = static_cast<const uint8_t*>(shared.up.data),
                .down = static_cast<const uint8_t*>(shared.down.data),
                .ffn = shared.ffn_dims,
                .n_tokens = op.n_tokens,
                .down_row_bytes = shared.down.row_bytes,
                .weights = shared.one_weights,
                .output = shared.output};
    act_floats += op.n_tokens * shared.ffn_dims;
  }
  float* act = scratch<float>(Scratch::Act, act_floats);
  float* gate_out = use_tiles ? scratch<float>(Scratch::Gate, n_slots * op.ffn_dims) : nullptr;
  float* up_out = use_tiles ? scratch<float>(Scratch::Up, n_slots * op.ffn_dims) : nullptr;
  const ExpertBiases biases{
      .gate = op.gate_bias, .up = op.up_bias, .down = op.down_bias, .activation = op.activation};
  // Decode with 8-bit activations where the policy allows them and the format has the step
  // (MoeOp::activations; quant/block_dot_q8.h): the inputs quantized once per product.
  const bool eight = op.activations == ActivationBits::Eight && !use_tiles;
  if (eight && matmul_supports_q8(op.gate.type) && op.dim % 32 == 0) {
    blocks::ActQ8* q8 = input_q8(op.n_tokens * op.dim);
    if (!input_quantized) quantize_q8(op.input, op.n_tokens * op.dim, q8, stream_);
    expert_gate_up_q8(op.gate.type, op.gate.data, op.up.data, op.ffn_dims, op.dim,
                      op.gate.row_bytes, op.gate.matrix_bytes(), q8, s, act, biases, stream_);
  } else {
    expert_gate_up(op.gate.type, op.gate.data, op.up.data, op.ffn_dims, op.dim, op.gate.row_bytes,
                   op.gate.matrix_bytes(), op.input, s, gate_out, up_out, act, use_tiles, biases,
                   stream_);
  }
  if (eight && matmul_supports_q8(op.down.type) && op.ffn_dims % 32 == 0) {
    auto* act_q8 = static_cast<blocks::ActQ8*>(
        scratch_(Scratch::ActQ8, size_t(act_floats / 32) * kActQ8Bytes));
    quantize_q8(act, act_floats, act_q8, stream_);
    expert_down_q8(op.down.type, op.down.data, op.dim, op.ffn_dims, op.down.row_bytes,
                   op.down.matrix_bytes(), act_q8, s, op.slots, biases, stream_);
  } else {
    expert_down(op.down.type, op.down.data, op.dim, op.ffn_dims, op.down.row_bytes,
                op.down.matrix_bytes(), act, s, op.slots, use_tiles, biases, stream_);
  }
}

void OpLaunches::moe_reduce(const MoeReduceOp& op) {
  if (op.n_tokens == 0) return;
  cuda::moe_reduce(op, stream_);
}

void OpLaunches::pick_replicas(const ReplicaPickOp& op) {
  cuda::pick_replicas(op, stream_);
}

void OpLaunches::add(float* y, const float* x, int64_t n) {
  if (n == 0) return;
  cuda::add(y, x, n, stream_);
}

void OpLaunches::add_parts(float* y, std::span<const float* const> parts, int64_t n) {
  if (n == 0 || parts.empty()) return;
  cuda::add_parts(y, parts, n, stream_);
}

void OpLaunches::zero(float* y, int64_t n) {
  if (n == 0) return;
  cuda::fill(y, 0.0f, n, stream_);
}

void OpLaunches::copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
                           int64_t n_rows, int64_t row_len) {
  if (n_rows == 0 || row_len == 0) return;
  cuda::copy_rows(dst, dst_stride, src, src_stride, n_rows, row_len, stream_);
}

}  // namespace tandem::cuda
