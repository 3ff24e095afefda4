// The gpt-oss architecture (gpt_oss.h). Its layer: norm, grouped-query attention (biases, sinks,
// a sliding window on every other layer), residual, norm, MoE FFN, residual.
#include "model/gpt_oss.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/hparams_reader.h"
#include "model/transformer.h"

namespace tandem {
namespace {

constexpr const char* kArch = "gpt-oss";

class GptOssModel final : public Transformer {
 public:
  GptOssModel(const gguf::GgufFile& file, const DevicePlan& devices, const GptOssHparams& hp)
      : Transformer(file, devices, gpt_oss_model_info(hp), hp.rms_norm_eps) {
    RopeParams rope{.rope_dims = hp.head_dim, .freq_base = hp.rope_freq_base, .neox = true};
    float mscale = 1.0f;
    if (hp.rope_scaling_factor > 1.0f) {
      rope.freq_scale = 1.0f / hp.rope_scaling_factor;
      rope.ext_factor = 1.0f;
      rope.original_ctx = hp.rope_original_ctx;
      rope.beta_fast = hp.yarn_beta_fast;
      rope.beta_slow = hp.yarn_beta_slow;
      // YaRN scales cos and sin of q and k by 1 + 0.1 ln(factor); q·k carries it twice.
      mscale = 1.0f + 0.1f * std::log(hp.rope_scaling_factor);
    }
    attention_ = {.n_head = hp.n_head,
                  .n_head_kv = hp.n_head_kv,
                  .head_dim = hp.head_dim,
                  .v_head_dim = hp.v_head_dim,
                  .rope = rope,
                  .scale = mscale * mscale / std::sqrt(float(hp.head_dim)),
                  .needs_output_bias = true,
                  .needs_sinks = true,
                  .projections_like_ffn = true};
    // The router's logits (with its bias) both choose the experts and, softmaxed over the k
    // chosen, weigh them; experts have biases and the clamped SwiGLU.
    const MoeConfig moe{.gating = MoeGating::SoftmaxOfTopK,
                        .activation = FfnActivation::SwiGluClamped,
                        .biases = true};
    bind_embeddings_and_head();
    layers_.resize(info_.n_layer);
    for (uint32_t il = 0; il < info_.n_layer; ++il) {
      Layer& l = layers_[il];
      if (!devices_.layers[il]) {  // another rank runs it; this one may hold some of its experts
        bind_ffn(il, moe);
        continue;
      }
      Backend& on = *devices_.layers[il];
      const std::string blk = fmt::format("blk.{}.", il);
      l.attn_norm = binder_.f32(blk + "attn_norm.weight", {hp.n_embd}, on);
      l.attention = bind_gqa(il, attention_, hp.is_sliding(il) ? hp.sliding_window : 0);
      // gpt-oss calls its pre-FFN norm post_attention_norm: after the attention's residual.
      l.ffn_norm = binder_.f32(blk + "post_attention_norm.weight", {hp.n_embd}, on);
      bind_ffn(il, moe);
    }
    finish_binding();
  }

 private:
  struct Layer {
    const float* attn_norm = nullptr;  // [n_embd]
    GqaWeights attention;
    const float* ffn_norm = nullptr;  // [n_embd]
  };

  const float* attention_norm(uint32_t il) const override { return layers_[il].attn_norm; }
  void layer(uint32_t il, LayerStep& s) override {
    const Layer& l = layers_[il];
    norm_input(s, l.attn_norm);
    gqa_attention(attention_, l.attention, s);
    add_output_then_norm(s, l.ffn_norm);
    ffn(il, s);
  }

  GqaConfig attention_;
  std::vector<Layer> layers_;
};

}  // namespace

GptOssHparams read_gpt_oss_hparams(const gguf::GgufFile& file) {
  const HparamsReader r(file, kArch);
  GptOssHparams hp;
  hp.n_layer = r.u32("block_count");
  hp.n_ctx_train = r.u32("context_length");
  hp.n_embd = r.u32("embedding_length");
  hp.n_ff = r.u32("feed_forward_length", 0);
  hp.n_head = r.u32("attention.head_count");
  hp.n_head_kv = r.u32("attention.head_count_kv", hp.n_head);
  r.require(hp.n_head > 0 && hp.n_embd > 0,
            "attention.head_count and embedding_length must be positive");
  hp.head_dim = r.u32("attention.key_length", hp.n_embd / hp.n_head);
  hp.v_head_dim = r.u32("attention.value_length", hp.head_dim);
  hp.n_vocab = r.vocab_size();
  hp.n_expert = r.u32("expert_count");
  hp.n_expert_used = r.u32("expert_used_count");
  hp.n_ff_expert = r.u32("expert_feed_forward_length");
  hp.sliding_window = r.u32("attention.sliding_window");
  hp.swa_pattern = r.u32("attention.sliding_window_pattern", 2);
  hp.rope_freq_base = r.f32("rope.freq_base", 150000.0f);
  const std::string scaling = r.string("rope.scaling.type").value_or("none");
  if (scaling == "yarn") {
    hp.rope_scaling_factor = r.f32("rope.scaling.factor", 1.0f);
    hp.rope_original_ctx = r.u32("rope.scaling.original_context_length");
    hp.yarn_beta_fast = r.f32("rope.scaling.yarn_beta_fast", 32.0f);
    hp.yarn_beta_slow = r.f32("rope.scaling.yarn_beta_slow", 1.0f);
  } else {
    r.require(scaling == "none",
              fmt::format("rope.scaling.type '{}': supported are 'none' and 'yarn'", scaling));
  }
  hp.rms_norm_eps = r.f32("attention.layer_norm_rms_epsilon", 1e-5f);
  r.require(hp.n_layer > 0, "block_count must be positive");
  r.require(hp.n_head_kv > 0 && hp.n_head % hp.n_head_kv == 0,
            "attention.head_count must be a multiple of attention.head_count_kv");
  r.require(hp.head_dim % 2 == 0 && hp.head_dim > 0, "attention.key_length must be even");
  r.require(hp.n_expert > 0 && hp.n_expert_used > 0 && hp.n_expert_used <= hp.n_expert,
            "expert_used_count must be between 1 and expert_count");
  r.require(hp.sliding_window > 0 && hp.swa_pattern > 0,
            "attention.sliding_window and its pattern must be positive");
  return hp;
}

void write_gpt_oss_hparams(const GptOssHparams& hp, gguf::GgufWriter& writer) {
  auto u32 = [&](const char* name, uint32_t v) {
    writer.add_metadata(fmt::format("{}.{}", kArch, name), gguf::Value::u32(v));
  };
  auto f32 = [&](const char* name, float v) {
    writer.add_metadata(fmt::format("{}.{}", kArch, name), gguf::Value::f32(v));
  };
  u32("block_count", hp.n_layer);
  u32("context_length", hp.n_ctx_train);
  u32("embedding_length", hp.n_embd);
  u32("feed_forward_length", hp.n_ff);
  u32("attention.head_count", hp.n_head);
  u32("attention.head_count_kv", hp.n_head_kv);
  if (hp.rope_scaling_factor > 1.0f) {
    writer.add_metadata(fmt::format("{}.rope.scaling.type", kArch), gguf::Value::string("yarn"));
    f32("rope.scaling.factor", hp.rope_scaling_factor);
    u32("rope.scaling.original_context_length", hp.rope_original_ctx);
    f32("rope.scaling.yarn_beta_fast", hp.yarn_beta_fast);
    f32("rope.scaling.yarn_beta_slow", hp.yarn_beta_slow);
  }
  f32("rope.freq_base", hp.rope_freq_base);
  f32("attention.layer_norm_rms_epsilon", hp.rms_norm_eps);
  u32("expert_count", hp.n_expert);
  u32("expert_used_count", hp.n_expert_used);
  u32("attention.key_length", hp.head_dim);
  u32("attention.value_length", hp.v_head_dim);
  u32("attention.sliding_window", hp.sliding_window);
  u32("expert_feed_forward_length", hp.n_ff_expert);
}

ModelInfo gpt_oss_model_info(const GptOssHparams& hp) {
  ModelInfo info;
  info.arch = kArch;
  info.n_layer = hp.n_layer;
  info.n_ctx_train = hp.n_ctx_train;
  info.n_embd = hp.n_embd;
  info.n_vocab = hp.n_vocab;
  info.n_head = hp.n_head;
  info.n_expert = hp.n_expert;
  info.n_expert_used = hp.n_expert_used;
  info.n_ff_expert = hp.n_ff_expert;
  std::vector<int64_t> windows;
  for (uint32_t il = 0; il < hp.n_layer; ++il)
    windows.push_back(hp.is_sliding(il) ? hp.sliding_window : 0);
  set_gqa_attention_info(info, hp.n_head, hp.n_head_kv, hp.head_dim, hp.v_head_dim, windows);
  return info;
}

std::vector<TensorLayout> gpt_oss_layout(const GptOssHparams& hp, std::string_view quant_mix) {
  LayoutBuilder b(quant_mix, hp.n_layer, hp.n_expert);
  const uint64_t embd = hp.n_embd, ff = hp.n_ff_expert, n_exp = hp.n_expert;
  const uint64_t q_dims = uint64_t(hp.n_head) * hp.head_dim;
  const uint64_t k_dims = uint64_t(hp.n_head_kv) * hp.head_dim;
  const uint64_t v_dims = uint64_t(hp.n_head_kv) * hp.v_head_dim;
  b.matrix("token_embd.weight", {embd, hp.n_vocab});
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const std::string blk = fmt::format("blk.{}.", il);
    b.vector(blk + "attn_norm.weight", embd);
    b.matrix(blk + "attn_q.weight", {embd, q_dims});
    b.vector(blk + "attn_q.bias", q_dims);
    b.matrix(blk + "attn_k.weight", {embd, k_dims});
    b.vector(blk + "attn_k.bias", k_dims);
    b.matrix(blk + "attn_v.weight", {embd, v_dims});
    b.vector(blk + "attn_v.bias", v_dims);
    b.matrix(blk + "attn_output.weight", {uint64_t(hp.n_head) * hp.v_head_dim, embd});
    b.vector(blk + "attn_output.bias", embd);
    b.vector(blk + "attn_sinks.weight", hp.n_head);
    b.vector(blk + "post_attention_norm.weight", embd);
    b.matrix(blk + "ffn_gate_inp.weight", {embd, n_exp});
    b.vector(blk + "ffn_gate_inp.bias", n_exp);
    b.matrix(blk + "ffn_gate_exps.weight", {embd, ff, n_exp});
    b.matrix(blk + "ffn_gate_exps.bias", {ff, n_exp});
    b.matrix(blk + "ffn_up_exps.weight", {embd, ff, n_exp});
    b.matrix(blk + "ffn_up_exps.bias", {ff, n_exp});
    b.matrix(blk + "ffn_down_exps.weight", {ff, embd, n_exp});
    b.matrix(blk + "ffn_down_exps.bias", {embd, n_exp});
  }
  b.vector("output_norm.weight", embd);
  b.matrix("output.weight", {embd, hp.n_vocab});
  return b.take();
}

std::unique_ptr<Model> load_gpt_oss(const gguf::GgufFile& file, const DevicePlan& devices) {
  return std::make_unique<GptOssModel>(file, devices, read_gpt_oss_hparams(file));
}

}  // namespace tandem
