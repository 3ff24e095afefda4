// RoPE (with YaRN), the latent KV cache store, and the middle of multi-head latent attention on
// the GPU. The two per-head projections of MLA (k_b absorbed into the query, v_b expanding the
// result) are matmuls over the heads (matmul.cu); what is here is attention proper: each
// (token, head) query [q_lat | q_rope] against the cache rows [latent | rope key] of its sequence.
//
// One block per (token, group of 8 heads, split of the keys) walks its keys in tiles of 8 rows
// with a running maximum and sum (the flash-attention recurrence), so no score matrix is stored;
// each warp stages one cache row and scores it against the group's 8 queries. A token's splits
// are folded in one fixed order, by the same block (prompts) or by a merge kernel (decode), so
// its result is the same in a prompt chunk and alone. On an H200 the first version (four threads
// a score, one split per 256 keys) took 50 us a layer at decode for a context of a few tokens.
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/row_steps.cuh"
#include "backends/rope_angles.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kGroup = 8;       // heads per block: they share each tile of cache rows
constexpr int kKeyTile = kThreads / 32;  // cache rows per tile, one per warp (8 x 576 floats)
constexpr int kMaxColumns = 4;  // latent columns per thread: kv_lora up to 1024 (DeepSeek: 512)
// Keys per split, at fixed positions (0 .. n-1, n .. 2n-1, ...) set by the cache's length alone:
// a token's result is the same fold of the same splits however many tokens share the step and
// whichever mode computes it. 64 keys (8 tiles) a split, or more where the context is long
// enough to need more than 64 splits: a decode step at depth 4096 is 64 blocks per head group.
constexpr int64_t kMinSplitKeys = 64, kMaxSplits = 64;
int64_t split_keys(int64_t n_ctx) {
  const int64_t keys = (n_ctx + kMaxSplits - 1) / kMaxSplits;
  return keys <= kMinSplitKeys ? kMinSplitKeys : (keys + kKeyTile - 1) / kKeyTile * kKeyTile;
}

__global__ void rope_kernel(RopeOp op, float low, float high) {
  const int64_t half = op.params.rope_dims / 2;
  const int64_t n = op.n_tokens * op.n_heads * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half, h = (idx / half) % op.n_heads, t = idx / (half * op.n_heads);
    rope_pair(op.params, low, high, float(op.positions[t]), i,
              op.data + t * op.token_stride + h * op.head_stride + op.offset);
  }
}

// The cache row of token t's (sequence, position). The host checked positions and sequences
// before the step (Engine::evaluate_batch); a bad one here is a bug in tandem, and stops the
// device rather than writing elsewhere (CPU: TANDEM_CHECK).
__device__ float* cache_row(const KvLayerView& c, const int32_t* positions, const int32_t* seq_ids,
                            int64_t t) {
  const int64_t pos = positions[t];
  if (seq_ids[t] < 0 || seq_ids[t] >= c.n_seq || pos < 0 || (!c.ring && pos >= c.n_ctx)) __trap();
  return c.f32() + (int64_t(seq_ids[t]) * c.n_ctx + c.slot(pos)) * c.row();
}

__global__ void kv_store_kernel(KvStoreOp op) {
  const KvLayerView& c = op.cache;
  const int64_t t = blockIdx.x, row = c.row();
  float* dst = cache_row(c, op.positions, op.seq_ids, t);
  // Latent rows whole; key/value rows from their two halves.
  const int64_t first = op.values ? c.k_dims : row;
  const float* src = op.rows + t * first;
  for (int64_t i = threadIdx.x; i < first; i += blockDim.x) dst[i] = src[i];
  if (op.values)
    for (int64_t i = threadIdx.x; i < c.v_dims; i += blockDim.x)
      dst[c.k_dims + i] = op.values[t * c.v_dims + i];
}

// LatentStoreOp in one launch, a block of kNormThreads per token: rms_norm_kernel's steps on the
// q LoRA row when asked and on the latent dims, rope_kernel's on the rope dims after them, then
// kv_store_kernel's copy, each through the same device functions so the bits are the sequence's.
__global__ void __launch_bounds__(kNormThreads)
    latent_store_kernel(LatentStoreOp op, float low, float high) {
  const int64_t t = blockIdx.x, row = op.cache.row();
  if (op.query_lora) {
    float* q = op.query_lora + t * op.query_lora_dims;
    block_rms_norm(q, q, op.query_lora_norm, op.query_lora_dims, op.eps);
    __syncthreads();  // block_rms_scale's sums are read before the next norm writes them
  }
  float* x = op.rows + t * row;
  block_rms_norm(x, x, op.norm_weight, op.norm_dims, op.eps);
  for (int64_t i = threadIdx.x; i < op.rope.rope_dims / 2; i += kNormThreads)
    rope_pair(op.rope, low, high, float(op.positions[t]), i, x + op.norm_dims);
  __syncthreads();  // the row whole before it is copied
  float* dst = cache_row(op.cache, op.positions, op.seq_ids, t);
  for (int64_t i = threadIdx.x; i < row; i += kNormThreads) dst[i] = x[i];
}

constexpr int kGqaWarps = 4;       // (token, head) pairs per block
constexpr int kGqaMaxPerLane = 8;  // head dims up to 256 over a warp's 32 lanes

// One warp per (token, head): the query's dims spread over the lanes, each key scored by a warp
// reduction, the running softmax and each lane's value columns updated key by key in order.
__global__ void __launch_bounds__(kGqaWarps * 32) gqa_attention_kernel(AttentionOp op) {
  const int lane = threadIdx.x % 32;
  const int64_t pair = int64_t(blockIdx.x) * kGqaWarps + threadIdx.x / 32;
  if (pair >= op.n_tokens * op.n_heads) return;
  const int64_t t = pair / op.n_heads, h = pair % op.n_heads;
  const int64_t g = h / (op.n_heads / op.n_kv_heads), hd = op.head_dim, vd = op.v_head_dim;
  const KvLayerView& c = op.cache;
  const int64_t row = c.row(), pos = op.positions[t];
  const float* rows = c.f32() + int64_t(op.seq_ids[t]) * c.n_ctx * row;
  float q[kGqaMaxPerLane], acc[kGqaMaxPerLane];
#pragma unroll
  for (int i = 0; i < kGqaMaxPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    q[i] = d < hd ? op.q[pair * hd + d] : 0.0f;
    acc[i] = 0.0f;
  }
  // The sink is one more logit with no value: the running state starts from it.
  float top = op.sinks ? op.sinks[h] : -INFINITY, sum = op.sinks ? 1.0f : 0.0f;
  const int64_t first = op.window > 0 && pos - op.window + 1 > 0 ? pos - op.window + 1 : 0;
  for (int64_t j = first; j <= pos; ++j) {
    const float* key = rows + c.slot(j) * row + g * hd;
    const float* value = rows + c.slot(j) * row + c.k_dims + g * vd;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kGqaMaxPerLane; ++i)
      if (lane + 32 * i < hd) dot = __fadd_rn(dot, __fmul_rn(q[i], key[lane + 32 * i]));
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    const float score = __fmul_rn(dot, op.scale);
    const float new_top = fmaxf(top, score);
    const float shrink = expf(__fsub_rn(top, new_top)), p = expf(__fsub_rn(score, new_top));
    sum = __fadd_rn(__fmul_rn(sum, shrink), p);
#pragma unroll
    for (int i = 0; i < kGqaMaxPerLane; ++i)
      if (lane + 32 * i < vd)
        acc[i] = __fadd_rn(__fmul_rn(acc[i], shrink), __fmul_rn(p, value[lane + 32 * i]));
    top = new_top;
  }
#pragma unroll
  for (int i = 0; i < kGqaMaxPerLane; ++i)
    if (lane + 32 * i < vd) op.output[pair * vd + lane + 32 * i] = acc[i] / sum;
}

struct MlaArgs {
  const float* q_lat;  // [T, H, lora]
  const float* q;      // [T, H, q_stride], rope part at nope
  int64_t q_stride, nope;
  KvLayerView cache;
  const int32_t* positions;
  const int32_t* seq_ids;
  int64_t n_heads;
  float scale;
  float* o_lat;    // [T, H, lora]
  float* partial;  // parallel mode: [T, H, max_splits, 2 + lora] (max, sum, unnormalized sums)
  int64_t max_splits, split_keys;
  // MlaAttentionOp::rotate_queries: q's rope dims rotated as they are loaded (yarn_ramp's low
  // and high for rope_rotate).
  bool rotate_queries;
  RopeParams rope;
  float rope_low, rope_high;
};

// What attention over a range of keys leaves for one head: the running maximum score, the sum
// of exp(score - max), and this thread's columns of Σ exp(score - max) · latent.
template <int kColumns>
struct HeadState {
  float max, sum;
  float o[kColumns];
};

__device__ __forceinline__ int64_t keys_of(const MlaArgs& a, int64_t t) {
  return int64_t(a.positions[t]) + 1;
}
__device__ __forceinline__ int64_t splits_of(const MlaArgs& a, int64_t t) {
  return (keys_of(a, t) + a.split_keys - 1) / a.split_keys;
}

// Folds state b into a: both rescaled to the larger maximum. The one merge both modes use, with
// explicit roundings, so a split-by-split fold gives the same bits wherever it runs.
template <int kColumns>
__device__ __forceinline__ void merge(HeadState<kColumns>& a, const HeadState<kColumns>& b) {
  const float m = fmaxf(a.max, b.max);
  const float ca = expf(__fsub_rn(a.max, m)), cb = expf(__fsub_rn(b.max, m));
  a.sum = __fadd_rn(__fmul_rn(a.sum, ca), __fmul_rn(b.sum, cb));
#pragma unroll
  for (int i = 0; i < kColumns; ++i)
    a.o[i] = __fadd_rn(__fmul_rn(a.o[i], ca), __fmul_rn(b.o[i], cb));
  a.max = m;
}

// Shared memory of a block: its heads' queries, a tile of cache rows, the tile's scores.
struct Smem {
  float* query;     // [kGroup][row]
  float* keys;      // [kKeyTile][row]
  float* p;         // [kGroup][kKeyTile]
  float* head_max;  // [kGroup] the running maxima after the current tile
};

__device__ __forceinline__ Smem carve(float* base, int64_t row) {
  float* p = base + (kGroup + kKeyTile) * row;
  return {base, base + kGroup * row, p, p + kGroup * kKeyTile};
}

size_t smem_bytes(int64_t row) {
  return size_t((kGroup + kKeyTile) * row + kGroup * kKeyTile + kGroup) * sizeof(float);
}

// The queries [q_lat | q_rope] of token t's heads h0 .. h0 + n_heads - 1 into shared memory,
// q_rope through rope_kernel's steps when they are still to be rotated (each block rotates its
// own copy; q itself is left as it was).
__device__ void load_queries(const MlaArgs& a, int64_t t, int64_t h0, int n_heads, const Smem& sm) {
  const int64_t lora = a.cache.kv_lora_rank, rope = a.cache.rope_dims, row = lora + rope;
  const int64_t loaded = a.rotate_queries ? lora : row;  // columns copied as they are
  for (int64_t i = threadIdx.x; i < kGroup * loaded; i += kThreads) {
    const int64_t g = i / loaded, c = i % loaded, h = h0 + g;
    float v = 0.0f;
    if (g < n_heads)
      v = c < lora ? a.q_lat[(t * a.n_heads + h) * lora + c]
                   : a.q[(t * a.n_heads + h) * a.q_stride + a.nope + c - lora];
    sm.query[g * row + c] = v;
  }
  if (!a.rotate_queries) return;
  const int64_t half = rope / 2;
  for (int64_t i = threadIdx.x; i < kGroup * half; i += kThreads) {
    const int64_t g = i / half, pair = i % half;
    const int64_t first = rope_first(a.rope, pair), second = rope_second(a.rope, pair);
    float* out = sm.query + g * row + lora;
    if (g >= n_heads) {
      out[first] = out[second] = 0.0f;
      continue;
    }
    const float* x = a.q + (t * a.n_heads + h0 + g) * a.q_stride + a.nope;
    rope_rotate(a.rope, a.rope_low, a.rope_high, float(a.positions[t]), pair, x[first], x[second],
                &out[first], &out[second]);
  }
}

// Attention of the block's heads over keys [begin, end) of token t's sequence, from an empty
// state: tiles of kKeyTile rows staged in shared memory once for all the heads (MLA's keys and
// values are the same latent rows for every head), four threads per score, then each thread
// folds the tile into its columns for every head.
template <int kColumns>
__device__ __forceinline__ void attend(const MlaArgs& a, int64_t t, int n_heads, int64_t begin,
                                       int64_t end, const Smem& sm,
                                       HeadState<kColumns> (&state)[kGroup]) {
  const int64_t lora = a.cache.kv_lora_rank, row = lora + a.cache.rope_dims;
  const int tid = threadIdx.x;
  const float* cache = a.cache.f32() + int64_t(a.seq_ids[t]) * a.cache.n_ctx * row;
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    state[g].max = -INFINITY, state[g].sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kColumns; ++i) state[g].o[i] = 0.0f;
  }
  const int warp = tid / 32, lane = tid % 32;
  for (int64_t j0 = begin; j0 < end; j0 += kKeyTile) {
    const int n_keys = int(end - j0 < kKeyTile ? end - j0 : kKeyTile);
    {  // warp j: cache row j0 + j into shared memory and its scores against the block's heads,
       // each lane over every 32nd column, then a fixed shuffle tree per head
      const bool real = warp < n_keys;
      const float* key = cache + (j0 + warp) * row;
      float score[kGroup];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) score[g] = 0.0f;
      for (int64_t c = lane; c < row; c += 32) {
        const float k = real ? key[c] : 0.0f;
        sm.keys[warp * row + c] = k;
#pragma unroll
        for (int g = 0; g < kGroup; ++g) score[g] = fmaf(sm.query[g * row + c], k, score[g]);
      }
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2)
          score[g] += __shfl_xor_sync(0xffffffffu, score[g], offset);
        if (lane == g)
          sm.p[g * kKeyTile + warp] = g < n_heads && real ? score[g] * a.scale : -INFINITY;
      }
    }
    __syncthreads();
    float correction[kGroup];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float tile_max = -INFINITY;
      for (int j = 0; j < kKeyTile; ++j) tile_max = fmaxf(tile_max, sm.p[g * kKeyTile + j]);
      const float m = fmaxf(state[g].max, tile_max);
      // -inf only for a padding head (g >= n_heads): nothing of it is kept.
      correction[g] = m == -INFINITY ? 0.0f : expf(state[g].max - m);
      state[g].max = m;
      if (tid == g) sm.head_max[g] = m;  // g known at compile time: the states stay in registers
    }
    __syncthreads();  // every thread has read the scores before they become weights
    if (tid < kGroup * kKeyTile) {
      const float m = sm.head_max[tid / kKeyTile];
      sm.p[tid] = m == -INFINITY ? 0.0f : expf(sm.p[tid] - m);
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float tile_sum = 0.0f;
      for (int j = 0; j < kKeyTile; ++j) tile_sum += sm.p[g * kKeyTile + j];
      state[g].sum = state[g].sum * correction[g] + tile_sum;
    }
#pragma unroll
    for (int i = 0; i < kColumns; ++i) {
      const int64_t c = tid + int64_t(i) * kThreads;
      if (c >= lora) break;
      float v[kKeyTile];
#pragma unroll
      for (int j = 0; j < kKeyTile; ++j) v[j] = sm.keys[j * row + c];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        float acc = state[g].o[i] * correction[g];
#pragma unroll
        for (int j = 0; j < kKeyTile; ++j) acc = fmaf(sm.p[g * kKeyTile + j], v[j], acc);
        state[g].o[i] = acc;
      }
    }
    __syncthreads();  // the tile's keys and weights are rewritten next
  }
}

template <int kColumns>
__device__ __forceinline__ void write_result(const MlaArgs& a, int64_t t, int64_t h,
                                             const HeadState<kColumns>& st) {
  const int64_t lora = a.cache.kv_lora_rank;
#pragma unroll
  for (int i = 0; i < kColumns; ++i) {
    const int64_t c = threadIdx.x + int64_t(i) * kThreads;
    if (c < lora) a.o_lat[(t * a.n_heads + h) * lora + c] = st.o[i] / st.sum;
  }
}

// Sequential mode: one block per (token, group of heads) walks the token's splits in order,
// folding each into the running state. Prompt chunks: their tokens already fill the device.
template <int kColumns>
__global__ void __launch_bounds__(kThreads) mla_sequential_kernel(MlaArgs a, int64_t n_groups) {
  extern __shared__ float smem[];
  const int64_t t = blockIdx.x / n_groups, h0 = (blockIdx.x % n_groups) * kGroup;
  const int n_heads = int(a.n_heads - h0 < kGroup ? a.n_heads - h0 : kGroup);
  const int64_t row = a.cache.kv_lora_rank + a.cache.rope_dims, n_keys = keys_of(a, t);
  const Smem sm = carve(smem, row);
  load_queries(a, t, h0, n_heads, sm);
  __syncthreads();
  HeadState<kColumns> total[kGroup], split[kGroup];
  attend(a, t, n_heads, 0, n_keys < a.split_keys ? n_keys : a.split_keys, sm, total);
  for (int64_t s = 1; s < splits_of(a, t); ++s) {
    const int64_t begin = s * a.split_keys,
                  end = n_keys < begin + a.split_keys ? n_keys : begin + a.split_keys;
    attend(a, t, n_heads, begin, end, sm, split);
#pragma unroll
    for (int g = 0; g < kGroup; ++g) merge(total[g], split[g]);
  }
#pragma unroll
  for (int g = 0; g < kGroup; ++g)
    if (g < n_heads) write_result(a, t, h0 + g, total[g]);
}

// Parallel mode, for a few tokens (decode): one block per (token, group of heads, split), each
// writing its state; then mla_merge_kernel folds a token's splits in the same order.
template <int kColumns>
__global__ void __launch_bounds__(kThreads) mla_split_kernel(MlaArgs a, int64_t n_groups) {
  extern __shared__ float smem[];
  const int64_t t = blockIdx.x / n_groups, h0 = (blockIdx.x % n_groups) * kGroup, s = blockIdx.y;
  if (s >= splits_of(a, t)) return;
  const int n_heads = int(a.n_heads - h0 < kGroup ? a.n_heads - h0 : kGroup);
  const int64_t lora = a.cache.kv_lora_rank, row = lora + a.cache.rope_dims, n_keys = keys_of(a, t);
  const Smem sm = carve(smem, row);
  load_queries(a, t, h0, n_heads, sm);
  __syncthreads();
  HeadState<kColumns> state[kGroup];
  const int64_t begin = s * a.split_keys,
                end = n_keys < begin + a.split_keys ? n_keys : begin + a.split_keys;
  attend(a, t, n_heads, begin, end, sm, state);
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    if (g >= n_heads) break;
    float* out = a.partial + ((t * a.n_heads + h0 + g) * a.max_splits + s) * (2 + lora);
    if (threadIdx.x == 0) out[0] = state[g].max, out[1] = state[g].sum;
#pragma unroll
    for (int i = 0; i < kColumns; ++i) {
      const int64_t c = threadIdx.x + int64_t(i) * kThreads;
      if (c < lora) out[2 + c] = state[g].o[i];
    }
  }
}

template <int kColumns>
__global__ void __launch_bounds__(kThreads) mla_merge_kernel(MlaArgs a) {
  const int64_t t = blockIdx.x, h = blockIdx.y, lora = a.cache.kv_lora_rank;
  auto load = [&](int64_t s, HeadState<kColumns>& st) {
    const float* in = a.partial + ((t * a.n_heads + h) * a.max_splits + s) * (2 + lora);
    st.max = in[0], st.sum = in[1];
#pragma unroll
    for (int i = 0; i < kColumns; ++i) {
      const int64_t c = threadIdx.x + int64_t(i) * kThreads;
      st.o[i] = c < lora ? in[2 + c] : 0.0f;
    }
  };
  HeadState<kColumns> total, split;
  load(0, total);
  for (int64_t s = 1; s < splits_of(a, t); ++s) {
    load(s, split);
    merge(total, split);
  }
  write_result(a, t, h, total);
}

template <int kColumns>
void launch_mla(const MlaArgs& args, int64_t n_tokens, int64_t n_heads, int64_t n_groups,
                int64_t max_splits, size_t shared, cudaStream_t stream) {
  static bool opted_in = false;  // shared memory past 48 KiB is asked for once (kv_lora 1024)
  if (shared > (size_t(48) << 10) && !opted_in && !recording_launches()) {
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(
        mla_sequential_kernel<kColumns>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(
        mla_split_kernel<kColumns>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
    opted_in = true;
  }
  if (args.partial) {
    launch("mla_split_kernel", mla_split_kernel<kColumns>,
           dim3(unsigned(n_tokens * n_groups), unsigned(max_splits)), kThreads, shared, stream,
           args, n_groups);
    launch("mla_merge_kernel", mla_merge_kernel<kColumns>,
           dim3(unsigned(n_tokens), unsigned(n_heads)), kThreads, 0, stream, args);
    return;
  }
  launch("mla_sequential_kernel", mla_sequential_kernel<kColumns>, unsigned(n_tokens * n_groups),
         kThreads, shared, stream, args, n_groups);
}

unsigned blocks_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

void rope(const RopeOp& op, cudaStream_t stream) {
  const YarnRamp ramp = yarn_ramp(op.params);
  const int64_t n = op.n_tokens * op.n_heads * (op.params.rope_dims / 2);
  launch("rope_kernel", rope_kernel, blocks_for(n, 256), 256, 0, stream, op, ramp.low, ramp.high);
}

void kv_store(const KvStoreOp& op, cudaStream_t stream) {
  launch("kv_store_kernel", kv_store_kernel, unsigned(op.n_tokens), 256, 0, stream, op);
}

void store_latent(const LatentStoreOp& op, cudaStream_t stream) {
  const YarnRamp ramp = yarn_ramp(op.rope);
  launch("latent_store_kernel", latent_store_kernel, unsigned(op.n_tokens), kNormThreads, 0, stream,
         op, ramp.low, ramp.high);
}

void gqa_attention(const AttentionOp& op, cudaStream_t stream) {
  if (op.head_dim > 32 * kGqaMaxPerLane || op.v_head_dim > 32 * kGqaMaxPerLane)
    cuda_failed(cudaErrorInvalidValue, "grouped-query attention with heads above 256 dims",
                __FILE__, __LINE__);
  const int64_t pairs = op.n_tokens * op.n_heads;
  launch("gqa_attention_kernel", gqa_attention_kernel,
         unsigned((pairs + kGqaWarps - 1) / kGqaWarps), kGqaWarps * 32, 0, stream, op);
}

int64_t mla_partial_floats(const KvLayerView& cache, int64_t n_tokens, int64_t n_heads) {
  const int64_t max_splits = (cache.n_ctx + split_keys(cache.n_ctx) - 1) / split_keys(cache.n_ctx);
  const int64_t n_groups = (n_heads + kGroup - 1) / kGroup;
  // Splitting pays where the tokens' head groups leave most of the device idle, and is kept to
  // what a few tens of MiB of partial states hold.
  const int64_t floats = n_tokens * n_heads * max_splits * (2 + cache.kv_lora_rank);
  return n_tokens * n_groups < 256 && max_splits > 1 && floats <= (int64_t(16) << 20) ? floats : 0;
}

void mla_scores_softmax_sums(const float* q_lat, const float* q, int64_t q_stride, int64_t nope,
                             const KvLayerView& cache, const int32_t* positions,
                             const int32_t* seq_ids, int64_t n_tokens, int64_t n_heads, float scale,
                             const RopeParams* query_rope, float* o_lat, float* partial,
                             cudaStream_t stream) {
  if (cache.kv_lora_rank > int64_t(kMaxColumns) * kThreads)
    cuda_failed(cudaErrorInvalidValue, "MLA with kv_lora_rank above 1024", __FILE__, __LINE__);
  const int64_t max_splits = (cache.n_ctx + split_keys(cache.n_ctx) - 1) / split_keys(cache.n_ctx);
  const int64_t n_groups = (n_heads + kGroup - 1) / kGroup;
  const YarnRamp ramp = query_rope ? yarn_ramp(*query_rope) : YarnRamp{};
  const MlaArgs args{.q_lat = q_lat,
                     .q = q,
                     .q_stride = q_stride,
                     .nope = nope,
                     .cache = cache,
                     .positions = positions,
                     .seq_ids = seq_ids,
                     .n_heads = n_heads,
                     .scale = scale,
                     .o_lat = o_lat,
                     .partial = partial,
                     .max_splits = max_splits,
                     .split_keys = split_keys(cache.n_ctx),
                     .rotate_queries = query_rope != nullptr,
                     .rope = query_rope ? *query_rope : RopeParams{},
                     .rope_low = ramp.low,
                     .rope_high = ramp.high};
  const int64_t row = cache.kv_lora_rank + cache.rope_dims;
  const size_t shared = smem_bytes(row);
  // kv_lora up to 512 (every DeepSeek): two latent columns per thread; up to 1024: four.
  if (cache.kv_lora_rank <= 2 * kThreads)
    launch_mla<2>(args, n_tokens, n_heads, n_groups, max_splits, shared, stream);
  else
    launch_mla<4>(args, n_tokens, n_heads, n_groups, max_splits, shared, stream);
}

}  // namespace tandem::cuda
