// Expert routing and the bookkeeping of the grouped MoE on the GPU (the products themselves are
// in matmul.cu). Routing is backends/moe_routing.h's route_token, the CPU's code, one thread per
// token: a decode step routes a few tokens over at most a few hundred experts, so the kernel is
// latency, not throughput; what matters is that it stays on the device, so that the step needs
// no host round trip and can be captured as a graph.
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/route_steps.cuh"
#include "backends/cuda/row_steps.cuh"
#include "backends/moe_routing.h"
#include "core/replica_choice.h"

namespace tandem::cuda {
namespace {

constexpr int kTile = 64;  // entries per tile of the tiled expert kernels (matmul.cu)

constexpr int kWarp = 32;
constexpr int kRouteWarps = 4;  // tokens per block of the routing kernel

__global__ void __launch_bounds__(kRouteWarps* kWarp) route_kernel(MoeRouteOp op, RouteParams p) {
  extern __shared__ float route_smem[];
  const int warp = threadIdx.x / kWarp;
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + warp;
  if (t >= op.n_tokens) return;
  route_token_warp(op, p, t, route_smem + warp * route_smem_floats(p));
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

// Element i of MoeReduceOp: the weighted sum and the fused residual add.
__device__ __forceinline__ void reduce_element(const MoeReduceOp& op, int64_t i) {
  const int64_t t = i / op.dim, d = i % op.dim;
  float sum = 0.0f;
  for (int64_t k = 0; k < op.top_k; ++k)  // in routing order, as the CPU
    sum = __fadd_rn(
        sum, __fmul_rn(op.weights[t * op.top_k + k], op.slots[(t * op.top_k + k) * op.dim + d]));
  op.output[i] = sum;
  if (op.residual) {  // the fused residual add, in the unfused order (rounded adds, no fma)
    float x = __fadd_rn(op.residual[i], sum);
    if (op.shared) x = __fadd_rn(x, op.shared[i]);
    op.residual[i] = x;
  }
}

__global__ void reduce_kernel(MoeReduceOp op) {
  const int64_t n = op.n_tokens * op.dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    reduce_element(op, i);
}

// With the next layer's norm (MoeReduceOp::norm_weight): a block per token, its row summed, then
// rms_norm_kernel's steps on it. Each thread reads back only the elements it wrote (the stride
// of block_rms_scale), so no barrier between.
__global__ void __launch_bounds__(kNormThreads) reduce_norm_kernel(MoeReduceOp op) {
  const int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < op.dim; d += kNormThreads) reduce_element(op, t * op.dim + d);
  const float* x = op.residual + t * op.dim;
  const float scale = block_rms_scale(x, op.dim, op.norm_eps);
  float* y = op.norm_output + t * op.dim;
  for (int64_t d = threadIdx.x; d < op.dim; d += kNormThreads)
    y[d] = __fmul_rn(__fmul_rn(x[d], scale), op.norm_weight[d]);
}

// One block: one thread runs the rule (serial by nature: each choice depends on the loads before
// it; only decode steps use copies, with fewer slots than the layer has experts), then all write
// the index.
__global__ void pick_replicas_kernel(ReplicaPickOp op) {
  extern __shared__ int32_t chosen[];  // [n_expert]
  __shared__ int32_t load[kMaxReplicaShards];
  for (int64_t e = threadIdx.x; e < op.n_expert; e += blockDim.x) chosen[e] = -1;
  __syncthreads();
  if (threadIdx.x == 0)
    choose_replicas(op.expert_ids, op.n_slots, op.holders, op.max_holders, op.n_expert,
                    op.busy_shard, op.busy_load, chosen, load);
  __syncthreads();
  for (int64_t e = threadIdx.x; e < op.n_expert; e += blockDim.x)
    op.step_local_index[e] = chosen[e] == op.shard ? op.local_index[e] : -1;
}

unsigned blocks_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

void moe_route(const MoeRouteOp& op, cudaStream_t stream) {
  const RouteParams p = route_params(op);
  if (p.top_k > 16 || p.n_groups > 8 * kWarp)
    cuda_failed(cudaErrorInvalidValue, "routing with top_k above 16 or above 256 groups", __FILE__,
                __LINE__);
  const size_t shared = size_t(kRouteWarps * route_smem_floats(p)) * sizeof(float);
  launch("route_kernel", route_kernel, unsigned((op.n_tokens + kRouteWarps - 1) / kRouteWarps),
         kRouteWarps * kWarp, shared, stream, op, p);
}

void moe_sort(const int32_t* expert_ids, const int32_t* local_index, int64_t n_slots, int64_t held,
              int32_t* order, int32_t* expert_of, int32_t* n_active, int32_t* tile_first,
              int32_t* tile_count, int32_t* n_tiles, int64_t max_tiles, cudaStream_t stream) {
  launch("sort_kernel", sort_kernel, 1, 256, size_t(held) * sizeof(int32_t), stream, expert_ids,
         local_index, n_slots, held, order, expert_of, n_active, tile_first, tile_count, n_tiles,
         max_tiles);
}

void pick_replicas(const ReplicaPickOp& op, cudaStream_t stream) {
  launch("pick_replicas_kernel", pick_replicas_kernel, 1, 256,
         size_t(op.n_expert) * sizeof(int32_t), stream, op);
}

void moe_reduce(const MoeReduceOp& op, cudaStream_t stream) {
  if (op.norm_weight)
    return launch("reduce_norm_kernel", reduce_norm_kernel, unsigned(op.n_tokens), kNormThreads, 0,
                  stream, op);
  launch("reduce_kernel", reduce_kernel, blocks_for(op.n_tokens * op.dim, 256), 256, 0, stream, op);
}

}  // namespace tandem::cuda
