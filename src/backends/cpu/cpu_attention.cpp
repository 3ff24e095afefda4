// RoPE (angles from backends/rope_angles.h), multi-head latent attention and grouped-query
// attention on the CPU.
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/few_query_attention.h"
#include "backends/cpu/matmul.h"
#include "backends/rope_angles.h"
#include "core/error.h"

namespace tandem::cpu {

void CpuBackend::rope(const RopeOp& op) {
  const RopeParams& p = op.params;
  TANDEM_CHECK(p.rope_dims % 2 == 0);
  const int64_t half = p.rope_dims / 2;
  const YarnRamp ramp = yarn_ramp(p);
  float* cos_sin = grow(scratch_d_, size_t(2 * half));
  for (int64_t t = 0; t < op.n_tokens; ++t) {
    const float pos = float(op.positions[t]);
    for (int64_t i = 0; i < half; ++i)
      rope_cos_sin(p, ramp.low, ramp.high, pos, i, &cos_sin[2 * i], &cos_sin[2 * i + 1]);
    // Pair i is dims (2i, 2i + 1), or (i, i + half) in the NeoX layout.
    const int64_t first_stride = p.neox ? 1 : 2, second_offset = p.neox ? half : 1;
    for (int64_t h = 0; h < op.n_heads; ++h) {
      float* x = op.data + t * op.token_stride + h * op.head_stride + op.offset;
      for (int64_t i = 0; i < half; ++i) {
        float& a = x[first_stride * i];
        float& b = x[first_stride * i + second_offset];
        const float x0 = a, x1 = b;
        const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
        a = x0 * c - x1 * s;
        b = x0 * s + x1 * c;
      }
    }
  }
}

void CpuBackend::mla_attention(const MlaAttentionOp& op) {
  const int64_t T = op.n_tokens, H = op.n_heads, nope = op.nope_dims;
  const int64_t lora = op.cache.kv_lora_rank, rope = op.cache.rope_dims, row = op.cache.row();
  const int64_t q_stride = nope + rope;
  if (op.rotate_queries) this->rope(query_rope(op));  // MlaAttentionOp::rotate_queries

  // Absorb the key up-projection into the query, all heads as one parallel job (at decode each
  // head's matmul is tiny, and a fork/join per head cost more than the arithmetic):
  // q_lat[h] = k_b[h] · q_nope[h]  ([T, nope] -> [T, kv_lora]).
  float* q_nope = grow(scratch_a_, size_t(H * T * nope));
  float* q_lat = grow(scratch_b_, size_t(H * T * lora));
  matmul_args_.clear();
  for (int64_t h = 0; h < H; ++h) {
    copy_rows(q_nope + h * T * nope, nope, op.q + h * q_stride, H * q_stride, T, nope);
    matmul_args_.push_back({.weight_type = op.k_b.type,
                            .weights = op.k_b.matrix(h).data,
                            .rows = lora,
                            .cols = nope,
                            .input = q_nope + h * T * nope,
                            .n_tokens = T,
                            .output = q_lat + h * T * lora,
                            .kernels = op.kernels});
  }
  cpu::matmul_many(matmul_args_, pool_);

  // Per chunk of a sequence's tokens: every (token, head) query [q_lat | q_rope] against the
  // cache rows [latent | rope key], softmax and weighted sums of the latent rows in one pass over
  // the keys (few_query_attention.h attend(): a token's result depends only on its own queries
  // and keys, so it is the same in a prompt chunk and alone).
  float* o_lat = grow(scratch_c_, size_t(H * T * lora));
  for (int64_t run_start = 0; run_start < T;) {
    int64_t run_end = run_start + 1;
    while (run_end < T && op.seq_ids[run_end] == op.seq_ids[run_start]) ++run_end;
    const void* cache = static_cast<const std::byte*>(op.cache.data) +
                        int64_t(op.seq_ids[run_start]) * op.cache.n_ctx * op.cache.row_bytes();
    // A chunk's queries stay few: 256 at most (a token's heads at least).
    constexpr int64_t kMaxQueries = 256;
    const int64_t chunk = std::clamp<int64_t>(kMaxQueries / H, 1, run_end - run_start);
    for (int64_t first = run_start; first < run_end; first += chunk) {
      const int64_t last = std::min(run_end, first + chunk), n_queries = (last - first) * H;
      float* queries = grow(scratch_a_, size_t(n_queries * row));
      for (int64_t t = first; t < last; ++t) {
        for (int64_t h = 0; h < H; ++h) {
          float* qrow = queries + ((t - first) * H + h) * row;
          std::copy_n(q_lat + (h * T + t) * lora, lora, qrow);
          std::copy_n(op.q + (t * H + h) * q_stride + nope, rope, qrow + lora);
        }
      }
      cpu::attend({.x = queries,
                   .x_stride = row,
                   .n_tokens = last - first,
                   .heads = H,
                   .last_key = op.positions + first,
                   .keys = cache,
                   .key_stride = row,
                   .cols = row,
                   .n_out = lora,
                   .scale = op.scale,
                   .out = o_lat + first * lora,
                   .out_token_stride = lora,
                   .out_head_stride = T * lora,
                   .cache_type = op.cache.type},
                  pool_);
    }
    run_start = run_end;
  }

  // Expand each head's latent output through its value projection, all heads as one parallel
  // job: [T, kv_lora] -> [T, v_head].
  float* v_out = grow(scratch_a_, size_t(H * T * op.v_head_dims));
  matmul_args_.clear();
  for (int64_t h = 0; h < H; ++h)
    matmul_args_.push_back({.weight_type = op.v_b.type,
                            .weights = op.v_b.matrix(h).data,
                            .rows = op.v_head_dims,
                            .cols = lora,
                            .input = o_lat + h * T * lora,
                            .n_tokens = T,
                            .output = v_out + h * T * op.v_head_dims,
                            .kernels = op.kernels});
  cpu::matmul_many(matmul_args_, pool_);
  for (int64_t h = 0; h < H; ++h)
    copy_rows(op.output + h * op.v_head_dims, H * op.v_head_dims, v_out + h * T * op.v_head_dims,
              op.v_head_dims, T, op.v_head_dims);
}

}  // namespace tandem::cpu

namespace tandem::cpu {

// Grouped-query attention: the few-query kernels over each sequence's key/value rows, the query
// heads of one kv head scoring its keys and summing its values (AttendArgs' kv groups).
void CpuBackend::attention(const AttentionOp& op) {
  const KvLayerView& c = op.cache;
  const int64_t H = op.n_heads, kv = op.n_kv_heads, row = c.row();
  TANDEM_CHECK(kv >= 1 && H % kv == 0 && c.k_dims == kv * op.head_dim &&
               c.v_dims == kv * op.v_head_dim && op.window >= 0);
  if (c.ring) TANDEM_CHECK(op.window > 0 && op.window <= c.n_ctx);
  if (first_key_scratch_.size() < size_t(op.n_tokens))
    first_key_scratch_.resize(size_t(op.n_tokens));
  int32_t* first_keys = first_key_scratch_.data();
  for (int64_t t = 0; t < op.n_tokens; ++t)
    first_keys[t] =
        op.window > 0 ? std::max<int32_t>(0, op.positions[t] - int32_t(op.window) + 1) : 0;
  for (int64_t run_start = 0; run_start < op.n_tokens;) {
    int64_t run_end = run_start + 1;
    while (run_end < op.n_tokens && op.seq_ids[run_end] == op.seq_ids[run_start]) ++run_end;
    TANDEM_CHECK(op.seq_ids[run_start] >= 0 && op.seq_ids[run_start] < c.n_seq);
    const std::byte* rows = static_cast<const std::byte*>(c.data) +
                            int64_t(op.seq_ids[run_start]) * c.n_ctx * c.row_bytes();
    // A call's queries stay few (its parts' buffers grow with them): 1024 at most.
    const int64_t chunk = std::clamp<int64_t>(1024 / H, 1, run_end - run_start);
    for (int64_t first = run_start; first < run_end; first += chunk) {
      const int64_t last = std::min(run_end, first + chunk);
      attend({.x = op.q + first * H * op.head_dim,
              .x_stride = op.head_dim,
              .n_tokens = last - first,
              .heads = H,
              .last_key = op.positions + first,
              .keys = rows,
              .key_stride = row,
              .cols = op.head_dim,
              .n_out = op.v_head_dim,
              .scale = op.scale,
              .out = op.output + first * H * op.v_head_dim,
              .out_token_stride = H * op.v_head_dim,
              .out_head_stride = op.v_head_dim,
              .kv_groups = kv,
              .key_group_offset = op.head_dim,
              .values = rows + c.k_dims * c.value_bytes(),
              .value_stride = row,
              .value_group_offset = op.v_head_dim,
              .first_key = first_keys + first,
              .ring = c.ring ? c.n_ctx : 0,
              .sinks = op.sinks,
              .cache_type = c.type},
             pool_);
    }
    run_start = run_end;
  }
}

}  // namespace tandem::cpu
