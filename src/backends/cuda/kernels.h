#pragma once
// Internal to the CUDA backend: the kernel launchers that cuda_backend.cpp calls, one file of
// kernels per concern as in backends/cpu/ (matmul.cu, cuda_attention.cu, cuda_moe.cu,
// elementwise.cu). Every launcher enqueues on `stream` and returns at once; none allocates or
// synchronizes, so each can run inside a graph capture. Pointers are device memory unless a
// comment says otherwise. Shapes are [outer, ..., inner], the last dimension contiguous.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/backend.h"
#include "core/dtype.h"

namespace tandem::blocks {
struct ActQ8;  // quant/block_dot_q8.h
}

namespace tandem::cuda {

// ---- matmul.cu ----

// y[m][t] = W_m · x[m][t] for n_mats matrices W_m of [rows, cols] stored as GGUF stores them
// (a block decoder of quant/block_decode.h per format: no conversion at load), F32 activations.
// Matrix m's weights start mat_bytes after matrix m-1's; its inputs and outputs input_mat_stride
// and output_mat_stride floats after m-1's (the heads of MLA's per-head projections).
struct MatmulLaunch {
  DType type = DType::F32;
  const void* weights = nullptr;
  int64_t rows = 0, cols = 0;  // cols a multiple of the format's block (8 for F32/F16/BF16)
  uint64_t row_bytes = 0, mat_bytes = 0;
  const float* input = nullptr;
  int64_t input_stride = 0, input_mat_stride = 0;  // floats between tokens, between matrices
  float* output = nullptr;
  int64_t output_stride = 0, output_mat_stride = 0;
  int64_t n_tokens = 0, n_mats = 1;
  // Rows a warp of the rows kernel takes for one token (1, 2 or 4; 0: the kernel's choice; more
  // tokens keep theirs). The results do not depend on it; cuda_matmul_bench measures each.
  int rows_per_warp = 0;
  // A second matrix over the same input, in the same format and width, one matrix (n_mats 1):
  // the rows kernel computes it in the same launch (blockIdx.y 1), the tiles in a second one.
  const void* second_weights = nullptr;
  int64_t second_rows = 0;
  float* second_output = nullptr;  // [n_tokens, second_rows]
};

// Whether the kernels read `type` (the formats with a block decoder).
bool matmul_supports(DType type);
// One warp per weight row, up to 8 tokens sharing each weight load; a token's result is summed
// in the same order whatever the token count, so it is the per-token kernel (KernelChoice
// PerToken) and the decode kernel. Both matrices of a pair (second_weights) in one launch.
void matmul_rows(const MatmulLaunch& m, cudaStream_t stream);
// Tiles of 64 rows x 64 tokens through the tensor cores (WMMA, TF32 in three products: F32
// accuracy), each weight tile decoded once into shared memory for 64 tokens; a token's result
// does not depend on its tile mates. Prompts and expert batches.
void matmul_tiled(const MatmulLaunch& m, cudaStream_t stream);

// The expert products of a MoE op over slots sorted by local expert (cuda_moe.cu builds the
// order). Sorted entry i is slot order[i] = token * top_k + k of local expert expert_of[i]; the
// first n_active[0] entries are real (n_active is device memory, read by the kernels).
// Or unsorted, for the rows kernels (each entry is its own warps' work, so order buys nothing;
// a decode step then launches no sort): `expert_ids` set, entry i is slot i, of local expert
// local_index[expert_ids[i]] (expert_ids[i] without local_index), skipped where that is -1; the
// sorted arrays and tiles are unused.
struct ExpertSlots {
  const int32_t* order = nullptr;      // [max_slots]
  const int32_t* expert_of = nullptr;  // [max_slots]
  const int32_t* n_active = nullptr;   // [1]
  // Tiles of at most 64 sorted entries of one expert: first entry and count, n_tiles[0] of them.
  const int32_t* tile_first = nullptr;  // [max_tiles]
  const int32_t* tile_count = nullptr;  // [max_tiles]
  const int32_t* n_tiles = nullptr;     // [1]
  int64_t max_slots = 0, max_tiles = 0, top_k = 1;
  const int32_t* expert_ids = nullptr;   // [max_slots] unsorted: the routing
  const int32_t* local_index = nullptr;  // [n_expert] or null
  // The layer's shared experts in the same launches (MoeOp::shared; the rows kernels, unsorted):
  // entries max_slots .. max_slots + n_tokens - 1 are the tokens' shared FFN, in the format of
  // the routed matrices, its activations in `act` after the routed entries' (rows of ffn), and
  // its result output[t] = 0 + weights[t] · product (moe_reduce's bits for one slot).
  struct Shared {
    const uint8_t* gate = nullptr;  // null: none
    const uint8_t* up = nullptr;
    const uint8_t* down = nullptr;
    int64_t ffn = 0, n_tokens = 0;
    uint64_t down_row_bytes = 0;
    const float* weights = nullptr;  // [n_tokens]
    float* output = nullptr;         // [n_tokens, dim]
  } shared;
};
// The activation of the expert FFNs and their per-expert biases (MoeOp, core/backend.h), by local
// expert: gate [held, ffn], up [held, ffn], down [held, dim]; null where the model has none.
struct ExpertBiases {
  const float* gate = nullptr;
  const float* up = nullptr;
  const float* down = nullptr;
  FfnActivation activation = FfnActivation::SwiGlu;
};
// act[i] = activation(gate_e · x_t + bias, up_e · x_t + bias) for entry i (expert e, token t),
// [max_slots, ffn] (then the shared experts' rows, ExpertSlots::shared): `tiled` picks the
// tensor-core tiles, else one warp per row and entry.
void expert_gate_up(DType type, const void* gate, const void* up, int64_t ffn, int64_t dim,
                    uint64_t row_bytes, uint64_t mat_bytes, const float* input,
                    const ExpertSlots& s, float* gate_out, float* up_out, float* act, bool tiled,
                    const ExpertBiases& b, cudaStream_t stream);
// slots[order[i]] = down_e · act[i] + bias, [*, dim].
void expert_down(DType type, const void* down, int64_t dim, int64_t ffn, uint64_t row_bytes,
                 uint64_t mat_bytes, const float* act, const ExpertSlots& s, float* slots,
                 bool tiled, const ExpertBiases& b, cudaStream_t stream);

// The 8-bit path of the expert products (quant/block_dot_q8.h: dp4a on ActQ8 activations, one
// scale per 32), for MoeOp::activations == Eight at decode (the rows kernels; prompts keep the
// F32 tensor-core tiles). Formats without an 8-bit step keep F32 activations.
bool matmul_supports_q8(DType type);
// out[b] = the b-th 32 of x[0 .. n) quantized (n a multiple of 32).
void quantize_q8(const float* x, int64_t n, blocks::ActQ8* out, cudaStream_t stream);
// As expert_gate_up / expert_down's rows path, with the inputs quantized by quantize_q8: `input`
// [tokens, dim / 32] blocks, `act` [max_slots, ffn / 32].
void expert_gate_up_q8(DType type, const void* gate, const void* up, int64_t ffn, int64_t dim,
                       uint64_t row_bytes, uint64_t mat_bytes, const blocks::ActQ8* input,
                       const ExpertSlots& s, float* act, const ExpertBiases& b,
                       cudaStream_t stream);
void expert_down_q8(DType type, const void* down, int64_t dim, int64_t ffn, uint64_t row_bytes,
                    uint64_t mat_bytes, const blocks::ActQ8* act, const ExpertSlots& s,
                    float* slots, const ExpertBiases& b, cudaStream_t stream);

// MoeRouteOp with its router product (MoeRouteOp::router) in one launch: the logits by the rows
// kernel, the routing by the block that finishes last, counted on `done` (one device counter, 0
// between launches: it is left 0). For F32 routers and up to 8 tokens (can_route_with_router).
bool can_route_with_router(const MoeRouteOp& op);
// `m`: the router's product as matmul_rows would take it (MoeRouteOp::router's). `input_q8`
// (or null): the router's input also quantized there, quantize_q8's bits
// (MoeRouteOp::prepare_experts_input; the router's columns a multiple of 32).
void router_then_route(const MatmulLaunch& m, const MoeRouteOp& op, unsigned* done,
                       blocks::ActQ8* input_q8, cudaStream_t stream);

// ---- cuda_moe.cu ----

// Routing per token (backends/moe_routing.h's steps, one warp per token); counts += 1 per choice.
void moe_route(const MoeRouteOp& op, cudaStream_t stream);
// Sorts the slots of held experts by local expert (stable: by slot within an expert) and cuts
// them into tiles: fills ExpertSlots' arrays.
void moe_sort(const int32_t* expert_ids, const int32_t* local_index, int64_t n_slots, int64_t held,
              int32_t* order, int32_t* expert_of, int32_t* n_active, int32_t* tile_first,
              int32_t* tile_count, int32_t* n_tiles, int64_t max_tiles, cudaStream_t stream);
// output[t] = Σ_k weights[t, k] · slots[t, k], k in order.
void moe_reduce(const MoeReduceOp& op, cudaStream_t stream);
// The step's local index of one device's experts when some have copies (core/replica_choice.h).
void pick_replicas(const ReplicaPickOp& op, cudaStream_t stream);

// ---- cuda_attention.cu ----

// RoPE, adjacent pairs or NeoX halves; the KV store of latent or key/value rows, at a ring's slot
// for a sliding-window layer.
void rope(const RopeOp& op, cudaStream_t stream);
void kv_store(const KvStoreOp& op, cudaStream_t stream);
// LatentStoreOp (RMSNorm, rope and store of MLA latent rows) in one launch.
void store_latent(const LatentStoreOp& op, cudaStream_t stream);
// Grouped-query attention (AttentionOp): one warp per (token, head) walks the token's keys in
// order with a running maximum and sum (the sink, when there is one, starts them), so a token's
// result is summed in one order whatever shares its step.
void gqa_attention(const AttentionOp& op, cudaStream_t stream);
// The part of MLA between the two per-head projections: for each (token, head) the scores of
// [q_lat | q_rope] against the cache rows of the token's sequence up to its position, softmax,
// and o_lat = Σ p_j · latent_j. q_lat [T, H, kv_lora]; q (for the rope part) [T, H, q_stride];
// o_lat [T, H, kv_lora]. Keys in splits of 256 at fixed positions, each with a running softmax,
// folded in order: each result summed in one fixed order, the same in a prompt and alone.
// `partial` (mla_partial_floats floats, or null when that is 0): the splits run in parallel
// blocks and a second kernel folds them (decode); without it one block folds them as it goes.
// `query_rope` (or null): q_rope is still to be rotated by these params, as it is loaded
// (MlaAttentionOp::rotate_queries; q is not written).
int64_t mla_partial_floats(const KvLayerView& cache, int64_t n_tokens, int64_t n_heads);
void mla_scores_softmax_sums(const float* q_lat, const float* q, int64_t q_stride, int64_t nope,
                             const KvLayerView& cache, const int32_t* positions,
                             const int32_t* seq_ids, int64_t n_tokens, int64_t n_heads, float scale,
                             const RopeParams* query_rope, float* o_lat, float* partial,
                             cudaStream_t stream);

// ---- elementwise.cu ----

void rms_norm(const RmsNormOp& op, cudaStream_t stream);
void add(float* y, const float* x, int64_t n, cudaStream_t stream);
// y += parts[0], += parts[1], ... in order (any number of parts; a launch per eight).
void add_parts(float* y, std::span<const float* const> parts, int64_t n, cudaStream_t stream);
void fill(float* y, float value, int64_t n, cudaStream_t stream);
// out[t][r] += bias[r] for n_tokens rows of `rows` floats (MatmulOp::bias).
void add_row_bias(float* out, const float* bias, int64_t n_tokens, int64_t rows,
                  cudaStream_t stream);
void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t n_rows,
               int64_t row_len, cudaStream_t stream);
// output[i] = dequantize(table row ids[i]).
void get_rows(const WeightView& table, const int32_t* ids, int64_t n, float* output,
              cudaStream_t stream);

}  // namespace tandem::cuda
