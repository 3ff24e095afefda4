// Matrix products on the GPU straight from the GGUF blocks: every format's weights are decoded
// by quant/block_decode.h and block_dot.h (the same code the host tests check against src/quant)
// and multiplied with F32 activations, or, for the expert products at decode where the precision
// policy allows it, with 8-bit ones (block_dot_q8.h). Two kernel families, as on the CPU:
//
// - Rows (decode, and KernelChoice::PerToken): one warp per one to four weight rows, each lane
//   taking every 32nd step of 32 weights for up to 8 tokens, then a shuffle tree across the warp.
//   A token's terms are added in the same order whatever the token count and the rows a warp
//   takes, so its result is the same alone or beside others (batch invariance). The H200 profile
//   (README, Performance): with F32 activations a step costs ~4 instructions a weight, so the
//   kernel streams ~900 GB/s of the 4200 the memory gives; dp4a on 8-bit activations ~1.3.
// - Tiled (prompts, expert batches): 64 rows x 64 tokens per block of 4 warps; each 64 x 32 tile
//   of weights is decoded once into shared memory and multiplied by the tensor cores (WMMA
//   m16n16k8 in TF32). TF32 keeps 10 mantissa bits, so each operand is split into a high and a
//   low TF32 part and three products are summed (hi·hi + hi·lo + lo·hi): F32 accuracy, because
//   the fixtures' V3 routing flips on bf16-sized errors (DESIGN.md, precision per op). A token's
//   column is computed from its own activations in a fixed order, so its result does not depend
//   on its tile mates.
#include <mma.h>

#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/route_steps.cuh"
#include "backends/ffn_activation.h"
#include "quant/block_decode.h"
#include "quant/block_dot.h"
#include "quant/block_dot_q8.h"

namespace tandem::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kRowsPerBlock = 4;   // one warp per row
constexpr int kMaxRowTokens = 8;   // tokens sharing one pass over the weights
constexpr int kTile = 64;          // tiled kernel: rows and tokens per block
constexpr int kTileK = 32;         // columns per shared-memory step
constexpr int kLd = kTileK + 4;    // padded row of a shared tile (WMMA wants a multiple of 4)
constexpr int kLdOut = kTile + 4;  // padded row of the output tile

__device__ __forceinline__ float warp_sum(float v) {
  // A butterfly: every lane ends with the same bits (a + b == b + a), in a fixed order.
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// `W` activations from x into registers: float4 loads when the rows allow them.
template <int W>
__device__ __forceinline__ void stage(const float* x, bool aligned, float (&out)[W]) {
  if (aligned) {
#pragma unroll
    for (int i = 0; i < W / 4; ++i) {
      const float4 v = reinterpret_cast<const float4*>(x)[i];
      out[4 * i] = v.x, out[4 * i + 1] = v.y, out[4 * i + 2] = v.z, out[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) out[i] = x[i];
  }
}

// One step of a lane along a weight row: 32 weights of a quantized format (quant/block_dot.h:
// scales once per 32, quants to floats without the conversion unit), or 8 of a float format
// (decode8). Step s covers columns [kWidth s, kWidth (s + 1)).
template <class Dec>
struct RowSteps {
  using Dot = blocks::BlockDot<Dec::kType>;
  static constexpr bool kDot32 = Dot::kChunks > 0;
  static constexpr int kWidth = kDot32 ? 32 : 8;

  template <int NT, class X>
  __device__ __forceinline__ static void step(const uint8_t* row, int64_t s, const X& x,
                                              float (&acc)[NT]) {
    if constexpr (kDot32) {
      Dot::template dot32<NT>(row + (s / Dot::kChunks) * Dec::kBytes, int(s % Dot::kChunks), x,
                              acc);
    } else {
      constexpr int kGroups = Dec::kElems / 8;
      float w[8];
      Dec::decode8(row + (s / kGroups) * Dec::kBytes, int(s % kGroups), w);
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[t] = fmaf(w[i], x[t][i], acc[t]);
    }
  }
};

// acc[r][t] = rows[r] · x[t] over `cols`, summed across the warp; every lane ends with the sums.
// Lane l takes steps l, l + 32, ...: consecutive lanes read consecutive weights and activations.
// With one or two tokens their activations are staged in registers once per step and serve all
// R rows (the F32 activations are 4 bytes a weight against ~0.56 for Q4_K: without the reuse the
// L1 traffic, not the memory, would set the pace); with more, each is read where it is.
template <class Dec, int NT, int R>
__device__ __forceinline__ void warp_dots(const uint8_t* const (&rows)[R], int64_t cols,
                                          const float* const (&x)[NT], bool aligned,
                                          float (&acc)[R][NT]) {
  using Steps = RowSteps<Dec>;
  constexpr int W = Steps::kWidth;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  if constexpr (NT <= 2) {
    // Decode. Two steps unrolled: a lane's loads for both are in flight together (a 2048-column
    // Q4_K row is two steps a lane, so without it each warp waited for memory twice in a row).
#pragma unroll 2
    for (int64_t s = lane; s < cols / W; s += kWarpSize) {
      float staged[NT][W];
#pragma unroll
      for (int t = 0; t < NT; ++t) stage<W>(x[t] + W * s, aligned, staged[t]);
#pragma unroll
      for (int r = 0; r < R; ++r) Steps::template step<NT>(rows[r], s, staged, acc[r]);
    }
  } else {
    for (int64_t s = lane; s < cols / W; s += kWarpSize) {
      const float* here[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) here[t] = x[t] + W * s;
#pragma unroll
      for (int r = 0; r < R; ++r) Steps::template step<NT>(rows[r], s, here, acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]);
}

// Rows per warp where the launch does not say: two where the activations are staged (they serve
// both), else one. More rows a warp put more loads in flight and read the staged activations
// fewer times; fewer make more warps. A row's sum is the same whichever a warp takes.
__host__ __device__ constexpr int default_rows_per_warp(int n_tokens) {
  return n_tokens <= 2 ? 2 : 1;
}

// ---- rows: plain matmul, batched over matrices ----

template <class Dec, int NT, int R>
__device__ __forceinline__ void rows_products(const MatmulLaunch& m, int64_t token0, bool aligned) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row0 = (int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize) * R;
  const bool second = m.second_weights && blockIdx.y == 1;  // the pair's other matrix
  const int64_t mat = second ? 0 : blockIdx.y, n_rows = second ? m.second_rows : m.rows;
  if (row0 >= n_rows) return;
  const uint8_t* base = second
                            ? static_cast<const uint8_t*>(m.second_weights)
                            : static_cast<const uint8_t*>(m.weights) + uint64_t(mat) * m.mat_bytes;
  const uint8_t* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r)  // a row past the end repeats the last one; its result is dropped
    rows[r] = base + uint64_t(row0 + r < n_rows ? row0 + r : n_rows - 1) * m.row_bytes;
  const float* x[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t)
    x[t] = m.input + mat * m.input_mat_stride + (token0 + t) * m.input_stride;
  float acc[R][NT];
  warp_dots<Dec, NT, R>(rows, m.cols, x, aligned, acc);
  if (lane == 0) {
    const int64_t stride = second ? m.second_rows : m.output_stride;
    float* y = second ? m.second_output + token0 * stride
                      : m.output + mat * m.output_mat_stride + token0 * stride;
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (row0 + r < n_rows)
#pragma unroll
        for (int t = 0; t < NT; ++t) y[t * stride + row0 + r] = acc[r][t];
  }
}

template <class Dec, int NT, int R>
__global__ void __launch_bounds__(kRowsPerBlock* kWarpSize)
    rows_kernel(MatmulLaunch m, int64_t token0, bool aligned) {
  rows_products<Dec, NT, R>(m, token0, aligned);
}

// ---- the router: its logits, then in the block that finishes last the routing ----

// Blocks of 32 activations quantized (blocks::quantize_act32), a thread each, the grid's threads
// striding over them: quantize_q8_kernel's steps, also run inside the router's launch.
__device__ __forceinline__ void quantize_blocks_q8(const float* x, int64_t n_blocks, bool aligned,
                                                   blocks::ActQ8* out) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < n_blocks;
       b += int64_t(gridDim.x) * blockDim.x) {
    float v[32];
    stage<32>(x + 32 * b, aligned, v);
    blocks::ActQ8 q;
    blocks::quantize_act32(v, q);
    out[b] = q;
  }
}

// MoeRouteOp with its router product: rows_kernel's products for the step's tokens (F32 weights,
// as GGUF files keep routers), then the block that finishes last (counted on `done`, which it
// resets for the next launch) adds the bias as add_row_bias_kernel does and routes each token, a
// warp each, with route_kernel's steps: the bits of the three launches it replaces. With
// `input_q8`, every block first quantizes its share of the input for the experts
// (MoeRouteOp::prepare_experts_input), as quantize_q8_kernel does.
// (Min one block an SM: without it ptxas held the kernel to 64 registers and spilled.)
template <int NT>
__global__ void __launch_bounds__(kRowsPerBlock* kWarpSize, 1)
    router_route_kernel(MatmulLaunch m, bool aligned, MoeRouteOp op, RouteParams p, unsigned* done,
                        blocks::ActQ8* input_q8) {
  if (input_q8) quantize_blocks_q8(m.input, m.n_tokens * m.cols / 32, aligned, input_q8);
  rows_products<blocks::Decoder<DType::F32>, NT, default_rows_per_warp(NT)>(m, 0, aligned);
  __shared__ bool last;
  __threadfence();  // this block's logits before its count
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x * gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // every other block's logits after their counts
  if (op.router_bias) {
    for (int64_t i = threadIdx.x; i < op.n_tokens * op.n_expert; i += blockDim.x)
      op.logits[i] = __fadd_rn(op.logits[i], op.router_bias[i % op.n_expert]);
    __syncthreads();
  }
  extern __shared__ float route_scratch[];
  const int warp = threadIdx.x / kWarpSize;
  for (int64_t t = warp; t < op.n_tokens; t += kRowsPerBlock)
    route_token_warp(op, p, t, route_scratch + warp * route_smem_floats(p));
  if (threadIdx.x == 0) *done = 0;
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

template <class Dec, int NT, int R>
void launch_rows_by(const MatmulLaunch& m, int64_t token0, bool aligned, cudaStream_t stream) {
  const int64_t rows_per_block = kRowsPerBlock * R;
  const int64_t rows = m.second_weights && m.second_rows > m.rows ? m.second_rows : m.rows;
  const dim3 grid(unsigned((rows + rows_per_block - 1) / rows_per_block),
                  unsigned(m.second_weights ? 2 : m.n_mats));
  launch("rows_kernel", rows_kernel<Dec, NT, R>, grid, kRowsPerBlock * kWarpSize, 0, stream, m,
         token0, aligned);
}

// The choice of rows per warp is offered for one token (decode) only: each variant is a kernel
// per format to compile (nvcc's time for this file grows with them), and two tokens keep two
// rows a warp, more tokens one.
template <class Dec, int NT>
void launch_rows(const MatmulLaunch& m, int64_t token0, cudaStream_t stream) {
  const bool aligned = aligned16(m.input) && m.input_stride % 4 == 0 && m.input_mat_stride % 4 == 0;
  const int r = m.rows_per_warp > 0 ? m.rows_per_warp : default_rows_per_warp(int(NT));
  if constexpr (NT == 1) {
    if (r >= 4) return launch_rows_by<Dec, NT, 4>(m, token0, aligned, stream);
    if (r == 2) return launch_rows_by<Dec, NT, 2>(m, token0, aligned, stream);
    return launch_rows_by<Dec, NT, 1>(m, token0, aligned, stream);
  } else {
    (void)r;
    launch_rows_by<Dec, NT, default_rows_per_warp(NT)>(m, token0, aligned, stream);
  }
}

// ---- tiled: tensor-core tiles with rows and tokens mapped by a Map ----

// Where a tile's weights, inputs and outputs are. Plain: token tile blockIdx.y of matrix
// blockIdx.z. Experts: tile blockIdx.y of the sorted slots (its expert's matrix).
struct PlainMap {
  MatmulLaunch m;
  // Sets the weights of this block and the rows of its tile's tokens; returns their count.
  __device__ int setup(const uint8_t** weights, const float** in, float** out) const {
    const int64_t mat = blockIdx.z, first = int64_t(blockIdx.y) * kTile;
    *weights = static_cast<const uint8_t*>(m.weights) + uint64_t(mat) * m.mat_bytes;
    const int n = int(m.n_tokens - first < kTile ? m.n_tokens - first : kTile);
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      in[j] = m.input + mat * m.input_mat_stride + (first + j) * m.input_stride;
      out[j] = m.output + mat * m.output_mat_stride + (first + j) * m.output_stride;
    }
    return n;
  }
};

// Sorted expert entries. gate/up: input row = the entry's token, output row = the entry.
// down: input row = the entry, output row = the entry's slot.
struct ExpertMap {
  const uint8_t* stack;
  uint64_t mat_bytes;
  ExpertSlots s;
  const float* input;
  int64_t input_stride;
  float* output;
  int64_t output_stride;
  bool down;
  __device__ int setup(const uint8_t** weights, const float** in, float** out) const {
    const int tile = blockIdx.y;
    if (tile >= s.n_tiles[0]) return 0;
    const int first = s.tile_first[tile], n = s.tile_count[tile];
    *weights = stack + uint64_t(s.expert_of[first]) * mat_bytes;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const int entry = first + j, slot = s.order[entry];
      in[j] = input + (down ? entry : slot / s.top_k) * input_stride;
      out[j] = output + (down ? slot : entry) * output_stride;
    }
    return n;
  }
};

using namespace nvcuda;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;

// v = hi + lo with both parts exact in TF32 (lo holds the next 11 bits).
template <class Frag>
__device__ __forceinline__ void split_tf32(Frag& hi, Frag& lo) {
#pragma unroll
  for (int i = 0; i < hi.num_elements; ++i) {
    const float v = hi.x[i];
    const float h = wmma::__float_to_tf32(v);
    hi.x[i] = h;
    lo.x[i] = wmma::__float_to_tf32(v - h);
  }
}

template <class Dec, class Map>
__global__ void __launch_bounds__(128)
    tiled_kernel(Map map, int64_t rows, int64_t cols, uint64_t row_bytes) {
  __shared__ __align__(128) float smem[2 * kTile * kLd];  // weights | tokens; then the output
  __shared__ const float* in_rows[kTile];
  __shared__ float* out_rows[kTile];
  __shared__ const uint8_t* weights;
  __shared__ int n_tokens;
  float* w_tile = smem;                // [64 rows][kLd]
  float* x_tile = smem + kTile * kLd;  // [64 tokens][kLd]
  const int tid = threadIdx.x, warp = tid / kWarpSize;
  const int64_t row0 = int64_t(blockIdx.x) * kTile;
  {
    const uint8_t* w = nullptr;
    const int n = map.setup(&w, in_rows, out_rows);
    if (tid == 0) n_tokens = n, weights = w;
  }
  __syncthreads();
  const int n = n_tokens;
  if (n == 0) return;

  // Warp (wr, wt) computes rows [32 wr, +32) x tokens [32 wt, +32) of the tile: 2 x 2 fragments.
  const int wr = warp / 2, wt = warp % 2;
  FragC acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  constexpr int kGroupsPerBlock = Dec::kElems / 8;

  for (int64_t k0 = 0; k0 < cols; k0 += kTileK) {
    // 64 rows x 4 groups of 8 weights, two per thread.
    for (int item = tid; item < kTile * (kTileK / 8); item += blockDim.x) {
      const int r = item / (kTileK / 8), gq = item % (kTileK / 8);
      const int64_t row = row0 + r, col = k0 + 8 * gq;
      float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (row < rows && col < cols) {
        const int64_t g = col / 8;
        Dec::decode8(weights + uint64_t(row) * row_bytes + (g / kGroupsPerBlock) * Dec::kBytes,
                     int(g % kGroupsPerBlock), v);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) w_tile[r * kLd + 8 * gq + i] = v[i];
    }
    // 64 tokens x 32 activations, a warp reading one token's 32 consecutive floats at a time.
    for (int item = tid; item < kTile * kTileK; item += blockDim.x) {
      const int j = item / kTileK, c = item % kTileK;
      const int64_t col = k0 + c;
      x_tile[j * kLd + c] = j < n && col < cols ? in_rows[j][col] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 8) {
      FragA a_hi[2], a_lo[2];
      FragB b_hi[2], b_lo[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        wmma::load_matrix_sync(a_hi[i], w_tile + (32 * wr + 16 * i) * kLd + kk, kLd);
        split_tf32(a_hi[i], a_lo[i]);
        wmma::load_matrix_sync(b_hi[i], x_tile + (32 * wt + 16 * i) * kLd + kk, kLd);
        split_tf32(b_hi[i], b_lo[i]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {  // small terms first
          wmma::mma_sync(acc[i][j], a_lo[i], b_hi[j], acc[i][j]);
          wmma::mma_sync(acc[i][j], a_hi[i], b_lo[j], acc[i][j]);
          wmma::mma_sync(acc[i][j], a_hi[i], b_hi[j], acc[i][j]);
        }
    }
    __syncthreads();
  }

  float* out_tile = smem;  // [64 rows][kLdOut], over the input tiles (all warps are past them)
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(out_tile + (32 * wr + 16 * i) * kLdOut + 32 * wt + 16 * j, acc[i][j],
                              kLdOut, wmma::mem_row_major);
  __syncthreads();
  for (int e = tid; e < kTile * kTile; e += blockDim.x) {
    const int j = e / kTile, r = e % kTile;  // consecutive threads write consecutive rows
    if (j < n && row0 + r < rows) out_rows[j][row0 + r] = out_tile[r * kLdOut + j];
  }
}

static_assert(kTile * kLdOut <= 2 * kTile * kLd, "the output tile reuses the input tiles' memory");

template <class Dec, class Map>
void launch_tiled(const Map& map, int64_t rows, int64_t cols, uint64_t row_bytes, unsigned tiles,
                  unsigned mats, cudaStream_t stream) {
  const dim3 grid(unsigned((rows + kTile - 1) / kTile), tiles, mats);
  launch("tiled_kernel", tiled_kernel<Dec, Map>, grid, 128, 0, stream, map, rows, cols, row_bytes);
}

// ---- experts, rows path: one warp per (R rows, entry), entries sorted or not (ExpertSlots) ----

// Rows a warp of the expert kernels takes: gate/up takes R rows of each (2R row streams).
constexpr int kExpertGateUpRows = 1, kExpertDownRows = 2;

// acc[r][t] = rows[r] · x[t] over `cols` with ActQ8 activations, summed across the warp: lane l
// takes 32-weight chunks l, l + 32, ... as warp_dots does, each chunk's activations loaded once
// for all R rows.
template <class Dec, class Dot, int NT, int R>
__device__ __forceinline__ void warp_dots_q8(const uint8_t* const (&rows)[R], int64_t cols,
                                             const blocks::ActQ8* const (&x)[NT],
                                             float (&acc)[R][NT]) {
  constexpr int kChunks = Dec::kElems / 32;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
#pragma unroll 2
  for (int64_t s = lane; s < cols / 32; s += kWarpSize) {
    blocks::ActQ8 staged[NT];
    const blocks::ActQ8* here[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) staged[t] = x[t][s], here[t] = &staged[t];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      blocks::Quants32 q;
      Dot::quants32(rows[r] + (s / kChunks) * Dec::kBytes, int(s % kChunks), q);
      blocks::dot32_q8<Dec::kType, NT>(q, here, acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]);
}

// The activations an expert kernel multiplies, row `i` of a [rows, cols] matrix: F32 (the
// rows kernels' steps, block_dot.h) or ActQ8 blocks (dp4a steps, block_dot_q8.h).
struct F32Input {
  const float* data;
  bool aligned;
  // The rows starting `floats` further on (the shared experts' activations).
  __device__ F32Input shifted(int64_t floats) const {
    return {data + floats, aligned && floats % 4 == 0};
  }
  template <class Dec, int R>
  __device__ void dots(const uint8_t* const (&rows)[R], int64_t cols, int64_t i,
                       float (&acc)[R][1]) const {
    const float* x[1] = {data + i * cols};
    warp_dots<Dec, 1, R>(rows, cols, x, aligned, acc);
  }
};

template <class Dot>
struct Q8Input {
  const blocks::ActQ8* data;
  __device__ Q8Input shifted(int64_t floats) const { return {data + floats / 32}; }
  template <class Dec, int R>
  __device__ void dots(const uint8_t* const (&rows)[R], int64_t cols, int64_t i,
                       float (&acc)[R][1]) const {
    const blocks::ActQ8* x[1] = {data + i * (cols / 32)};
    warp_dots_q8<Dec, Dot, 1, R>(rows, cols, x, acc);
  }
};

// Entry i's local expert (-1: none here, skipped) and slot, sorted or not (ExpertSlots).
__device__ __forceinline__ int32_t entry_expert(const ExpertSlots& s, int entry) {
  if (!s.expert_ids) return entry < s.n_active[0] ? s.expert_of[entry] : -1;
  const int32_t e = s.expert_ids[entry];
  if (e < 0) __trap();  // routing wrote it: negative is a bug (the range is the routing's)
  return s.local_index ? s.local_index[e] : e;
}

__device__ __forceinline__ int32_t entry_slot(const ExpertSlots& s, int entry) {
  return s.expert_ids ? entry : s.order[entry];
}

// The activation of one entry's gate and up products with the expert's biases added first (the
// CPU's order: the products, the adds, then the activation).
__device__ __forceinline__ float expert_activation(const ExpertBiases& b, int64_t expert,
                                                   int64_t ffn, int64_t row, float g, float u) {
  if (b.gate) g = __fadd_rn(g, b.gate[expert * ffn + row]);
  if (b.up) u = __fadd_rn(u, b.up[expert * ffn + row]);
  return ffn_activation(b.activation, g, u);
}

// act[i][r] = activation(gate_e[r] · x, up_e[r] · x) for the entry's token x: the gate and up
// rows share the staged activations. Entries past the routed slots are the tokens' shared
// experts (ExpertSlots::shared): their own matrices and row count, SwiGLU without biases (the
// dense FFN they are defined as), activations after the routed entries'.
template <class Dec, int R, class Input>
__global__ void __launch_bounds__(kRowsPerBlock* kWarpSize)
    expert_gate_up_rows(const uint8_t* gate, const uint8_t* up, int64_t ffn, int64_t dim,
                        uint64_t row_bytes, uint64_t mat_bytes, Input input, ExpertSlots s,
                        float* act, ExpertBiases b) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row0 = (int64_t(blockIdx.y) * kRowsPerBlock + threadIdx.x / kWarpSize) * R;
  const int entry = blockIdx.x;  // on x: a prompt chunk can have more entries than y allows
  const bool shared = entry >= s.max_slots;
  const int64_t n_rows = shared ? s.shared.ffn : ffn;
  if (row0 >= n_rows) return;
  const int32_t expert = shared ? 0 : entry_expert(s, entry);
  if (expert < 0) return;
  const uint8_t* gate_matrix = shared ? s.shared.gate : gate + uint64_t(expert) * mat_bytes;
  const uint8_t* up_matrix = shared ? s.shared.up : up + uint64_t(expert) * mat_bytes;
  const uint8_t* rows[2 * R];
#pragma unroll
  for (int r = 0; r < R; ++r) {  // a row past the end repeats the last one; its result is dropped
    const uint64_t offset = uint64_t(row0 + r < n_rows ? row0 + r : n_rows - 1) * row_bytes;
    rows[2 * r] = gate_matrix + offset, rows[2 * r + 1] = up_matrix + offset;
  }
  const int64_t token = shared ? entry - s.max_slots : entry_slot(s, entry) / s.top_k;
  float acc[2 * R][1];
  input.template dots<Dec, 2 * R>(rows, dim, token, acc);
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (row0 + r >= n_rows) continue;
      if (shared)
        act[s.max_slots * ffn + token * n_rows + row0 + r] =
            ffn_activation(FfnActivation::SwiGlu, acc[2 * r][0], acc[2 * r + 1][0]);
      else
        act[int64_t(entry) * ffn + row0 + r] =
            expert_activation(b, expert, ffn, row0 + r, acc[2 * r][0], acc[2 * r + 1][0]);
    }
}

template <class Dec, int R, class Input>
__global__ void __launch_bounds__(kRowsPerBlock* kWarpSize)
    expert_down_rows(const uint8_t* down, int64_t dim, int64_t ffn, uint64_t row_bytes,
                     uint64_t mat_bytes, Input act, ExpertSlots s, float* slots,
                     const float* down_bias) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row0 = (int64_t(blockIdx.y) * kRowsPerBlock + threadIdx.x / kWarpSize) * R;
  const int entry = blockIdx.x;
  if (row0 >= dim) return;
  const bool shared = entry >= s.max_slots;  // a token's shared experts (as in gate/up)
  const int32_t expert = shared ? 0 : entry_expert(s, entry);
  if (expert < 0) return;
  const uint8_t* matrix = shared ? s.shared.down : down + uint64_t(expert) * mat_bytes;
  const uint64_t bytes = shared ? s.shared.down_row_bytes : row_bytes;
  const uint8_t* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    rows[r] = matrix + uint64_t(row0 + r < dim ? row0 + r : dim - 1) * bytes;
  const int64_t token = entry - s.max_slots;
  float acc[R][1];
  const Input in = shared ? act.shifted(s.max_slots * ffn) : act;
  in.template dots<Dec, R>(rows, shared ? s.shared.ffn : ffn, shared ? token : entry, acc);
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (row0 + r >= dim) continue;
      if (shared)  // moe_reduce of the one slot: 0 + w · product
        s.shared.output[token * dim + row0 + r] =
            __fadd_rn(0.0f, __fmul_rn(s.shared.weights[token], acc[r][0]));
      else
        slots[int64_t(entry_slot(s, entry)) * dim + row0 + r] =
            down_bias ? __fadd_rn(acc[r][0], down_bias[int64_t(expert) * dim + row0 + r])
                      : acc[r][0];
    }
}

template <class Dec, class Input>
void launch_expert_gate_up(const void* gate, const void* up, int64_t ffn, int64_t dim,
                           uint64_t row_bytes, uint64_t mat_bytes, const Input& input,
                           const ExpertSlots& s, float* act, const ExpertBiases& b,
                           cudaStream_t stream) {
  constexpr int R = kExpertGateUpRows, per_block = kRowsPerBlock * R;
  const int64_t rows = s.shared.gate && s.shared.ffn > ffn ? s.shared.ffn : ffn;
  const dim3 grid(unsigned(s.max_slots + (s.shared.gate ? s.shared.n_tokens : 0)),
                  unsigned((rows + per_block - 1) / per_block));
  launch("expert_gate_up_rows", expert_gate_up_rows<Dec, R, Input>, grid, kRowsPerBlock * kWarpSize,
         0, stream, static_cast<const uint8_t*>(gate), static_cast<const uint8_t*>(up), ffn, dim,
         row_bytes, mat_bytes, input, s, act, b);
}

template <class Dec, class Input>
void launch_expert_down(const void* down, int64_t dim, int64_t ffn, uint64_t row_bytes,
                        uint64_t mat_bytes, const Input& act, const ExpertSlots& s, float* slots,
                        const float* down_bias, cudaStream_t stream) {
  constexpr int R = kExpertDownRows, per_block = kRowsPerBlock * R;
  const dim3 grid(unsigned(s.max_slots + (s.shared.gate ? s.shared.n_tokens : 0)),
                  unsigned((dim + per_block - 1) / per_block));
  launch("expert_down_rows", expert_down_rows<Dec, R, Input>, grid, kRowsPerBlock * kWarpSize, 0,
         stream, static_cast<const uint8_t*>(down), dim, ffn, row_bytes, mat_bytes, act, s, slots,
         down_bias);
}

// One thread per block of 32 activations.
__global__ void quantize_q8_kernel(const float* x, int64_t n_blocks, bool aligned,
                                   blocks::ActQ8* out) {
  quantize_blocks_q8(x, n_blocks, aligned, out);
}

// The tiled path's activation, after its gate and up products.
__global__ void expert_activation_kernel(const float* gate, const float* up, float* act,
                                         ExpertSlots s, int64_t ffn, ExpertBiases b) {
  const int64_t n = int64_t(s.n_active[0]) * ffn;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    act[i] = expert_activation(b, s.expert_of[i / ffn], ffn, i % ffn, gate[i], up[i]);
}

// The tiled down products' biases: slots[order[i]] += bias of entry i's expert.
__global__ void expert_down_bias_kernel(float* slots, ExpertSlots s, int64_t dim,
                                        const float* bias) {
  const int64_t n = int64_t(s.n_active[0]) * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t entry = i / dim, r = i % dim;
    float& y = slots[int64_t(s.order[entry]) * dim + r];
    y = __fadd_rn(y, bias[int64_t(s.expert_of[entry]) * dim + r]);
  }
}

template <class Fn>
void visit_or_fail(DType type, Fn&& fn) {
  const bool known = blocks::visit_decoder(type, fn);
  if (!known)
    cuda_failed(cudaErrorInvalidValue, "a weight format without a GPU decoder", __FILE__, __LINE__);
}

}  // namespace

bool matmul_supports(DType type) {
  return blocks::has_block_decoder(type);
}

// The formats whose row kernels take one token at a time, a launch per token: the ones a file
// holds only in its routed experts (the MoE kernels multiply those) or in single-format bench
// files. Fewer kernels to compile (each row width is one more per format: this file's nvcc time
// grows with them); the same per-token arithmetic, so the same results, as a wider kernel gives.
template <class Dec>
constexpr bool kOneTokenRows = is_iq_grid(Dec::kType) || Dec::kType == DType::Q4_1 ||
                               Dec::kType == DType::MXFP4 || Dec::kType == DType::TQ1_0 ||
                               Dec::kType == DType::TQ2_0;

void matmul_rows(const MatmulLaunch& m, cudaStream_t stream) {
  visit_or_fail(m.type, [&](auto dec) {
    using Dec = decltype(dec);
    if constexpr (kOneTokenRows<Dec>) {
      for (int64_t t = 0; t < m.n_tokens; ++t) launch_rows<Dec, 1>(m, t, stream);
    } else {
      for (int64_t t0 = 0; t0 < m.n_tokens; t0 += kMaxRowTokens) {
        switch (m.n_tokens - t0 < kMaxRowTokens ? int(m.n_tokens - t0) : kMaxRowTokens) {
          case 1:
            launch_rows<Dec, 1>(m, t0, stream);
            break;
          case 2:
            launch_rows<Dec, 2>(m, t0, stream);
            break;
          case 3:
            launch_rows<Dec, 3>(m, t0, stream);
            break;
          case 4:
            launch_rows<Dec, 4>(m, t0, stream);
            break;
          case 5:
            launch_rows<Dec, 5>(m, t0, stream);
            break;
          case 6:
            launch_rows<Dec, 6>(m, t0, stream);
            break;
          case 7:
            launch_rows<Dec, 7>(m, t0, stream);
            break;
          default:
            launch_rows<Dec, 8>(m, t0, stream);
            break;
        }
      }
    }
  });
}

bool can_route_with_router(const MoeRouteOp& op) {
  const RouteParams p = route_params(op);
  return op.router.type == DType::F32 && op.n_tokens <= kMaxRowTokens && p.top_k <= 16 &&
         p.n_groups <= 8 * kWarpSize;
}

void router_then_route(const MatmulLaunch& m, const MoeRouteOp& op, unsigned* done,
                       blocks::ActQ8* input_q8, cudaStream_t stream) {
  const RouteParams p = route_params(op);
  // The quantized input is read as one run of n_tokens * cols floats, as quantize_q8 reads it.
  if (input_q8 && (m.input_stride != m.cols || m.cols % 32 != 0))
    cuda_failed(cudaErrorInvalidValue, "a router input to quantize that is not whole rows of 32",
                __FILE__, __LINE__);
  const bool aligned = aligned16(m.input) && m.input_stride % 4 == 0;
  const size_t scratch = size_t(kRowsPerBlock * route_smem_floats(p)) * sizeof(float);
  auto go = [&](auto kernel, int nt) {
    const int64_t per_block = kRowsPerBlock * default_rows_per_warp(nt);
    launch("router_route_kernel", kernel, unsigned((m.rows + per_block - 1) / per_block),
           kRowsPerBlock * kWarpSize, scratch, stream, m, aligned, op, p, done, input_q8);
  };
  switch (op.n_tokens) {
    case 1:
      return go(router_route_kernel<1>, 1);
    case 2:
      return go(router_route_kernel<2>, 2);
    case 3:
      return go(router_route_kernel<3>, 3);
    case 4:
      return go(router_route_kernel<4>, 4);
    case 5:
      return go(router_route_kernel<5>, 5);
    case 6:
      return go(router_route_kernel<6>, 6);
    case 7:
      return go(router_route_kernel<7>, 7);
    default:
      return go(router_route_kernel<8>, 8);
  }
}

void matmul_tiled(const MatmulLaunch& m, cudaStream_t stream) {
  visit_or_fail(m.type, [&](auto dec) {
    using Dec = decltype(dec);
    const unsigned token_tiles = unsigned((m.n_tokens + kTile - 1) / kTile);
    launch_tiled<Dec>(PlainMap{m}, m.rows, m.cols, m.row_bytes, token_tiles, unsigned(m.n_mats),
                      stream);
    if (!m.second_weights) return;
    MatmulLaunch second = m;  // the pair's other matrix: its own tiles
    second.weights = m.second_weights, second.rows = m.second_rows;
    second.output = m.second_output, second.output_stride = m.second_rows;
    second.second_weights = nullptr;
    launch_tiled<Dec>(PlainMap{second}, second.rows, m.cols, m.row_bytes, token_tiles, 1, stream);
  });
}

void expert_gate_up(DType type, const void* gate, const void* up, int64_t ffn, int64_t dim,
                    uint64_t row_bytes, uint64_t mat_bytes, const float* input,
                    const ExpertSlots& s, float* gate_out, float* up_out, float* act, bool tiled,
                    const ExpertBiases& b, cudaStream_t stream) {
  visit_or_fail(type, [&](auto dec) {
    using Dec = decltype(dec);
    const auto* gate_bytes = static_cast<const uint8_t*>(gate);
    const auto* up_bytes = static_cast<const uint8_t*>(up);
    if (!tiled) {
      launch_expert_gate_up<Dec>(gate, up, ffn, dim, row_bytes, mat_bytes,
                                 F32Input{input, aligned16(input) && dim % 4 == 0}, s, act, b,
                                 stream);
      return;
    }
    const ExpertMap gate_map{gate_bytes, mat_bytes, s, input, dim, gate_out, ffn, /*down=*/false};
    const ExpertMap up_map{up_bytes, mat_bytes, s, input, dim, up_out, ffn, /*down=*/false};
    launch_tiled<Dec>(gate_map, ffn, dim, row_bytes, unsigned(s.max_tiles), 1, stream);
    launch_tiled<Dec>(up_map, ffn, dim, row_bytes, unsigned(s.max_tiles), 1, stream);
    launch("expert_activation_kernel", expert_activation_kernel, 1024, 256, 0, stream, gate_out,
           up_out, act, s, ffn, b);
  });
}

void expert_down(DType type, const void* down, int64_t dim, int64_t ffn, uint64_t row_bytes,
                 uint64_t mat_bytes, const float* act, const ExpertSlots& s, float* slots,
                 bool tiled, const ExpertBiases& b, cudaStream_t stream) {
  visit_or_fail(type, [&](auto dec) {
    using Dec = decltype(dec);
    const auto* down_bytes = static_cast<const uint8_t*>(down);
    if (!tiled) {
      launch_expert_down<Dec>(down, dim, ffn, row_bytes, mat_bytes,
                              F32Input{act, aligned16(act) && ffn % 4 == 0}, s, slots, b.down,
                              stream);
      return;
    }
    const ExpertMap map{down_bytes, mat_bytes, s, act, ffn, slots, dim, /*down=*/true};
    launch_tiled<Dec>(map, dim, ffn, row_bytes, unsigned(s.max_tiles), 1, stream);
    if (b.down) {
      launch("expert_down_bias_kernel", expert_down_bias_kernel, 1024, 256, 0, stream, slots, s,
             dim, b.down);
    }
  });
}

bool matmul_supports_q8(DType type) {
  return blocks::visit_block_dot_q8(type, [](auto, auto) {});
}

void quantize_q8(const float* x, int64_t n, blocks::ActQ8* out, cudaStream_t stream) {
  const int64_t n_blocks = n / 32;
  if (n_blocks == 0) return;
  const int64_t grid = (n_blocks + 127) / 128;
  launch("quantize_q8_kernel", quantize_q8_kernel, unsigned(grid < 4096 ? grid : 4096), 128, 0,
         stream, x, n_blocks, aligned16(x), out);
}

template <class Fn>
void visit_q8_or_fail(DType type, Fn&& fn) {
  if (!blocks::visit_block_dot_q8(type, fn))
    cuda_failed(cudaErrorInvalidValue, "a weight format without an 8-bit GPU step", __FILE__,
                __LINE__);
}

void expert_gate_up_q8(DType type, const void* gate, const void* up, int64_t ffn, int64_t dim,
                       uint64_t row_bytes, uint64_t mat_bytes, const blocks::ActQ8* input,
                       const ExpertSlots& s, float* act, const ExpertBiases& b,
                       cudaStream_t stream) {
  visit_q8_or_fail(type, [&](auto dec, auto dot) {
    launch_expert_gate_up<decltype(dec)>(gate, up, ffn, dim, row_bytes, mat_bytes,
                                         Q8Input<decltype(dot)>{input}, s, act, b, stream);
  });
}

void expert_down_q8(DType type, const void* down, int64_t dim, int64_t ffn, uint64_t row_bytes,
                    uint64_t mat_bytes, const blocks::ActQ8* act, const ExpertSlots& s,
                    float* slots, const ExpertBiases& b, cudaStream_t stream) {
  visit_q8_or_fail(type, [&](auto dec, auto dot) {
    launch_expert_down<decltype(dec)>(down, dim, ffn, row_bytes, mat_bytes,
                                      Q8Input<decltype(dot)>{act}, s, slots, b.down, stream);
  });
}

}  // namespace tandem::cuda
