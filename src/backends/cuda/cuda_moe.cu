// Expert routing and the bookkeeping of the grouped MoE on the GPU (the products themselves are
// in matmul.cu). Routing is backends/moe_routing.h's route_token, the CPU's code, one thread per
// token: a decode step routes a few tokens over at most a few hundred experts, so the kernel is
// latency, not throughput; what matters is that it stays on the device, so that the step needs
// no host round trip and can be captured as a graph.
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/moe_routing.h"
#include "core/replica_choice.h"

namespace tandem::cuda {
namespace {

constexpr int kTile = 64;  // entries per tile of the tiled expert kernels (matmul.cu)

constexpr int kWarp = 32;
constexpr int kRouteWarps = 4;  // tokens per block of the routing kernel

// One warp per token: route_token's steps (backends/moe_routing.h) with the per-expert loops on
// 32 lanes and the scores in shared memory. A single thread per token, as the CPU runs it, took
// ~100 us a layer on an H200 (global-memory scratch, one expert at a time). The choices are the
// same: maxima and top-k picks under ranks_before (a total order) do not depend on the order of
// the comparisons; the softmax denominator is summed by a fixed tree (the CPU sums in expert
// order: the weights agree within rounding).
__global__ void __launch_bounds__(kRouteWarps* kWarp) route_kernel(MoeRouteOp op, RouteParams p) {
  extern __shared__ float route_smem[];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + warp;
  if (t >= op.n_tokens) return;
  const int64_t E = p.n_expert;
  float* probs = route_smem + warp * (2 * E + p.n_groups);
  float* selection = probs + E;
  float* group_scores = selection + E;
  const float* logits = op.logits + t * E;
  float max_logit = logits[0];  // route_token's rule: NaN in front stays, later NaNs are skipped
  if (p.gating == MoeGating::Softmax && max_logit == max_logit) {
    float m = -INFINITY;
    for (int64_t e = lane; e < E; e += kWarp) m = fmaxf(m, logits[e]);
    for (int offset = kWarp / 2; offset > 0; offset /= 2)
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    max_logit = fmaxf(max_logit, m);
  }
  float sum = 0.0f;
  for (int64_t e = lane; e < E; e += kWarp)
    sum += probs[e] = gate_probability(p.gating, logits[e], max_logit);
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  for (int64_t e = lane; e < E; e += kWarp) {
    if (p.gating == MoeGating::Softmax) probs[e] /= sum;
    selection[e] = probs[e] + (op.bias ? op.bias[e] : 0.0f);
  }
  __syncwarp();
  if (p.n_groups > 1 && p.n_groups_used < p.n_groups) {
    const int64_t per_group = E / p.n_groups;
    for (int64_t g = lane; g < p.n_groups; g += kWarp)
      group_scores[g] = group_score(p.gating, selection + g * per_group, per_group);
    __syncwarp();
    bool kept[8];  // a lane's groups, decided before any selection score changes
    for (int64_t g = lane, i = 0; g < p.n_groups && i < 8; g += kWarp, ++i)
      kept[i] = group_kept(p, group_scores, g);
    __syncwarp();
    for (int64_t g = lane, i = 0; g < p.n_groups && i < 8; g += kWarp, ++i)
      if (!kept[i])
        for (int64_t j = 0; j < per_group; ++j) selection[g * per_group + j] = -INFINITY;
    __syncwarp();
  }
  int32_t* ids = op.expert_ids + t * p.top_k;
  int32_t picked[16];  // top_k <= 16: moe_route checks
  for (int64_t k = 0; k < p.top_k; ++k) {
    float best_score = 0.0f;
    int32_t best = -1;
    for (int64_t e = lane; e < E; e += kWarp)
      if (may_pick(selection, picked, k, e))
        keep_better(best_score, best, selection[e], int32_t(e));
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float other_score = __shfl_xor_sync(0xffffffffu, best_score, offset);
      const int32_t other = __shfl_xor_sync(0xffffffffu, best, offset);
      keep_better(best_score, best, other_score, other);
    }
    picked[k] = best;
  }
  if (lane != 0) return;
  for (int64_t k = 0; k < p.top_k; ++k) ids[k] = picked[k];
  route_weights(p, probs, picked, op.expert_weights + t * p.top_k);
  if (op.counts)
    for (int64_t k = 0; k < p.top_k; ++k)
      atomicAdd(reinterpret_cast<unsigned long long*>(op.counts + picked[k]), 1ull);
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
    if (op.residual) {  // the fused residual add, in the unfused order (rounded adds, no fma)
      float x = __fadd_rn(op.residual[i], sum);
      if (op.shared) x = __fadd_rn(x, op.shared[i]);
      op.residual[i] = x;
    }
  }
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
  const size_t shared = size_t(kRouteWarps * (2 * p.n_expert + p.n_groups)) * sizeof(float);
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
  launch("reduce_kernel", reduce_kernel, blocks_for(op.n_tokens * op.dim, 256), 256, 0, stream, op);
}

}  // namespace tandem::cuda
