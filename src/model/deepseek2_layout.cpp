#include "model/deepseek2_layout.h"

#include <fmt/format.h>

#include "core/error.h"

namespace tandem {

std::vector<TensorLayout> deepseek2_layout(const Deepseek2Hparams& hp, std::string_view quant_mix) {
  TANDEM_CHECK(hp.n_vocab > 0 && hp.n_layer > hp.n_nextn_layers);
  LayoutBuilder b(quant_mix, hp.n_layer, hp.n_expert);
  auto matrix = [&](std::string name, std::vector<uint64_t> shape) {
    b.matrix(std::move(name), std::move(shape));
  };
  auto vector = [&](std::string name, uint64_t n) { b.vector(std::move(name), n); };

  const uint64_t embd = hp.n_embd, heads = hp.n_head, q_dim = heads * hp.qk_head_dim();
  matrix("token_embd.weight", {embd, hp.n_vocab});
  for (uint32_t il = 0; il < hp.n_layer - hp.n_nextn_layers; ++il) {
    const std::string blk = fmt::format("blk.{}.", il);
    vector(blk + "attn_norm.weight", embd);
    if (hp.q_lora_rank > 0) {
      matrix(blk + "attn_q_a.weight", {embd, hp.q_lora_rank});
      vector(blk + "attn_q_a_norm.weight", hp.q_lora_rank);
      matrix(blk + "attn_q_b.weight", {hp.q_lora_rank, q_dim});
    } else {
      matrix(blk + "attn_q.weight", {embd, q_dim});  // V2-Lite: no query compression
    }
    // MLA as current converters store it: the shared latent + rope key, then per-head
    // absorbed key and value projections out of the latent.
    matrix(blk + "attn_kv_a_mqa.weight", {embd, hp.kv_cache_dims()});
    vector(blk + "attn_kv_a_norm.weight", hp.kv_lora_rank);
    matrix(blk + "attn_k_b.weight", {hp.qk_nope_dim, hp.kv_lora_rank, heads});
    matrix(blk + "attn_v_b.weight", {hp.kv_lora_rank, hp.v_head_dim, heads});
    matrix(blk + "attn_output.weight", {heads * hp.v_head_dim, embd});
    vector(blk + "ffn_norm.weight", embd);
    if (!hp.is_moe_layer(il)) {
      matrix(blk + "ffn_gate.weight", {embd, hp.n_ff_dense});
      matrix(blk + "ffn_up.weight", {embd, hp.n_ff_dense});
      matrix(blk + "ffn_down.weight", {hp.n_ff_dense, embd});
      continue;
    }
    const uint64_t ff = hp.n_ff_expert, n_exp = hp.n_expert, shared_ff = ff * hp.n_expert_shared;
    matrix(blk + "ffn_gate_inp.weight", {embd, n_exp});
    if (hp.gating == ExpertGating::Sigmoid) vector(blk + "exp_probs_b.bias", n_exp);
    matrix(blk + "ffn_gate_exps.weight", {embd, ff, n_exp});
    matrix(blk + "ffn_up_exps.weight", {embd, ff, n_exp});
    matrix(blk + "ffn_down_exps.weight", {ff, embd, n_exp});
    if (hp.n_expert_shared > 0) {
      matrix(blk + "ffn_gate_shexp.weight", {embd, shared_ff});
      matrix(blk + "ffn_up_shexp.weight", {embd, shared_ff});
      matrix(blk + "ffn_down_shexp.weight", {shared_ff, embd});
    }
  }
  vector("output_norm.weight", embd);
  matrix("output.weight", {embd, hp.n_vocab});
  return b.take();
}

}  // namespace tandem
