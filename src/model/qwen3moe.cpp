// The qwen3moe architecture (qwen3moe.h). Its layer: norm, grouped-query attention with QK-norm,
// residual, norm, MoE FFN, residual.
#include "model/qwen3moe.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/hparams_reader.h"
#include "model/transformer.h"

namespace tandem {
namespace {

constexpr const char* kArch = "qwen3moe";

class Qwen3MoeModel final : public Transformer {
 public:
  Qwen3MoeModel(const gguf::GgufFile& file, const DevicePlan& devices, const Qwen3MoeHparams& hp)
      : Transformer(file, devices, qwen3moe_model_info(hp), hp.rms_norm_eps) {
    attention_ = {.n_head = hp.n_head,
                  .n_head_kv = hp.n_head_kv,
                  .head_dim = hp.head_dim,
                  .v_head_dim = hp.v_head_dim,
                  .rope = {.rope_dims = hp.head_dim, .freq_base = hp.rope_freq_base, .neox = true},
                  .scale = 1.0f / std::sqrt(float(hp.head_dim)),
                  .needs_qk_norm = true,
                  .projections_like_ffn = true};
    // Qwen3 always renormalises the chosen experts' probabilities (norm_topk_prob).
    const MoeConfig moe{.gating = MoeGating::Softmax, .normalize = true};
    bind_embeddings_and_head();  // the small Qwen3 models tie the head to token_embd
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
      l.attention = bind_gqa(il, attention_, /*window=*/0);
      l.ffn_norm = binder_.f32(blk + "ffn_norm.weight", {hp.n_embd}, on);
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

Qwen3MoeHparams read_qwen3moe_hparams(const gguf::GgufFile& file) {
  const HparamsReader r(file, kArch);
  Qwen3MoeHparams hp;
  hp.n_layer = r.u32("block_count");
  hp.n_ctx_train = r.u32("context_length");
  hp.n_embd = r.u32("embedding_length");
  hp.n_ff = r.u32("feed_forward_length", 0);
  hp.n_head = r.u32("attention.head_count");
  hp.n_head_kv = r.u32("attention.head_count_kv", hp.n_head);
  r.require(hp.n_head > 0 && hp.n_embd > 0,
            "attention.head_count and embedding_length must be positive");
  // key_length must be read: Qwen3-30B-A3B has 32 heads of 128 over a hidden size of 2048.
  hp.head_dim = r.u32("attention.key_length", hp.n_embd / hp.n_head);
  hp.v_head_dim = r.u32("attention.value_length", hp.head_dim);
  hp.n_vocab = r.vocab_size();
  hp.n_expert = r.u32("expert_count");
  hp.n_expert_used = r.u32("expert_used_count");
  r.require(hp.n_expert > 0 && hp.n_expert_used > 0 && hp.n_expert_used <= hp.n_expert,
            "expert_used_count must be between 1 and expert_count");
  hp.n_ff_expert = r.u32("expert_feed_forward_length", hp.n_ff / hp.n_expert_used);
  hp.rope_freq_base = r.f32("rope.freq_base", 1e6f);
  hp.rms_norm_eps = r.f32("attention.layer_norm_rms_epsilon", 1e-6f);
  r.require(hp.n_layer > 0, "block_count must be positive");
  r.require(hp.n_head_kv > 0 && hp.n_head % hp.n_head_kv == 0,
            "attention.head_count must be a multiple of attention.head_count_kv");
  r.require(hp.head_dim % 2 == 0 && hp.head_dim > 0, "attention.key_length must be even");
  r.require(hp.n_ff_expert > 0, "expert_feed_forward_length must be positive");
  hp.tied_embeddings = file.find_tensor("output.weight") == nullptr;
  return hp;
}

void write_qwen3moe_hparams(const Qwen3MoeHparams& hp, gguf::GgufWriter& writer) {
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
  f32("rope.freq_base", hp.rope_freq_base);
  f32("attention.layer_norm_rms_epsilon", hp.rms_norm_eps);
  u32("expert_count", hp.n_expert);
  u32("expert_used_count", hp.n_expert_used);
  u32("attention.key_length", hp.head_dim);
  u32("attention.value_length", hp.v_head_dim);
  u32("expert_feed_forward_length", hp.n_ff_expert);
}

ModelInfo qwen3moe_model_info(const Qwen3MoeHparams& hp) {
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
  const std::vector<int64_t> windows(hp.n_layer, 0);
  set_gqa_attention_info(info, hp.n_head, hp.n_head_kv, hp.head_dim, hp.v_head_dim, windows);
  return info;
}

std::vector<TensorLayout> qwen3moe_layout(const Qwen3MoeHparams& hp, std::string_view quant_mix) {
  LayoutBuilder b(quant_mix, hp.n_layer, hp.n_expert);
  const uint64_t embd = hp.n_embd, ff = hp.n_ff_expert, n_exp = hp.n_expert;
  b.matrix("token_embd.weight", {embd, hp.n_vocab});
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const std::string blk = fmt::format("blk.{}.", il);
    b.vector(blk + "attn_norm.weight", embd);
    b.matrix(blk + "attn_q.weight", {embd, uint64_t(hp.n_head) * hp.head_dim});
    b.matrix(blk + "attn_k.weight", {embd, uint64_t(hp.n_head_kv) * hp.head_dim});
    b.matrix(blk + "attn_v.weight", {embd, uint64_t(hp.n_head_kv) * hp.v_head_dim});
    b.matrix(blk + "attn_output.weight", {uint64_t(hp.n_head) * hp.v_head_dim, embd});
    b.vector(blk + "attn_q_norm.weight", hp.head_dim);
    b.vector(blk + "attn_k_norm.weight", hp.head_dim);
    b.vector(blk + "ffn_norm.weight", embd);
    b.matrix(blk + "ffn_gate_inp.weight", {embd, n_exp});
    b.matrix(blk + "ffn_gate_exps.weight", {embd, ff, n_exp});
    b.matrix(blk + "ffn_up_exps.weight", {embd, ff, n_exp});
    b.matrix(blk + "ffn_down_exps.weight", {ff, embd, n_exp});
  }
  b.vector("output_norm.weight", embd);
  if (!hp.tied_embeddings) b.matrix("output.weight", {embd, hp.n_vocab});
  return b.take();
}

std::unique_ptr<Model> load_qwen3moe(const gguf::GgufFile& file, const DevicePlan& devices) {
  return std::make_unique<Qwen3MoeModel>(file, devices, read_qwen3moe_hparams(file));
}

}  // namespace tandem
