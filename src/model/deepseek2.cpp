#include "model/deepseek2.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "gguf/gguf_file.h"
#include "quant/quant.h"

namespace tandem {

// Weights of one block; shapes in [rows, cols] of the matrices as the ops see them.
struct Deepseek2Model::Layer {
  const float* attn_norm = nullptr;  // [n_embd]
  WeightView q;                      // [n_head * (nope + rope), n_embd]   (no q LoRA)
  WeightView q_a;                    // [q_lora, n_embd]                   (q LoRA)
  const float* q_a_norm = nullptr;   // [q_lora]
  WeightView q_b;                    // [n_head * (nope + rope), q_lora]
  WeightView kv_a_mqa;               // [kv_lora + rope, n_embd]: latent and shared rope key
  const float* kv_a_norm = nullptr;  // [kv_lora]
  WeightView k_b;                    // n_head x [kv_lora, nope]: absorbs the key projection
  WeightView v_b;                    // n_head x [v_head, kv_lora]
  WeightView attn_output;            // [n_embd, n_head * v_head]
  const float* ffn_norm = nullptr;   // [n_embd]

  // Dense layers: one SwiGLU FFN, as a one-expert stack.
  WeightView ffn_gate, ffn_up, ffn_down;  // [n_ff, n_embd], [n_ff, n_embd], [n_embd, n_ff]
  // MoE layers.
  WeightView router;                       // [n_expert, n_embd] F32 logits
  const float* expert_bias = nullptr;      // [n_expert] selection-only bias (V3), or null
  WeightView gate_exps, up_exps, down_exps;  // n_expert x the dense shapes with n_ff_expert
  WeightView gate_shexp, up_shexp, down_shexp;  // shared experts, width n_ff_expert * n_shared
  bool moe = false;
};

// Activation buffers on the backend, sized for the largest batch seen so far.
struct Deepseek2Model::Workspace {
  int64_t n_tokens = 0, n_logit_rows = 0;
  std::shared_ptr<DeviceBuffer> x;        // [T, n_embd] residual stream
  std::shared_ptr<DeviceBuffer> h;        // [T, n_embd] normed input of a sub-layer
  std::shared_ptr<DeviceBuffer> q_a;      // [T, q_lora]
  std::shared_ptr<DeviceBuffer> q;        // [T, n_head, nope + rope]
  std::shared_ptr<DeviceBuffer> kv;       // [T, kv_lora + rope]
  std::shared_ptr<DeviceBuffer> attn;     // [T, n_head * v_head]
  std::shared_ptr<DeviceBuffer> out;      // [T, n_embd] sub-layer output
  std::shared_ptr<DeviceBuffer> router;   // [T, n_expert]
  std::shared_ptr<DeviceBuffer> last;     // [rows, n_embd] hidden states that need logits
  std::shared_ptr<DeviceBuffer> logits;   // [rows, n_vocab]
  std::vector<int32_t> expert_ids;        // [T, top_k] (host)
  std::vector<float> expert_weights;      // [T, top_k] (host)
  std::vector<int32_t> dense_ids;         // [T] zeros: a dense FFN is expert 0 of 1
  std::vector<float> dense_weights;       // [T] ones
};

Deepseek2Model::Deepseek2Model(const gguf::GgufFile& file, Backend& backend)
    : hp_(read_deepseek2_hparams(file)), backend_(backend), binder_(file, backend) {
  const int64_t embd = hp_.n_embd, vocab = hp_.n_vocab;
  token_embd_ = binder_.matrix("token_embd.weight", {embd, vocab});
  output_norm_ = binder_.f32("output_norm.weight", {embd});
  // Some files tie the LM head to the embeddings.
  output_ = binder_.has("output.weight") ? binder_.matrix("output.weight", {embd, vocab}) : token_embd_;

  // V3 files may append multi-token-prediction blocks; inference does not use them.
  n_layers_ = hp_.n_layer - hp_.n_nextn_layers;
  layers_.resize(n_layers_);
  for (uint32_t il = 0; il < layers_.size(); ++il) {
    Layer& l = layers_[il];
    const std::string blk = fmt::format("blk.{}.", il);
    l.attn_norm = binder_.f32(blk + "attn_norm.weight", {embd});
    bind_attention(l, il);
    l.ffn_norm = binder_.f32(blk + "ffn_norm.weight", {embd});
    l.moe = hp_.is_moe_layer(il);
    if (!l.moe) {
      const int64_t ff = hp_.n_ff_dense;
      l.ffn_gate = binder_.matrix(blk + "ffn_gate.weight", {embd, ff});
      l.ffn_up = binder_.matrix(blk + "ffn_up.weight", {embd, ff});
      l.ffn_down = binder_.matrix(blk + "ffn_down.weight", {ff, embd});
      continue;
    }
    const int64_t ff = hp_.n_ff_expert, n_exp = hp_.n_expert;
    l.router = binder_.matrix(blk + "ffn_gate_inp.weight", {embd, n_exp});
    if (binder_.has(blk + "exp_probs_b.bias")) l.expert_bias = binder_.f32(blk + "exp_probs_b.bias", {n_exp});
    l.gate_exps = binder_.matrix(blk + "ffn_gate_exps.weight", {embd, ff, n_exp});
    l.up_exps = binder_.matrix(blk + "ffn_up_exps.weight", {embd, ff, n_exp});
    l.down_exps = binder_.matrix(blk + "ffn_down_exps.weight", {ff, embd, n_exp});
    if (hp_.n_expert_shared > 0) {
      const int64_t shared_ff = ff * hp_.n_expert_shared;
      l.gate_shexp = binder_.matrix(blk + "ffn_gate_shexp.weight", {embd, shared_ff});
      l.up_shexp = binder_.matrix(blk + "ffn_up_shexp.weight", {embd, shared_ff});
      l.down_shexp = binder_.matrix(blk + "ffn_down_shexp.weight", {shared_ff, embd});
    }
  }

  rope_.rope_dims = hp_.qk_rope_dim;
  rope_.freq_base = hp_.rope_freq_base;
  float mscale = 1.0f;
  if (hp_.rope_scaling == RopeScaling::Yarn && hp_.rope_scaling_factor > 1.0f) {
    rope_.freq_scale = 1.0f / hp_.rope_scaling_factor;
    rope_.ext_factor = 1.0f;
    rope_.original_ctx = hp_.rope_original_ctx;
    rope_.beta_fast = hp_.yarn_beta_fast;
    rope_.beta_slow = hp_.yarn_beta_slow;
    // YaRN's attention temperature: the metadata stores 0.1 * mscale_all_dim.
    mscale = 1.0f + hp_.yarn_log_multiplier * std::log(hp_.rope_scaling_factor);
  }
  attention_scale_ = mscale * mscale / std::sqrt(float(hp_.qk_head_dim()));
}

Deepseek2Model::~Deepseek2Model() = default;

void Deepseek2Model::bind_attention(Layer& l, uint32_t il) {
  const std::string blk = fmt::format("blk.{}.", il);
  const int64_t embd = hp_.n_embd, heads = hp_.n_head, nope = hp_.qk_nope_dim;
  const int64_t lora = hp_.kv_lora_rank, v_head = hp_.v_head_dim;
  const int64_t q_dim = heads * hp_.qk_head_dim();
  if (hp_.q_lora_rank > 0) {
    l.q_a = binder_.matrix(blk + "attn_q_a.weight", {embd, hp_.q_lora_rank});
    l.q_a_norm = binder_.f32(blk + "attn_q_a_norm.weight", {hp_.q_lora_rank});
    l.q_b = binder_.matrix(blk + "attn_q_b.weight", {hp_.q_lora_rank, q_dim});
  } else {
    l.q = binder_.matrix(blk + "attn_q.weight", {embd, q_dim});
  }
  l.kv_a_mqa = binder_.matrix(blk + "attn_kv_a_mqa.weight", {embd, hp_.kv_cache_dims()});
  l.kv_a_norm = binder_.f32(blk + "attn_kv_a_norm.weight", {lora});
  l.attn_output = binder_.matrix(blk + "attn_output.weight", {heads * v_head, embd});
  if (binder_.has(blk + "attn_k_b.weight") || !binder_.has(blk + "attn_kv_b.weight")) {
    l.k_b = binder_.matrix(blk + "attn_k_b.weight", {nope, lora, heads});
    l.v_b = binder_.matrix(blk + "attn_v_b.weight", {lora, v_head, heads});
    return;
  }
  // Older files store the combined up-projection attn_kv_b: per head, nope key rows then v_head
  // value rows, each over the latent. The absorbed form needs the key part transposed, so both
  // halves are rebuilt once here (in F32 for F32 files, Q8_0 otherwise).
  const gguf::TensorInfo& kv_b = binder_.info(blk + "attn_kv_b.weight", {lora, heads * (nope + v_head)});
  std::vector<float> rows(kv_b.n_elements);
  dequantize_row(kv_b.type, kv_b.data, rows.data(), int64_t(kv_b.n_elements));
  std::vector<float> k_b(size_t(heads * lora * nope)), v_b(size_t(heads * v_head * lora));
  for (int64_t h = 0; h < heads; ++h) {
    const float* head = rows.data() + h * (nope + v_head) * lora;
    for (int64_t i = 0; i < nope; ++i)
      for (int64_t j = 0; j < lora; ++j) k_b[size_t((h * lora + j) * nope + i)] = head[i * lora + j];
    std::copy_n(head + nope * lora, v_head * lora, v_b.data() + h * v_head * lora);
  }
  const DType type = kv_b.type == DType::F32 || nope % 32 != 0 ? DType::F32 : DType::Q8_0;
  l.k_b = binder_.owned(k_b, type, nope, lora, heads, blk + "attn_k_b (from attn_kv_b)");
  l.v_b = binder_.owned(v_b, type, lora, v_head, heads, blk + "attn_v_b (from attn_kv_b)");
}

void Deepseek2Model::ensure_workspace(int64_t n_tokens, int64_t n_logit_rows) {
  if (ws_ && ws_->n_tokens >= n_tokens && ws_->n_logit_rows >= n_logit_rows) return;
  auto ws = std::make_unique<Workspace>();
  ws->n_tokens = std::max<int64_t>(n_tokens, ws_ ? ws_->n_tokens : 0);
  ws->n_logit_rows = std::max<int64_t>(n_logit_rows, ws_ ? ws_->n_logit_rows : 0);
  const int64_t T = ws->n_tokens;
  auto floats = [&](int64_t n, const char* what) {
    return backend_.allocate(size_t(std::max<int64_t>(n, 1)) * sizeof(float), what);
  };
  ws->x = floats(T * hp_.n_embd, "residual stream");
  ws->h = floats(T * hp_.n_embd, "normed activations");
  ws->q_a = floats(T * hp_.q_lora_rank, "q LoRA activations");
  ws->q = floats(T * hp_.n_head * hp_.qk_head_dim(), "queries");
  ws->kv = floats(T * hp_.kv_cache_dims(), "latent keys");
  ws->attn = floats(T * hp_.n_head * hp_.v_head_dim, "attention output");
  ws->out = floats(T * hp_.n_embd, "sub-layer output");
  ws->router = floats(T * hp_.n_expert, "router logits");
  ws->last = floats(ws->n_logit_rows * hp_.n_embd, "final hidden states");
  ws->logits = floats(ws->n_logit_rows * hp_.n_vocab, "logits");
  ws->expert_ids.resize(size_t(T * hp_.n_expert_used));
  ws->expert_weights.resize(size_t(T * hp_.n_expert_used));
  ws->dense_ids.assign(size_t(T), 0);
  ws->dense_weights.assign(size_t(T), 1.0f);
  ws_ = std::move(ws);
}

void Deepseek2Model::forward(const Batch& batch, std::span<const KvLayerView> cache, float* logits) {
  const int64_t T = int64_t(batch.tokens.size()), R = int64_t(batch.logit_rows.size());
  TANDEM_CHECK(batch.positions.size() == batch.tokens.size() && batch.seq_ids.size() == batch.tokens.size());
  TANDEM_CHECK(cache.size() == layers_.size());
  if (T == 0) return;
  for (int32_t token : batch.tokens)
    if (token < 0 || uint32_t(token) >= hp_.n_vocab)
      fail("token id {} is outside the vocabulary (0..{})", token, hp_.n_vocab - 1);
  ensure_workspace(T, R);
  Workspace& ws = *ws_;
  Backend& be = backend_;
  const int64_t embd = hp_.n_embd, heads = hp_.n_head, nope = hp_.qk_nope_dim;
  const int64_t lora = hp_.kv_lora_rank, kv_row = hp_.kv_cache_dims(), q_row = hp_.qk_head_dim();
  const float eps = hp_.rms_norm_eps;
  float *x = ws.x->floats(), *h = ws.h->floats(), *q = ws.q->floats(), *kv = ws.kv->floats();
  float *attn = ws.attn->floats(), *out = ws.out->floats();

  be.get_rows(token_embd_, batch.tokens.data(), T, x);  // [T, n_embd]

  for (size_t il = 0; il < layers_.size(); ++il) {
    const Layer& l = layers_[il];

    // ---- attention ----
    be.rms_norm({.input = x, .weight = l.attn_norm, .output = h, .n_rows = T, .dim = embd,
                 .input_stride = embd, .output_stride = embd, .eps = eps});
    if (hp_.q_lora_rank > 0) {
      const int64_t q_lora = hp_.q_lora_rank;
      float* q_a = ws.q_a->floats();
      be.matmul({.weight = l.q_a, .input = h, .output = q_a, .n_tokens = T});
      be.rms_norm({.input = q_a, .weight = l.q_a_norm, .output = q_a, .n_rows = T, .dim = q_lora,
                   .input_stride = q_lora, .output_stride = q_lora, .eps = eps});
      be.matmul({.weight = l.q_b, .input = q_a, .output = q, .n_tokens = T});
    } else {
      be.matmul({.weight = l.q, .input = h, .output = q, .n_tokens = T});
    }
    // The compressed latent (normalized) and the shared rope key of each token.
    be.matmul({.weight = l.kv_a_mqa, .input = h, .output = kv, .n_tokens = T});
    be.rms_norm({.input = kv, .weight = l.kv_a_norm, .output = kv, .n_rows = T, .dim = lora,
                 .input_stride = kv_row, .output_stride = kv_row, .eps = eps});
    be.rope({.data = q, .positions = batch.positions.data(), .n_tokens = T, .n_heads = heads,
             .head_stride = q_row, .token_stride = heads * q_row, .offset = nope, .params = rope_});
    be.rope({.data = kv, .positions = batch.positions.data(), .n_tokens = T, .n_heads = 1,
             .head_stride = kv_row, .token_stride = kv_row, .offset = lora, .params = rope_});
    be.kv_store({.rows = kv, .cache = cache[il], .positions = batch.positions.data(),
                 .seq_ids = batch.seq_ids.data(), .n_tokens = T});
    be.mla_attention({.q = q, .k_b = l.k_b, .v_b = l.v_b, .cache = cache[il],
                      .positions = batch.positions.data(), .seq_ids = batch.seq_ids.data(),
                      .n_tokens = T, .n_heads = heads, .nope_dims = nope,
                      .v_head_dims = hp_.v_head_dim, .scale = attention_scale_, .output = attn});
    be.matmul({.weight = l.attn_output, .input = attn, .output = out, .n_tokens = T});
    be.add(x, out, T * embd);

    // ---- feed-forward: dense SwiGLU, or routed experts plus shared experts ----
    be.rms_norm({.input = x, .weight = l.ffn_norm, .output = h, .n_rows = T, .dim = embd,
                 .input_stride = embd, .output_stride = embd, .eps = eps});
    be.zero(out, T * embd);
    if (!l.moe) {
      be.moe({.input = h, .gate = l.ffn_gate, .up = l.ffn_up, .down = l.ffn_down,
              .expert_ids = ws.dense_ids.data(), .expert_weights = ws.dense_weights.data(),
              .n_tokens = T, .top_k = 1, .dim = embd, .ffn_dims = hp_.n_ff_dense, .output = out});
    } else {
      const int64_t k = hp_.n_expert_used;
      be.matmul({.weight = l.router, .input = h, .output = ws.router->floats(), .n_tokens = T});
      be.moe_route({.logits = ws.router->floats(), .bias = l.expert_bias, .n_tokens = T,
                    .n_expert = hp_.n_expert, .top_k = k,
                    .gating = hp_.gating == ExpertGating::Sigmoid ? MoeGating::Sigmoid : MoeGating::Softmax,
                    .n_groups = hp_.n_expert_group, .n_groups_used = hp_.n_group_used,
                    .normalize = hp_.expert_weights_norm, .scale = hp_.expert_weights_scale,
                    .expert_ids = ws.expert_ids.data(), .expert_weights = ws.expert_weights.data()});
      be.moe({.input = h, .gate = l.gate_exps, .up = l.up_exps, .down = l.down_exps,
              .expert_ids = ws.expert_ids.data(), .expert_weights = ws.expert_weights.data(),
              .n_tokens = T, .top_k = k, .dim = embd, .ffn_dims = hp_.n_ff_expert, .output = out});
      if (hp_.n_expert_shared > 0)
        be.moe({.input = h, .gate = l.gate_shexp, .up = l.up_shexp, .down = l.down_shexp,
                .expert_ids = ws.dense_ids.data(), .expert_weights = ws.dense_weights.data(),
                .n_tokens = T, .top_k = 1, .dim = embd,
                .ffn_dims = hp_.n_ff_expert * hp_.n_expert_shared, .output = out});
    }
    be.add(x, out, T * embd);
  }

  // ---- output head, only for the rows that need logits ----
  if (R == 0) return;
  float* last = ws.last->floats();
  for (int64_t r = 0; r < R; ++r) {
    const int32_t row = batch.logit_rows[size_t(r)];
    TANDEM_CHECK(row >= 0 && row < T);
    be.copy_rows(last + r * embd, embd, x + int64_t(row) * embd, embd, 1, embd);
  }
  be.rms_norm({.input = last, .weight = output_norm_, .output = last, .n_rows = R, .dim = embd,
               .input_stride = embd, .output_stride = embd, .eps = eps});
  be.matmul({.weight = output_, .input = last, .output = ws.logits->floats(), .n_tokens = R});
  be.copy_to_host(logits, ws.logits->floats(), size_t(R * hp_.n_vocab) * sizeof(float));
  be.synchronize();
}

}  // namespace tandem
