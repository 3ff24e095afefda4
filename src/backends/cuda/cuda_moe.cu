// Expert routing and the bookkeeping of the grouped MoE on the GPU (the products themselves are
// in matmul.cu). Routing is backends/moe_routing.h's route_token, the CPU's code, one thread per
// token: a decode step routes a few tokens over at most a few hundred experts, so the kernel is
// latency, not throughput; what matters is that it stays on the device, so that the step needs
// no host round trip and can be captured as a graph.
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/moe_routing.h"

namespace tandem::cuda {
namespace {

constexpr int kTile = 64;  // entries per tile of the tiled expert kernels (matmul.cu)

__global__ void route_kernel(MoeRouteOp op, RouteParams p, float* scratch) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= op.n_tokens) return;
  float* probs = scratch + t * (2 * p.n_expert + p.n_groups);
  float* selection = probs + p.n_expert;
  float* group_scores = selection + p.n_expert;
  int32_t* ids = op.expert_ids + t * p.top_k;
  route_token(p, op.logits + t * p.n_expert, op.bias, probs, selection, group_scores, ids,
              op.expert_weights + t * p.top_k);
  if (op.counts)
    for (int64_t k = 0; k < p.top_k; ++k)
      atomicAdd(reinterpret_cast<unsigned long long*>(op.counts + ids[k]), 1ull);
}

// One block. Counting in parallel, then one thread lays out the order (stable, so the sorted
// order and the tiles depend only on the routing) and the tiles. A prompt chunk of 512 tokens
// with 8 experts each is 4096 slots: tens of microseconds, small beside its products.
__global__ void sort_kernel(const int32_t* expert_ids, const int32_t* local_index, int64_t n_slots,
                            int64_t held, int32_t* order, int32_t* expert_of, int32_t* n_active,
                            int32_t* tile_first, int32_t* tile_count, int32_t* n_tiles,
                            int64_t max_tiles) {
  extern __shared__ int32_t counts[];  // [held]: then the next free position of each expert
  for (int64_t m = threadIdx.x; m < held; m += blockDim.x) counts[m] = 0;
  __syncthreads();
  for (int64_t s = threadIdx.x; s < n_slots; s += blockDim.x) {
    const int32_t e = expert_ids[s];
    if (e < 0 || (!local_index && e >= held)) __trap();  // routing wrote it: a bug if out of range
    const int32_t m = local_index ? local_index[e] : e;
    if (m >= held) __trap();
    if (m >= 0) atomicAdd(&counts[m], 1);
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  int32_t total = 0, tiles = 0;
  for (int64_t m = 0; m < held; ++m) {
    const int32_t c = counts[m];
    for (int32_t f = 0; f < c; f += kTile) {
      if (tiles < max_tiles) {
        tile_first[tiles] = total + f;
        tile_count[tiles] = c - f < kTile ? c - f : kTile;
      }
      ++tiles;
    }
    counts[m] = total;
    total += c;
  }
  for (int64_t s = 0; s < n_slots; ++s) {
    const int32_t e = expert_ids[s];
    const int32_t m = local_index ? local_index[e] : e;
    if (m < 0) continue;
    const int32_t at = counts[m]++;
    order[at] = int32_t(s);
    expert_of[at] = m;
  }
  n_active[0] = total;
  n_tiles[0] = tiles < max_tiles ? tiles : int32_t(max_tiles);
}

__global__ void reduce_kernel(MoeReduceOp op) {
  const int64_t n = op.n_tokens * op.dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / op.dim, d = i % op.dim;
    float sum = 0.0f;
    for (int64_t k = 0; k < op.top_k; ++k)  // in routing order, as the CPU
      sum = __fadd_rn(
          sum, __fmul_rn(op.weights[t * op.top_k + k], op.slots[(t * op.top_k + k) * op.dim + d]));
    op.output[i] = sum;
  }
}

unsigned blocks_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

int64_t moe_route_scratch_floats(const MoeRouteOp& op) {
  return op.n_tokens * (2 * op.n_expert + op.n_groups);
}

void moe_route(const MoeRouteOp& op, float* scratch, cudaStream_t stream) {
  const int threads = 64;
  route_kernel<<<unsigned((op.n_tokens + threads - 1) / threads), threads, 0, stream>>>(
      op, route_params(op), scratch);
  TANDEM_CUDA_CHECK_LAUNCH(route_kernel);
}

void moe_sort(const int32_t* expert_ids, const int32_t* local_index, int64_t n_slots, int64_t held,
              int32_t* order, int32_t* expert_of, int32_t* n_active, int32_t* tile_first,
              int32_t* tile_count, int32_t* n_tiles, int64_t max_tiles, cudaStream_t stream) {
  sort_kernel<<<1, 256, size_t(held) * sizeof(int32_t), stream>>>(
      expert_ids, local_index, n_slots, held, order, expert_of, n_active, tile_first, tile_count,
      n_tiles, max_tiles);
  TANDEM_CUDA_CHECK_LAUNCH(sort_kernel);
}

void moe_reduce(const MoeReduceOp& op, cudaStream_t stream) {
  reduce_kernel<<<blocks_for(op.n_tokens * op.dim, 256), 256, 0, stream>>>(op);
  TANDEM_CUDA_CHECK_LAUNCH(reduce_kernel);
}

}  // namespace tandem::cuda
