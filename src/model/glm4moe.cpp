// The glm4moe architecture (glm4moe.h). Its layer: norm, grouped-query attention (biases, half
// the head rotated), residual, norm, dense FFN or MoE with a shared expert, residual.
#include "model/glm4moe.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/hparams_reader.h"
#include "model/transformer.h"

namespace tandem {
namespace {

constexpr const char* kArch = "glm4moe";

class Glm4MoeModel final : public Transformer {
 public:
  Glm4MoeModel(const gguf::GgufFile& file, const DevicePlan& devices, const Glm4MoeHparams& hp)
      : Transformer(file, devices, glm4moe_model_info(hp), hp.rms_norm_eps) {
    attention_ = {.n_head = hp.n_head,
                  .n_head_kv = hp.n_head_kv,
                  .head_dim = hp.head_dim,
                  .v_head_dim = hp.v_head_dim,
                  .rope = {.rope_dims = hp.n_rot, .freq_base = hp.rope_freq_base, .neox = true},
                  .scale = 1.0f / std::sqrt(float(hp.head_dim)),
                  .needs_qkv_bias = true};
    // The selection bias (exp_probs_b) steers which experts are chosen, never their weight.
    const MoeConfig moe{.gating = hp.sigmoid_gating ? MoeGating::Sigmoid : MoeGating::Softmax,
                        .n_groups = hp.n_expert_group,
                        .n_groups_used = hp.n_group_used,
                        .normalize = hp.expert_weights_norm,
                        .scale = hp.expert_weights_scale};
    bind_embeddings_and_head();
    layers_.resize(info_.n_layer);  // the NextN blocks after them are not bound
    for (uint32_t il = 0; il < info_.n_layer; ++il) {
      Layer& l = layers_[il];
      if (!devices_.layers[il]) {  // another rank runs it; this one may hold some of its experts
        bind_ffn(il, moe);
        continue;
      }
      Backend& on = *devices_.layers[il];
      const std::string blk = fmt::format("blk.{}.", il);
      l.attn_norm = binder_.f32(blk + "attn_norm.weight", {hp.n_embd}, on);
      l.attention = bind_gqa(il, attention_, /*window=*/0);
      // GLM calls its pre-FFN norm post_attention_norm: after the attention's residual.
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

Glm4MoeHparams read_glm4moe_hparams(const gguf::GgufFile& file) {
  const HparamsReader r(file, kArch);
  Glm4MoeHparams hp;
  hp.n_layer = r.u32("block_count");
  hp.n_ctx_train = r.u32("context_length");
  hp.n_embd = r.u32("embedding_length");
  hp.n_ff_dense = r.u32("feed_forward_length", 0);
  hp.n_head = r.u32("attention.head_count");
  hp.n_head_kv = r.u32("attention.head_count_kv", hp.n_head);
  r.require(hp.n_head > 0 && hp.n_embd > 0,
            "attention.head_count and embedding_length must be positive");
  hp.head_dim = r.u32("attention.key_length", hp.n_embd / hp.n_head);
  hp.v_head_dim = r.u32("attention.value_length", hp.head_dim);
  hp.n_rot = r.u32("rope.dimension_count", hp.head_dim / 2);
  hp.n_vocab = r.vocab_size();
  hp.n_leading_dense = r.u32("leading_dense_block_count", 0);
  hp.n_expert = r.u32("expert_count");
  hp.n_expert_used = r.u32("expert_used_count");
  hp.n_expert_shared = r.u32("expert_shared_count");
  hp.n_ff_expert = r.u32("expert_feed_forward_length");
  hp.n_expert_group = r.u32("expert_group_count", 1);
  hp.n_group_used = r.u32("expert_group_used_count", 1);
  const uint32_t gating = r.u32("expert_gating_func", 2);
  r.require(gating == 1 || gating == 2, "expert_gating_func must be 1 (softmax) or 2 (sigmoid)");
  hp.sigmoid_gating = gating == 2;
  hp.expert_weights_norm = r.boolean("expert_weights_norm", false);
  hp.expert_weights_scale = r.f32("expert_weights_scale", 1.0f);
  hp.n_nextn_layers = r.u32("nextn_predict_layers", 0);
  hp.rope_freq_base = r.f32("rope.freq_base", 1e6f);
  hp.rms_norm_eps = r.f32("attention.layer_norm_rms_epsilon", 1e-5f);
  r.require(hp.n_layer > hp.n_nextn_layers, "nextn_predict_layers must be below block_count");
  r.require(hp.n_leading_dense <= hp.n_layer - hp.n_nextn_layers,
            "leading_dense_block_count exceeds the layers that run");
  r.require(hp.n_head_kv > 0 && hp.n_head % hp.n_head_kv == 0,
            "attention.head_count must be a multiple of attention.head_count_kv");
  r.require(hp.n_rot % 2 == 0 && hp.n_rot > 0 && hp.n_rot <= hp.head_dim,
            "rope.dimension_count must be even and at most attention.key_length");
  r.require(hp.n_expert > 0 && hp.n_expert_used > 0 && hp.n_expert_used <= hp.n_expert,
            "expert_used_count must be between 1 and expert_count");
  r.require(hp.n_expert_group >= 1 && hp.n_expert % hp.n_expert_group == 0 &&
                hp.n_group_used >= 1 && hp.n_group_used <= hp.n_expert_group,
            "expert_count must be a multiple of expert_group_count, which bounds "
            "expert_group_used_count");
  hp.qk_norm = file.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
  return hp;
}

void write_glm4moe_hparams(const Glm4MoeHparams& hp, gguf::GgufWriter& writer) {
  auto u32 = [&](const char* name, uint32_t v) {
    writer.add_metadata(fmt::format("{}.{}", kArch, name), gguf::Value::u32(v));
  };
  auto f32 = [&](const char* name, float v) {
    writer.add_metadata(fmt::format("{}.{}", kArch, name), gguf::Value::f32(v));
  };
  u32("block_count", hp.n_layer);
  u32("context_length", hp.n_ctx_train);
  u32("embedding_length", hp.n_embd);
  u32("feed_forward_length", hp.n_ff_dense);
  u32("attention.head_count", hp.n_head);
  u32("attention.head_count_kv", hp.n_head_kv);
  f32("rope.freq_base", hp.rope_freq_base);
  f32("attention.layer_norm_rms_epsilon", hp.rms_norm_eps);
  u32("expert_used_count", hp.n_expert_used);
  u32("expert_group_count", hp.n_expert_group);
  u32("expert_group_used_count", hp.n_group_used);
  u32("attention.key_length", hp.head_dim);
  u32("attention.value_length", hp.v_head_dim);
  u32("rope.dimension_count", hp.n_rot);
  u32("expert_count", hp.n_expert);
  u32("expert_feed_forward_length", hp.n_ff_expert);
  u32("expert_shared_count", hp.n_expert_shared);
  u32("leading_dense_block_count", hp.n_leading_dense);
  u32("expert_gating_func", hp.sigmoid_gating ? 2 : 1);
  f32("expert_weights_scale", hp.expert_weights_scale);
  writer.add_metadata(fmt::format("{}.expert_weights_norm", kArch),
                      gguf::Value::boolean(hp.expert_weights_norm));
  u32("nextn_predict_layers", hp.n_nextn_layers);
}

ModelInfo glm4moe_model_info(const Glm4MoeHparams& hp) {
  ModelInfo info;
  info.arch = kArch;
  info.n_layer = hp.n_layer - hp.n_nextn_layers;
  info.n_ctx_train = hp.n_ctx_train;
  info.n_embd = hp.n_embd;
  info.n_vocab = hp.n_vocab;
  info.n_head = hp.n_head;
  info.n_leading_dense = hp.n_leading_dense;
  info.n_ff_dense = hp.n_ff_dense;
  info.n_expert = hp.n_expert;
  info.n_expert_used = hp.n_expert_used;
  info.n_expert_shared = hp.n_expert_shared;
  info.n_ff_expert = hp.n_ff_expert;
  const std::vector<int64_t> windows(info.n_layer, 0);
  set_gqa_attention_info(info, hp.n_head, hp.n_head_kv, hp.head_dim, hp.v_head_dim, windows);
  return info;
}

std::vector<TensorLayout> glm4moe_layout(const Glm4MoeHparams& hp, std::string_view quant_mix) {
  const uint32_t n_layer = hp.n_layer - hp.n_nextn_layers;
  LayoutBuilder b(quant_mix, n_layer, hp.n_expert);
  const uint64_t embd = hp.n_embd, ff = hp.n_ff_expert, n_exp = hp.n_expert;
  const uint64_t q_dims = uint64_t(hp.n_head) * hp.head_dim;
  const uint64_t k_dims = uint64_t(hp.n_head_kv) * hp.head_dim;
  const uint64_t v_dims = uint64_t(hp.n_head_kv) * hp.v_head_dim;
  b.matrix("token_embd.weight", {embd, hp.n_vocab});
  for (uint32_t il = 0; il < n_layer; ++il) {
    const std::string blk = fmt::format("blk.{}.", il);
    b.vector(blk + "attn_norm.weight", embd);
    b.matrix(blk + "attn_q.weight", {embd, q_dims});
    b.vector(blk + "attn_q.bias", q_dims);
    b.matrix(blk + "attn_k.weight", {embd, k_dims});
    b.vector(blk + "attn_k.bias", k_dims);
    b.matrix(blk + "attn_v.weight", {embd, v_dims});
    b.vector(blk + "attn_v.bias", v_dims);
    b.matrix(blk + "attn_output.weight", {uint64_t(hp.n_head) * hp.v_head_dim, embd});
    if (hp.qk_norm) {
      b.vector(blk + "attn_q_norm.weight", hp.head_dim);
      b.vector(blk + "attn_k_norm.weight", hp.head_dim);
    }
    b.vector(blk + "post_attention_norm.weight", embd);
    if (il < hp.n_leading_dense) {
      b.matrix(blk + "ffn_gate.weight", {embd, hp.n_ff_dense});
      b.matrix(blk + "ffn_up.weight", {embd, hp.n_ff_dense});
      b.matrix(blk + "ffn_down.weight", {hp.n_ff_dense, embd});
      continue;
    }
    const uint64_t shared_ff = ff * hp.n_expert_shared;
    b.matrix(blk + "ffn_gate_inp.weight", {embd, n_exp});
    b.vector(blk + "exp_probs_b.bias", n_exp);
    b.matrix(blk + "ffn_gate_exps.weight", {embd, ff, n_exp});
    b.matrix(blk + "ffn_up_exps.weight", {embd, ff, n_exp});
    b.matrix(blk + "ffn_down_exps.weight", {ff, embd, n_exp});
    b.matrix(blk + "ffn_gate_shexp.weight", {embd, shared_ff});
    b.matrix(blk + "ffn_up_shexp.weight", {embd, shared_ff});
    b.matrix(blk + "ffn_down_shexp.weight", {shared_ff, embd});
  }
  b.vector("output_norm.weight", embd);
  b.matrix("output.weight", {embd, hp.n_vocab});
  return b.take();
}

std::unique_ptr<Model> load_glm4moe(const gguf::GgufFile& file, const DevicePlan& devices) {
  return std::make_unique<Glm4MoeModel>(file, devices, read_glm4moe_hparams(file));
}

}  // namespace tandem
