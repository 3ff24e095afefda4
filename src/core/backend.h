#pragma once
// The Backend interface every device implements (DESIGN.md "The Backend interface").
//
// Operations are coarse — matmul, rms_norm, rope, MLA and grouped-query attention, MoE, add — so
// the executor stays simple and each backend can fuse inside an op. Every pointer an op takes
// lives in memory the backend can reach: host memory for `cpu`, device memory for `cuda:N` and
// `sim:N` — the small index arrays too (positions, sequence ids, expert ids and weights), so that
// no op needs the host mid-step and a decode step can be captured once and replayed (CUDA graphs).
// Ops are submitted in order to one stream per backend and may run asynchronously (a CUDA stream, a
// sim worker thread); events order work across backends, `synchronize()` waits for all of it, and
// `copy_to_host` / `copy_to_host_async` are the ways results come back. The CPU backend executes
// each op before returning.
//
// Shapes are written [outer, ..., inner]: the last dimension is contiguous.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/host_device.h"

namespace tandem {

// A weight matrix, or a stack of equally shaped matrices (experts of a layer, heads of attn_k_b),
// stored as GGUF stores it: `rows` rows of `cols` elements, each row row_bytes(type, cols) bytes.
struct WeightView {
  DType type = DType::F32;
  const void* data = nullptr;
  int64_t cols = 0;      // row length (GGUF shape[0])
  int64_t rows = 0;      // rows per matrix (GGUF shape[1], 1 for vectors)
  int64_t n_mats = 1;    // matrices in the stack (GGUF shape[2])
  uint64_t row_bytes = 0;

  uint64_t matrix_bytes() const { return row_bytes * uint64_t(rows); }
  // Matrix i of a stack, as its own view.
  WeightView matrix(int64_t i) const {
    WeightView m = *this;
    m.data = static_cast<const uint8_t*>(data) + uint64_t(i) * matrix_bytes();
    m.n_mats = 1;
    return m;
  }
};

// Device memory owned by a backend; freed when the last owner lets go.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
  float* floats() { return static_cast<float*>(data()); }
};

// RoPE on `rope_dims` dimensions starting at `offset` inside each head, with optional YaRN
// interpolation. Rotated pair i (i < rope_dims / 2) turns by pos * freq_base^(-2i / rope_dims): the
// dims 2i and 2i + 1 ("normal" GGUF rope: DeepSeek), or i and i + rope_dims / 2 with `neox` (Qwen,
// gpt-oss, GLM).
struct RopeParams {
  int64_t rope_dims = 0;
  float freq_base = 10000.0f;
  bool neox = false;
  // YaRN: 1/factor (1 = no scaling); ext_factor 1 blends interpolation and extrapolation per
  // dimension between the correction dims computed from beta_fast/beta_slow.
  float freq_scale = 1.0f;
  float ext_factor = 0.0f;
  int64_t original_ctx = 0;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
};

// Which kernels an op over several tokens may use. The fastest matmul kernel depends on the
// token count (one row dot per token for a few tokens; tiles of 16 tokens per vector from 8 on)
// and the two round differently, so by default a token's logits depend on how many tokens share
// its step. A server that batches unrelated requests fixes the choice per kind of step instead,
// and then each token's arithmetic is the same whatever else is in the batch (batch invariance).
enum class KernelChoice : uint8_t {
  ByTokenCount,  // the fastest for the op's token count: single-sequence runs
  PerToken,      // one row dot per token, whatever the count: decode steps of a batch
  Tiled,         // token tiles wherever the format has them (each token's result independent of
                 // its tile mates), row dots elsewhere: prompt steps of a batch
};

// How finely a backend may round an op's activations for its integer products. The CPU's
// quantized kernels take 16-bit activations (one scale per 32 elements; within ~1e-5 of F32) and,
// where an op allows it, 8-bit ones (the vpdpbusd kernels: 1.5x the 16-bit ones' throughput,
// ~250x coarser); the CUDA backend takes it at decode (dp4a steps on activations quantized per
// 32, quant/block_dot_q8.h) and keeps F32 activations in its prompt tiles. Which ops allow 8 bits
// is the precision policy (PrecisionPolicy in model/model.h).
enum class ActivationBits : uint8_t { Sixteen, Eight };

struct MatmulOp {
  WeightView weight;         // one matrix: [rows, cols]
  const float* input;        // [n_tokens, cols]
  float* output;             // [n_tokens, rows]
  int64_t n_tokens;
  KernelChoice kernels = KernelChoice::ByTokenCount;
  // [rows] F32 added to every token's output, or null: the bits of the product and then an add
  // (gpt-oss and GLM have biases on their attention projections, gpt-oss on its router).
  const float* bias = nullptr;
  // The CPU's integer products; GPUs keep F32 activations for single matrices either way.
  ActivationBits activations = ActivationBits::Sixteen;
  // A second product over the same input in the same op (a layer's q and kv_a: one launch on a
  // GPU): when second.data is set, second_output = second · input too ([n_tokens, second.rows]),
  // with the same kernels and activations and no bias: the bits of a second matmul.
  WeightView second{};
  float* second_output = nullptr;
};

struct RmsNormOp {
  const float* input;        // [n_rows, dim], rows `input_stride` floats apart
  const float* weight;       // [dim] F32 (host-visible for cpu)
  float* output;             // [n_rows, dim], rows `output_stride` apart; may equal input
  int64_t n_rows, dim;
  int64_t input_stride, output_stride;
  float eps;
  // Fused residual add in front (a layer's attention output joining the residual before the FFN
  // norm): when set, `residual` += `add` first, both laid out as `input`, which must be
  // `residual`. The bits of add() over the rows, then rms_norm().
  float* residual = nullptr;
  const float* add = nullptr;
};

struct RopeOp {
  float* data;               // [n_tokens, n_heads, head_stride]: rotated in place
  const int32_t* positions;  // [n_tokens]
  int64_t n_tokens, n_heads;
  int64_t head_stride;       // floats from one head to the next
  int64_t token_stride;      // floats from one token to the next
  int64_t offset;            // first rotated dim inside a head
  RopeParams params;
};

// The KV cache of one layer for several sequences: per (sequence, position) one row, either
// latent (MLA: kv_lora_rank latent values, then the rope dims of the shared key) or keys and values
// (grouped-query attention: every kv head's key, then every kv head's value). A sliding-window
// layer keeps only its last n_ctx positions, as a ring: position p lives in row p % n_ctx.
// The values are F32, or BF16 (`--cache-type-k/v bf16`: half the memory and the reads at long
// context; the CPU backend only) rounded to nearest even from what F32 cache would hold.
struct KvLayerView {
  void* data;  // [n_seq, n_ctx, row] values of `type`
  int64_t n_seq, n_ctx;
  int64_t kv_lora_rank = 0, rope_dims = 0;  // latent rows
  int64_t k_dims = 0, v_dims = 0;           // key/value rows: n_kv_heads * head_dim each
  bool ring = false;                        // rows hold positions modulo n_ctx
  DType type = DType::F32;                  // F32 or BF16
  TANDEM_HD int64_t row() const { return kv_lora_rank + rope_dims + k_dims + v_dims; }
  TANDEM_HD int64_t slot(int64_t position) const { return ring ? position % n_ctx : position; }
  TANDEM_HD int64_t value_bytes() const { return type == DType::BF16 ? 2 : 4; }
  TANDEM_HD int64_t row_bytes() const { return row() * value_bytes(); }
  // The values of an F32 cache (every backend's kernels but the CPU's BF16 ones read these).
  TANDEM_HD float* f32() const { return static_cast<float*>(data); }
};

// Multi-head latent attention in absorbed form. For each token t, head h:
//   q_lat = Wkb_h^T-absorbed(q_nope) [kv_lora];  score_j = (q_lat·c_j + q_rope·k_rope_j) * scale
//   over the cached positions j <= pos[t] of the token's sequence; o_lat = softmax · c;
//   out = Wvb_h · o_lat [v_head].
// The token's own latent must already be stored in the cache (kv_store).
struct MlaAttentionOp {
  float* q;                  // [n_tokens, n_heads, nope + rope], rope part rotated (see below)
  WeightView k_b;            // [n_heads] x [kv_lora rows, nope cols]
  WeightView v_b;            // [n_heads] x [v_head rows, kv_lora cols]
  KvLayerView cache;
  const int32_t* positions;  // [n_tokens]
  const int32_t* seq_ids;    // [n_tokens]
  int64_t n_tokens, n_heads, nope_dims, v_head_dims;
  float scale;
  float* output;             // [n_tokens, n_heads, v_head]
  KernelChoice kernels = KernelChoice::ByTokenCount;  // of the per-head projections
  // Optional: q's rope dims not rotated yet. The op is then the sequence rope(query_rope(op))
  // and the attention, bit for bit; q's rope dims are left rotated or as they were (a GPU
  // rotates them as it reads them: MLA's queries made ready in the attention's launch).
  bool rotate_queries = false;
  RopeParams rope{};
};

// The rope of an MlaAttentionOp's queries (MlaAttentionOp::rotate_queries).
RopeOp query_rope(const MlaAttentionOp& op);

// Writes each token's row into the cache at its position (its ring slot for a window layer):
// the latent row (already normalized and rotated), or the keys (rotated) and values.
struct KvStoreOp {
  const float* rows;  // [n_tokens, kv_lora + rope] latent rows, or [n_tokens, k_dims] keys
  KvLayerView cache;
  const int32_t* positions;  // [n_tokens]
  const int32_t* seq_ids;    // [n_tokens]
  int64_t n_tokens;
  const float* values = nullptr;  // [n_tokens, v_dims] for key/value caches
};

// A token's latent row made ready and stored (MLA, after the kv_a product): defined as the
// sequence rms_norm of the q LoRA rows (when given), rms_norm of its first norm_dims
// (norm_weight, eps), rope of the rope dims after them (one head), kv_store, in place and bit for
// bit. Backends without
// a fused form run that sequence (Backend::store_latent); the CUDA backend does it in one launch.
struct LatentStoreOp {
  float* rows;  // [n_tokens, cache.row()]: kv_lora_rank = norm_dims, then rope.rope_dims
  const float* norm_weight;  // [norm_dims]
  int64_t norm_dims;
  float eps;
  RopeParams rope;
  KvLayerView cache;         // a latent cache (no key/value split)
  const int32_t* positions;  // [n_tokens]
  const int32_t* seq_ids;    // [n_tokens]
  int64_t n_tokens;
  // Optional (null: none), done first: q LoRA's norm (DeepSeek-V3), rms_norm in place of
  // query_lora [n_tokens, query_lora_dims] by query_lora_norm with the same eps, so that the
  // queries' second product can follow the store and the attention rotate them
  // (MlaAttentionOp::rotate_queries): both norms in one launch.
  float* query_lora = nullptr;
  const float* query_lora_norm = nullptr;
  int64_t query_lora_dims = 0;
};

// Grouped-query attention over a key/value cache. For each token t and head h, with kv head
// g = h / (n_heads / n_kv_heads):
//   z_j = (q[t, h] · key_j[g]) * scale over the cached positions j of the token's sequence with
//         pos[t] - window < j <= pos[t] (every j <= pos[t] when window is 0);
//   P_j = exp(z_j) / (Σ_j' exp(z_j') + exp(sinks[h]))   (no sink term when sinks is null: the
//         sink takes probability mass and has no value, as gpt-oss's attention sinks);
//   out[t, h] = Σ_j P_j value_j[g].
// The tokens' own keys and values must already be in the cache (kv_store). Each result is summed
// in a fixed order that depends only on its own token, as for MLA.
struct AttentionOp {
  const float* q;            // [n_tokens, n_heads, head_dim], rotated
  KvLayerView cache;         // key/value rows: k_dims = n_kv_heads * head_dim, v_dims likewise
  const int32_t* positions;  // [n_tokens]
  const int32_t* seq_ids;    // [n_tokens]
  int64_t n_tokens, n_heads, n_kv_heads, head_dim, v_head_dim;
  float scale;
  float* output;                 // [n_tokens, n_heads, v_head_dim]
  int64_t window = 0;            // keys per query (a sliding-window layer), or 0: every earlier key
  const float* sinks = nullptr;  // [n_heads] sink logits, or null
};

// How a MoE layer picks experts from router logits: the k best by probability after a softmax
// over all experts (DeepSeek-V2, Qwen3) or a sigmoid (DeepSeek-V3, GLM-4.5; the selection bias
// steers the choice only); or the k largest logits, weighted by a softmax over those k alone
// (gpt-oss).
enum class MoeGating { Softmax, Sigmoid, SoftmaxOfTopK };
struct MoeRouteOp {
  float* logits;             // [n_tokens, n_expert] (written first when `router` is set)
  const float* bias;         // [n_expert] selection-only bias (exp_probs_b) or nullptr
  int64_t n_tokens, n_expert, top_k;
  MoeGating gating;
  int64_t n_groups, n_groups_used;  // group-limited selection; 1/1 = off
  bool normalize;            // divide the chosen weights by their sum
  float scale;               // then multiply by this
  int32_t* expert_ids;       // [n_tokens, top_k]
  float* expert_weights;     // [n_tokens, top_k]
  uint64_t* counts = nullptr;  // [n_expert]: += 1 per choice (the routing profile), or null
  // The router's product in front (a GPU routes in the launch that computes the logits): when
  // router.data is set, first logits = router · input (+ router_bias), the bits of
  // matmul({router, input, logits, n_tokens, kernels, router_bias}).
  WeightView router{};           // [n_expert rows, dim cols]
  const float* input = nullptr;  // [n_tokens, dim]
  const float* router_bias = nullptr;
  KernelChoice kernels = KernelChoice::ByTokenCount;
  // A hint that changes no result: the MoeOp that follows on this backend takes `input` too (it
  // has input_prepared set, and nothing writes `input` between). A backend may prepare that
  // op's activations here: the CUDA backend quantizes them in the router's launch.
  bool prepare_experts_input = false;
};

// The expert FFN's activation of gate and up: silu(g) * u, or gpt-oss's clamped form
// g' * sigmoid(1.702 g') * (u' + 1) with g' = min(g, 7) and u' = clamp(u, -7, 7).
enum class FfnActivation : uint8_t { SwiGlu, SwiGluClamped };

// A MoE layer's shared experts, carried by the op of its routed experts on the layer's device so
// that a GPU runs both in the same launches. Defined as the sequence the layer ran before, first:
// shared_experts_moe(op) (the routed op's input through these weights as the one expert of a
// dense FFN, SwiGLU, no biases, into `slot`), then shared_experts_reduce(op) (that slot with
// weight one_weights[t] into `output`). The same bits on every backend; gate.data null: none.
struct SharedExpertsOp {
  WeightView gate, up;  // one matrix each: [ffn_dims rows, dim cols]
  WeightView down;      // [dim rows, ffn_dims cols]
  int64_t ffn_dims = 0;
  const int32_t* zero_ids = nullptr;   // [n_tokens] zeros
  const float* one_weights = nullptr;  // [n_tokens] ones
  float* slot = nullptr;               // [n_tokens, dim]: the sequence's scratch
  float* output = nullptr;             // [n_tokens, dim]
};

// down_k(silu(gate_k·x) ⊙ up_k·x) for each (token, k) slot whose expert this device holds,
// written unweighted to slots[token * top_k + k]; other slots are left alone. Experts of one
// layer may be spread over several devices: each computes its own slots, and moe_reduce on the
// layer's device sums them in a fixed order, so results do not depend on the split.
// A dense SwiGLU FFN is the same op with one expert.
struct MoeOp {
  const float* input;           // [n_tokens, dim]
  WeightView gate, up;          // [held experts] x [ffn rows, dim cols]
  WeightView down;              // [held experts] x [dim rows, ffn cols]
  const int32_t* expert_ids;    // [n_tokens, top_k] global expert ids
  const int32_t* local_index;   // [n_expert] matrix in the stacks, -1 if not held; null = identity
  int64_t n_expert;             // experts of the layer (length of local_index)
  int64_t n_tokens, top_k, dim, ffn_dims;
  float* slots;                 // [n_tokens, top_k, dim]
  KernelChoice kernels = KernelChoice::ByTokenCount;
  // The step's tokens when the op has only some of them (a rank given just the tokens routed to
  // its experts): ByTokenCount chooses by this count, so each token gets the kernels, and the
  // bits, the whole step gives it on one machine. 0: n_tokens.
  int64_t step_tokens = 0;
  ActivationBits activations = ActivationBits::Sixteen;  // of all three products
  FfnActivation activation = FfnActivation::SwiGlu;
  // Per-expert biases (gpt-oss), by matrix in the stacks like the weights, or null: added to the
  // gate and up products before the activation and to the down product.
  const float* gate_bias = nullptr;  // [held experts, ffn_dims]
  const float* up_bias = nullptr;    // [held experts, ffn_dims]
  const float* down_bias = nullptr;  // [held experts, dim]
  SharedExpertsOp shared{};          // the layer's shared experts, run first (SharedExpertsOp)
  // The MoeRouteOp just before on this backend had prepare_experts_input over this input; a
  // backend uses what it prepared there only when it did (results are the same either way).
  bool input_prepared = false;
};

// output[t] = Σ_k weights[t, k] · slots[t, k], k in order; `output` is overwritten.
struct MoeReduceOp {
  const float* slots;           // [n_tokens, top_k, dim]
  const float* weights;         // [n_tokens, top_k]
  int64_t n_tokens, top_k, dim;
  float* output;                // [n_tokens, dim]
  // Fused residual add (a layer's FFN ending in one op): when set, after `output` is written,
  // residual += output, then residual += shared when that is set. The same bits as moe_reduce,
  // add(residual, output) and add(residual, shared) one after the other, on every backend.
  // `shared` without `residual` is refused.
  float* residual = nullptr;      // [n_tokens, dim]
  const float* shared = nullptr;  // [n_tokens, dim]
  // Then the next layer's first norm, fused (its input made ready by this layer's last op): when
  // norm_weight is set (with residual), norm_output = rmsnorm(residual) * norm_weight, the bits
  // of rms_norm() after the adds.
  const float* norm_weight = nullptr;  // [dim]
  float norm_eps = 0.0f;
  float* norm_output = nullptr;  // [n_tokens, dim]
};

// The product MoeRouteOp::router stands for, before the routing.
MatmulOp router_product(const MoeRouteOp& route);
// The two ops `routed.shared` stands for (SharedExpertsOp), in order.
MoeOp shared_experts_moe(const MoeOp& routed);
MoeReduceOp shared_experts_reduce(const MoeOp& routed);

// Which of a layer's experts this device computes in this step, when some experts have copies
// on several devices: step_local_index[e] = local_index[e] where core/replica_choice.h's rule
// gives expert e to `shard`, else -1; the moe op then takes it as its local_index. Every device of
// the layer runs it on the same routing, so each chosen expert is computed exactly once.
struct ReplicaPickOp {
  const int32_t* expert_ids;   // [n_slots] the step's routing
  int64_t n_slots;
  const int32_t* holders;      // [n_expert][max_holders] shard numbers, the home first, -1 pads
  int32_t max_holders;         // 1 .. kMaxReplicaShards
  int64_t n_expert;
  int32_t shard;               // this device's shard number
  int32_t busy_shard;          // the layer's device: it starts at busy_load (shared experts)
  int32_t busy_load;
  const int32_t* local_index;  // [n_expert] this device's matrix of each expert, -1 if not held
  int32_t* step_local_index;   // [n_expert] out
};

// A point in a backend's stream of submitted ops.
class Event {
 public:
  virtual ~Event() = default;
  // Blocks the calling thread until every op submitted before the event has finished.
  virtual void wait() = 0;
};

// A captured sequence of ops (begin_capture .. end_capture) that replay() submits again as a
// whole: a CUDA graph. Its ops keep the pointers and sizes they were captured with; what changes
// between replays is the contents of the buffers they read.
class Graph {
 public:
  virtual ~Graph() = default;
};

class Transport;  // core/transport.h

// How a device's buffers reach a device of another rank (DESIGN.md "Several machines"). Through
// host memory (the caller copies them out, sends them over the Transport and copies them in at
// the other end) unless both ends have the same direct path: NCCL between GPUs, or the sim
// backend's stand-in for it (which sends through host memory too, but by the channel's code).
enum class RankChannelKind : uint32_t { ThroughHost, Nccl, Simulated };

// What a device tells the device at the other end of a cut between ranks (Backend::
// rank_channel_end): a direct path opens only where both have the same kind, of the same
// version, and are not one physical device (ranks sharing a GPU for testing; NCCL refuses that).
struct RankChannelEnd {
  RankChannelKind kind = RankChannelKind::ThroughHost;
  uint32_t version = 0;    // of what carries it (NCCL's version code)
  uint64_t device_id = 0;  // the physical device: its machine and place in it, hashed
};

// RankChannelEnd::device_id for the device at `place` on this machine (a GPU's PCI bus id): the
// machine's host name and `place`, hashed.
uint64_t device_id_on_this_machine(std::string_view place);

// A direct path between this rank's device and one device of another rank, opened by the two
// ranks together (Backend::open_rank_channel), then used both ways. Each call returns when the
// buffer has been sent or has arrived, in stream order after what was submitted before it; it
// throws tandem::Error naming the peer and `what` when the peer does not take part within the
// transport's timeout.
class RankChannel {
 public:
  virtual ~RankChannel() = default;
  virtual void send(const void* device_src, size_t bytes, std::string_view what) = 0;
  virtual void receive(void* device_dst, size_t bytes, std::string_view what) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda:0", "sim:1".
  virtual std::string name() const = 0;
  // True when the backend computes on host memory, so weights can be used in place from the
  // mmap'd file and activations read without a copy.
  virtual bool uses_host_memory() const = 0;

  // Throws tandem::Error naming the device, the request and what is free when it cannot.
  virtual std::shared_ptr<DeviceBuffer> allocate(size_t bytes, const std::string& what) = 0;
  // Copies between host memory and this backend's memory (plain memcpy on the CPU).
  virtual void copy_from_host(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* device_src, size_t bytes) = 0;
  // Copies `bytes` from `from`'s memory into this backend's, in stream order on both and without
  // the host waiting: after everything submitted to `from` so far, before anything submitted to
  // either afterwards touches the two buffers. True when this pair of devices can (GPUs of one
  // machine: a peer copy); false, having done nothing, otherwise: the caller goes through the host.
  virtual bool copy_from_peer(Backend& from, void* device_dst, const void* peer_src, size_t bytes);
  // The same copy, run by this (the sending) device's stream rather than the receiver's, so that
  // several devices sending to one at once copy in parallel (a gather) instead of taking turns
  // on the receiver's stream. Same ordering and return value as `to.copy_from_peer(*this, ...)`,
  // which is what backends without their own streams do.
  virtual bool copy_to_peer(Backend& to, void* peer_dst, const void* src, size_t bytes);
  // How this device's buffers can go to another rank's device (see RankChannelEnd).
  virtual RankChannelEnd rank_channel_end() const { return {}; }
  // Opens that path to a device of rank `peer` whose end matches: both ranks call this together,
  // the sending one with `sends` true; `host` carries what the opening needs and sets its
  // timeout. Throws tandem::Error naming the problem (and on a backend without one).
  virtual std::unique_ptr<RankChannel> open_rank_channel(Transport& host, int32_t peer, bool sends,
                                                         std::string_view what);
  // Host memory that copy_*_async can use without blocking (page-locked for CUDA, on 2 MiB
  // pages); plain host memory elsewhere.
  virtual std::shared_ptr<DeviceBuffer> allocate_host(size_t bytes, const std::string& what) = 0;
  // Copies in stream order: they run when the stream reaches them, and the host memory (from
  // allocate_host) must stay as it is until an event recorded after the copy has completed.
  virtual void copy_to_host_async(void* host_dst, const void* device_src, size_t bytes) = 0;
  virtual void copy_from_host_async(void* device_dst, const void* host_src, size_t bytes) = 0;
  // Copies weights from host memory that stays as it is for the run (the model's own, not only
  // allocate_host's) into this device's memory, on a copy lane beside the ops: the copy starts
  // once `after` has completed (null: at once), may overlap the ops submitted before it, and
  // the ops submitted after it wait for it. How a prompt chunk streams experts held in RAM to a
  // GPU (double-buffered: `after` is the event of the last op that read the buffer). Backends
  // with one lane run it in stream order (copy_from_host_async, the default).
  virtual void upload_weights(void* device_dst, const void* host_src, size_t bytes,
                              std::shared_ptr<Event> after);
  // Runs `task` on a host thread once every op submitted before it has finished, without
  // holding up the ops submitted after it; the event completes when the task has returned.
  // Tasks of one backend run one at a time, in order. Under capture the task is part of the
  // graph and runs again at every replay. This is how the CPU computes its share of a step that
  // a device runs: a task may run another backend that uses host memory (the CPU's experts)
  // while this one goes on (cudaLaunchHostFunc on a side stream). A task must not submit to this
  // backend. An exception thrown by the task is rethrown by synchronize() (the CPU, which runs
  // the task at once, lets it through host_task itself).
  virtual std::shared_ptr<Event> host_task(std::function<void()> task) = 0;
  // Waits until every submitted op has finished.
  virtual void synchronize() = 0;
  // How a host thread waits for this device in synchronize(): asleep until the driver
  // wakes it (the default), which leaves the cores to the host's own share of a step, or
  // spinning, which answers sooner where the plan gives the host nothing to do meanwhile.
  // Backends without the choice ignore it.
  virtual void set_spin_waits(bool /*spin*/) {}
  // Marks the current end of the stream; later ops on other backends can wait for it.
  virtual std::shared_ptr<Event> record_event() = 0;
  // Ops submitted after this call start only when `event` has completed.
  virtual void wait_for(std::shared_ptr<Event> event) = 0;
  // Bytes this backend may still allocate (SIZE_MAX when unbounded).
  virtual size_t free_bytes() const = 0;
  // Whether matmul, moe and mla_attention take weights stored as `type` (get_rows reads every
  // format matmul takes, except the interleaved ones).
  virtual bool can_multiply(DType type) const = 0;
  // Whether kv_store, mla_attention and attention take a KV cache of `type` (KvLayerView).
  virtual bool can_cache(DType type) const { return type == DType::F32; }

  // Capture: between begin_capture() and end_capture() ops are recorded instead of run, and
  // replay() submits the recording again. While capturing, nothing may wait on the host for this
  // backend (synchronize, the blocking copies, Event::wait on its events) or allocate from it.
  // Backends without graphs say so with can_capture() == false.
  virtual bool can_capture() const { return false; }
  virtual void begin_capture();
  virtual std::unique_ptr<Graph> end_capture();
  virtual void replay(Graph& graph);

  // Rows of an embedding table (any format) to F32: output[i] = dequantize(table row ids[i]).
  virtual void get_rows(const WeightView& table, const int32_t* ids, int64_t n, float* output) = 0;
  virtual void matmul(const MatmulOp& op) = 0;
  virtual void rms_norm(const RmsNormOp& op) = 0;
  virtual void rope(const RopeOp& op) = 0;
  virtual void kv_store(const KvStoreOp& op) = 0;
  // rms_norm, rope and kv_store as LatentStoreOp defines them; the default runs them in turn.
  virtual void store_latent(const LatentStoreOp& op);
  virtual void mla_attention(const MlaAttentionOp& op) = 0;
  virtual void attention(const AttentionOp& op) = 0;
  virtual void moe_route(const MoeRouteOp& op) = 0;
  virtual void moe(const MoeOp& op) = 0;
  virtual void moe_reduce(const MoeReduceOp& op) = 0;
  virtual void pick_replicas(const ReplicaPickOp& op) = 0;
  // y += x over n floats.
  virtual void add(float* y, const float* x, int64_t n) = 0;
  // y += parts[0], then += parts[1], ... over n floats: the rounding of one add() per part in
  // that order, as one op (how a layer's device sums the partial results other devices sent).
  virtual void add_parts(float* y, std::span<const float* const> parts, int64_t n);
  // y = 0 over n floats.
  virtual void zero(float* y, int64_t n) = 0;
  // Copies `n_rows` rows of `row_len` floats between strided layouts on this device.
  virtual void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
                         int64_t n_rows, int64_t row_len) = 0;
};

}  // namespace tandem
