// RoPE (with YaRN), the latent KV cache store, and the middle of multi-head latent attention on
// the GPU. The two per-head projections of MLA (k_b absorbed into the query, v_b expanding the
// result) are matmuls over the heads (matmul.cu); what is here is attention proper: each
// (token, head) query [q_lat | q_rope] against the cache rows [latent | rope key] of its sequence.
//
// One block per (token, head) walks the keys in tiles of 64 with a running maximum and sum (the
// flash-attention recurrence), so no score matrix is stored and a token's result is summed in
// one fixed order, the same in a prompt chunk and alone. The heads of a token each read the
// token's cache rows (through L2); sharing one read across heads, and splitting long contexts
// over several blocks with a fixed-order merge, are the next steps once a GPU shows where the
// time goes.
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/rope_angles.h"

namespace tandem::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kThreads = 128;
constexpr int kKeyTile = 64;
constexpr int kMaxLatentPerThread = 8;  // kv_lora up to 1024 (DeepSeek: 512)

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void rope_kernel(RopeOp op, float low, float high) {
  const int64_t half = op.params.rope_dims / 2;
  const int64_t n = op.n_tokens * op.n_heads * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half, h = (idx / half) % op.n_heads, t = idx / (half * op.n_heads);
    float c, s;
    rope_cos_sin(op.params, low, high, float(op.positions[t]), i, &c, &s);
    float* x = op.data + t * op.token_stride + h * op.head_stride + op.offset + 2 * i;
    const float x0 = x[0], x1 = x[1];
    x[0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    x[1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
}

__global__ void kv_store_kernel(KvStoreOp op) {
  const int64_t t = blockIdx.x, row = op.cache.kv_lora_rank + op.cache.rope_dims;
  float* dst = op.cache.data + (int64_t(op.seq_ids[t]) * op.cache.n_ctx + op.positions[t]) * row;
  const float* src = op.rows + t * row;
  for (int64_t c = threadIdx.x; c < row; c += blockDim.x) dst[c] = src[c];
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
  float* o_lat;  // [T, H, lora]
};

__global__ void __launch_bounds__(kThreads) mla_kernel(MlaArgs a) {
  extern __shared__ float query[];  // [lora + rope]
  __shared__ float p[kKeyTile];
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int64_t lora = a.cache.kv_lora_rank, rope = a.cache.rope_dims, row = lora + rope;
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  for (int64_t c = tid; c < lora; c += kThreads) query[c] = a.q_lat[(t * a.n_heads + h) * lora + c];
  for (int64_t c = tid; c < rope; c += kThreads) query[lora + c] = a.q[(t * a.n_heads + h) * a.q_stride + a.nope + c];
  __syncthreads();

  const int64_t n_keys = int64_t(a.positions[t]) + 1;
  const float* keys = a.cache.data + int64_t(a.seq_ids[t]) * a.cache.n_ctx * row;
  float o[kMaxLatentPerThread];
#pragma unroll
  for (int i = 0; i < kMaxLatentPerThread; ++i) o[i] = 0.0f;
  float running_max = -INFINITY, running_sum = 0.0f;

  for (int64_t j0 = 0; j0 < n_keys; j0 += kKeyTile) {
    // Scores of this tile: each warp takes 16 keys, the lanes split a key's row.
    for (int jj = warp; jj < kKeyTile; jj += kThreads / kWarpSize) {
      const int64_t j = j0 + jj;
      float partial = 0.0f;
      if (j < n_keys)
        for (int64_t c = lane; c < row; c += kWarpSize) partial = fmaf(query[c], keys[j * row + c], partial);
      const float score = warp_sum(partial);
      if (lane == 0) p[jj] = j < n_keys ? score * a.scale : -INFINITY;
    }
    __syncthreads();
    // Every thread folds the tile into the running softmax the same way (same bits everywhere).
    float tile_max = -INFINITY;
    for (int jj = 0; jj < kKeyTile; ++jj) tile_max = fmaxf(tile_max, p[jj]);
    const float new_max = fmaxf(running_max, tile_max);
    const float correction = expf(running_max - new_max);  // 0 on the first tile
    __syncthreads();
    if (tid < kKeyTile) p[tid] = expf(p[tid] - new_max);  // -inf past the last key: 0
    __syncthreads();
    float tile_sum = 0.0f;
    for (int jj = 0; jj < kKeyTile; ++jj) tile_sum += p[jj];
    running_sum = running_sum * correction + tile_sum;
    running_max = new_max;
    // Weighted sums of the tile's latent rows: thread tid owns columns tid, tid + 128, ...
    const int64_t keys_here = n_keys - j0 < kKeyTile ? n_keys - j0 : kKeyTile;
#pragma unroll
    for (int i = 0; i < kMaxLatentPerThread; ++i) {
      const int64_t c = tid + int64_t(i) * kThreads;
      if (c >= lora) break;
      float acc = o[i] * correction;
      for (int64_t jj = 0; jj < keys_here; ++jj) acc = fmaf(p[jj], keys[(j0 + jj) * row + c], acc);
      o[i] = acc;
    }
    __syncthreads();  // p is rewritten by the next tile
  }
#pragma unroll
  for (int i = 0; i < kMaxLatentPerThread; ++i) {
    const int64_t c = tid + int64_t(i) * kThreads;
    if (c < lora) a.o_lat[(t * a.n_heads + h) * lora + c] = o[i] / running_sum;
  }
}

unsigned blocks_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

void rope(const RopeOp& op, cudaStream_t stream) {
  const YarnRamp ramp = yarn_ramp(op.params);
  const int64_t n = op.n_tokens * op.n_heads * (op.params.rope_dims / 2);
  rope_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(op, ramp.low, ramp.high);
  TANDEM_CUDA_CHECK_LAUNCH(rope_kernel);
}

void kv_store(const KvStoreOp& op, cudaStream_t stream) {
  kv_store_kernel<<<unsigned(op.n_tokens), 256, 0, stream>>>(op);
  TANDEM_CUDA_CHECK_LAUNCH(kv_store_kernel);
}

void mla_scores_softmax_sums(const float* q_lat, const float* q, int64_t q_stride, int64_t nope,
                             const KvLayerView& cache, const int32_t* positions, const int32_t* seq_ids,
                             int64_t n_tokens, int64_t n_heads, float scale, float* o_lat, cudaStream_t stream) {
  if (cache.kv_lora_rank > int64_t(kMaxLatentPerThread) * kThreads)
    cuda_failed(cudaErrorInvalidValue, "MLA with kv_lora_rank above 1024", __FILE__, __LINE__);
  const MlaArgs args{q_lat, q, q_stride, nope, cache, positions, seq_ids, n_heads, scale, o_lat};
  const size_t shared = size_t(cache.row()) * sizeof(float);
  mla_kernel<<<dim3(unsigned(n_tokens), unsigned(n_heads)), kThreads, shared, stream>>>(args);
  TANDEM_CUDA_CHECK_LAUNCH(mla_kernel);
}

}  // namespace tandem::cuda
