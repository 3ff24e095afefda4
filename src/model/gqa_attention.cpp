// Grouped-query attention, the shared block of qwen3moe, gpt-oss and glm4moe (transformer.h):
// the q, k and v products (with biases where the file has them), per-head QK-norm, rope, the
// keys and values stored in the layer's cache, attention (window, sinks), the output product.
#include <fmt/format.h>

#include "core/error.h"
#include "model/transformer.h"
#include "model/transformer_internal.h"

namespace tandem {

Transformer::GqaWeights Transformer::bind_gqa(uint32_t il, const GqaConfig& c, int64_t window) {
  Backend& on = *devices_.layers[il];
  const std::string blk = fmt::format("blk.{}.", il);
  const int64_t embd = info_.n_embd, q_dims = c.n_head * c.head_dim;
  const int64_t k_dims = c.n_head_kv * c.head_dim, v_dims = c.n_head_kv * c.v_head_dim;
  auto optional_f32 = [&](const std::string& name, int64_t n, bool required) -> const float* {
    if (!required && !binder_.has(name)) return nullptr;
    return binder_.f32(name, {n}, on);
  };
  GqaWeights w;
  w.q = binder_.matrix(blk + "attn_q.weight", {embd, q_dims}, on);
  w.k = binder_.matrix(blk + "attn_k.weight", {embd, k_dims}, on);
  w.v = binder_.matrix(blk + "attn_v.weight", {embd, v_dims}, on);
  w.output = binder_.matrix(blk + "attn_output.weight", {c.n_head * c.v_head_dim, embd}, on);
  w.q_bias = optional_f32(blk + "attn_q.bias", q_dims, c.needs_qkv_bias);
  w.k_bias = optional_f32(blk + "attn_k.bias", k_dims, c.needs_qkv_bias);
  w.v_bias = optional_f32(blk + "attn_v.bias", v_dims, c.needs_qkv_bias);
  w.output_bias = optional_f32(blk + "attn_output.bias", embd, c.needs_output_bias);
  w.q_norm = optional_f32(blk + "attn_q_norm.weight", c.head_dim, c.needs_qk_norm);
  w.k_norm = optional_f32(blk + "attn_k_norm.weight", c.head_dim, c.needs_qk_norm);
  if ((w.q_norm == nullptr) != (w.k_norm == nullptr))
    fail("{}: layer {} has only one of attn_q_norm and attn_k_norm; QK-norm needs both",
         binder_.file().name(), il);
  w.sinks = optional_f32(blk + "attn_sinks.weight", c.n_head, c.needs_sinks);
  w.window = window;
  return w;
}

void Transformer::gqa_attention(const GqaConfig& c, const GqaWeights& w, LayerStep& s) {
  using W = Workspace;
  Backend& be = s.be;
  const int64_t T = s.n_tokens, H = c.n_head, KV = c.n_head_kv, hd = c.head_dim;
  const KernelChoice kernels = s.batch.kernels;
  const ActivationBits bits = c.projections_like_ffn ? ffn_activations_ : ActivationBits::Sixteen;
  float* q = s.ws.get(W::kQuery, T * H * hd);  // [T, H, hd]
  float* k = s.ws.get(W::kKeys, T * KV * hd);  // [T, KV, hd]
  float* v = s.ws.get(W::kValues, T * KV * c.v_head_dim);
  float* attn = s.ws.get(W::kAttention, T * H * c.v_head_dim);
  be.matmul({.weight = w.q,
             .input = s.h,
             .output = q,
             .n_tokens = T,
             .kernels = kernels,
             .bias = w.q_bias,
             .activations = bits});
  be.matmul({.weight = w.k,
             .input = s.h,
             .output = k,
             .n_tokens = T,
             .kernels = kernels,
             .bias = w.k_bias,
             .activations = bits});
  be.matmul({.weight = w.v,
             .input = s.h,
             .output = v,
             .n_tokens = T,
             .kernels = kernels,
             .bias = w.v_bias,
             .activations = bits});
  if (w.q_norm) {  // each head normed on its own, before rope
    be.rms_norm({.input = q,
                 .weight = w.q_norm,
                 .output = q,
                 .n_rows = T * H,
                 .dim = hd,
                 .input_stride = hd,
                 .output_stride = hd,
                 .eps = rms_eps_});
    be.rms_norm({.input = k,
                 .weight = w.k_norm,
                 .output = k,
                 .n_rows = T * KV,
                 .dim = hd,
                 .input_stride = hd,
                 .output_stride = hd,
                 .eps = rms_eps_});
  }
  be.rope({.data = q,
           .positions = s.in.positions,
           .n_tokens = T,
           .n_heads = H,
           .head_stride = hd,
           .token_stride = H * hd,
           .offset = 0,
           .params = c.rope});
  be.rope({.data = k,
           .positions = s.in.positions,
           .n_tokens = T,
           .n_heads = KV,
           .head_stride = hd,
           .token_stride = KV * hd,
           .offset = 0,
           .params = c.rope});
  be.kv_store({.rows = k,
               .cache = s.cache,
               .positions = s.in.positions,
               .seq_ids = s.in.seq_ids,
               .n_tokens = T,
               .values = v});
  be.attention({.q = q,
                .cache = s.cache,
                .positions = s.in.positions,
                .seq_ids = s.in.seq_ids,
                .n_tokens = T,
                .n_heads = H,
                .n_kv_heads = KV,
                .head_dim = hd,
                .v_head_dim = c.v_head_dim,
                .scale = c.scale,
                .output = attn,
                .window = w.window,
                .sinks = w.sinks});
  be.matmul({.weight = w.output,
             .input = attn,
             .output = s.out,
             .n_tokens = T,
             .kernels = kernels,
             .bias = w.output_bias,
             .activations = bits});
}

}  // namespace tandem
