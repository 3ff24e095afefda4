// The GGUF "deepseek2" architecture: multi-head latent attention over a latent KV cache (with
// heads optionally split over devices), then the shared FFN blocks. Its layer: norm, MLA, residual,
// norm, FFN (dense or MoE with shared experts).
#include "model/deepseek2.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/transformer_internal.h"
#include "quant/quant.h"

namespace tandem {

// Weights of one layer's attention; shapes in [rows, cols] of the matrices as the ops see them.
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
  // Head-split attention (DevicePlan::heads): the shares, the first on the layer's device; then
  // q/q_b, k_b, v_b and attn_output above are unbound (each share holds its heads' part).
  std::vector<HeadShard> head_shards;
  Backend* device = nullptr;
};

// Some heads of a layer's attention on one device: its rows of q_b (or q), its heads' k_b and
// v_b, its columns of attn_output; and, on a device other than the layer's, a copy of the
// layer's latent KV cache for each cache the model was run with (every head reads all of it).
struct Deepseek2Model::HeadShard {
  Backend* device = nullptr;
  int32_t first_head = 0, n_heads = 0;
  WeightView q, k_b, v_b, attn_output;
  struct CacheCopy {
    const void* of = nullptr;  // the layer's cache it mirrors
    std::shared_ptr<DeviceBuffer> buffer;
    KvLayerView view;
  };
  std::vector<CacheCopy> cache_copies;
};

Deepseek2Model::Deepseek2Model(const gguf::GgufFile& file, Backend& backend)
    : Deepseek2Model(file, [&] {
        const Deepseek2Hparams hp = read_deepseek2_hparams(file);
        return DevicePlan::single(backend, hp.n_layer - hp.n_nextn_layers, hp.n_expert);
      }()) {}

Deepseek2Model::Deepseek2Model(const gguf::GgufFile& file, const DevicePlan& devices)
    : Deepseek2Model(file, devices, read_deepseek2_hparams(file)) {}

Deepseek2Model::Deepseek2Model(const gguf::GgufFile& file, const DevicePlan& devices,
                               const Deepseek2Hparams& hp)
    : Transformer(file, devices, deepseek2_model_info(hp), hp.rms_norm_eps), hp_(hp) {
  // V3 files may append MTP blocks: not run.
  const int64_t embd = hp_.n_embd;
  bind_embeddings_and_head();
  layers_.resize(info_.n_layer);
  const MoeConfig moe{
      .gating = hp_.gating == ExpertGating::Sigmoid ? MoeGating::Sigmoid : MoeGating::Softmax,
      .n_groups = hp_.n_expert_group,
      .n_groups_used = hp_.n_group_used,
      .normalize = hp_.expert_weights_norm,
      .scale = hp_.expert_weights_scale};
  for (uint32_t il = 0; il < info_.n_layer; ++il) {
    Layer& l = layers_[il];
    if (!devices_.layers[il]) {  // another rank runs it; this one may hold some of its experts
      bind_ffn(il, moe);
      continue;
    }
    Backend& on = *devices_.layers[il];
    l.device = &on;
    const std::string blk = fmt::format("blk.{}.", il);
    l.attn_norm = binder_.f32(blk + "attn_norm.weight", {embd}, on);
    bind_attention(l, il, on);
    l.ffn_norm = binder_.f32(blk + "ffn_norm.weight", {embd}, on);
    bind_ffn(il, moe);
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
  finish_binding();
}

Deepseek2Model::~Deepseek2Model() = default;

std::vector<Backend*> Deepseek2Model::extra_layer_devices(uint32_t il) const {
  std::vector<Backend*> devices;
  for (const HeadShard& shard : layers_[il].head_shards) devices.push_back(shard.device);
  return devices;
}

const float* Deepseek2Model::attention_norm(uint32_t il) const {
  return layers_[il].attn_norm;
}

void Deepseek2Model::layer(uint32_t il, LayerStep& s) {
  const Layer& l = layers_[il];
  norm_input(s, l.attn_norm);
  if (l.head_shards.empty())
    attention(l, s);
  else
    split_attention(il, s.batch, s.cache, s.h, s.out);
  add_output_then_norm(s, l.ffn_norm);
  ffn(il, s);
}

// Absorbed MLA on the layer's device: queries (through q LoRA when the model has it), the
// normed latent and its rope key stored in the cache, attention in the latent space, output.
void Deepseek2Model::attention(const Layer& l, LayerStep& s) {
  using W = Workspace;
  const Batch& batch = s.batch;
  Backend& be = s.be;
  Workspace& ws = s.ws;
  const StepInputs& in = s.in;
  const int64_t T = s.n_tokens, heads = hp_.n_head, nope = hp_.qk_nope_dim;
  const int64_t lora = hp_.kv_lora_rank, kv_row = hp_.kv_cache_dims(), q_row = hp_.qk_head_dim();
  const float eps = hp_.rms_norm_eps;
  const ActivationBits bits = projection_bits();
  const float* h = s.h;
  float* q = ws.get(W::kQuery, T * heads * q_row);
  float* kv = ws.get(W::kLatent, T * kv_row);
  float* attn = ws.get(W::kAttention, T * heads * hp_.v_head_dim);
  float* out = s.out;
  // The queries' first product (q, or q_a with q LoRA) and the compressed latent (kv_a) over the
  // same input, one op.
  const int64_t q_lora = hp_.q_lora_rank;
  float* q_a = q_lora > 0 ? ws.get(W::kQueryLora, T * q_lora) : nullptr;
  be.matmul({.weight = q_a ? l.q_a : l.q,
             .input = h,
             .output = q_a ? q_a : q,
             .n_tokens = T,
             .kernels = batch.kernels,
             .activations = bits,
             .second = l.kv_a_mqa,
             .second_output = kv});
  // The latent (normalized) and the shared rope key of each token, stored; q_a's norm in the
  // same op, then the queries' second product.
  be.store_latent({.rows = kv,
                   .norm_weight = l.kv_a_norm,
                   .norm_dims = lora,
                   .eps = eps,
                   .rope = rope_,
                   .cache = s.cache,
                   .positions = in.positions,
                   .seq_ids = in.seq_ids,
                   .n_tokens = T,
                   .query_lora = q_a,
                   .query_lora_norm = q_a ? l.q_a_norm : nullptr,
                   .query_lora_dims = q_lora});
  if (q_a)
    be.matmul({.weight = l.q_b,
               .input = q_a,
               .output = q,
               .n_tokens = T,
               .kernels = batch.kernels,
               .activations = bits});
  // The queries' rope inside the attention op.
  be.mla_attention({.q = q,
                    .k_b = l.k_b,
                    .v_b = l.v_b,
                    .cache = s.cache,
                    .positions = in.positions,
                    .seq_ids = in.seq_ids,
                    .n_tokens = T,
                    .n_heads = heads,
                    .nope_dims = nope,
                    .v_head_dims = hp_.v_head_dim,
                    .scale = attention_scale_,
                    .output = attn,
                    .kernels = batch.kernels,
                    .rotate_queries = true,
                    .rope = rope_});
  be.matmul({.weight = l.attn_output,
             .input = attn,
             .output = out,
             .n_tokens = T,
             .kernels = batch.kernels,
             .activations = bits});
}

void Deepseek2Model::bind_attention(Layer& l, uint32_t il, Backend& on) {
  const std::string blk = fmt::format("blk.{}.", il);
  const int64_t embd = hp_.n_embd, heads = hp_.n_head, nope = hp_.qk_nope_dim;
  const int64_t lora = hp_.kv_lora_rank, v_head = hp_.v_head_dim;
  const int64_t q_dim = heads * hp_.qk_head_dim();
  const bool split = !devices_.heads.empty() && !devices_.heads[il].empty();
  if (hp_.q_lora_rank > 0) {
    l.q_a = binder_.matrix(blk + "attn_q_a.weight", {embd, hp_.q_lora_rank}, on);
    l.q_a_norm = binder_.f32(blk + "attn_q_a_norm.weight", {hp_.q_lora_rank}, on);
    if (!split) l.q_b = binder_.matrix(blk + "attn_q_b.weight", {hp_.q_lora_rank, q_dim}, on);
  } else if (!split) {
    l.q = binder_.matrix(blk + "attn_q.weight", {embd, q_dim}, on);
  }
  l.kv_a_mqa = binder_.matrix(blk + "attn_kv_a_mqa.weight", {embd, hp_.kv_cache_dims()}, on);
  l.kv_a_norm = binder_.f32(blk + "attn_kv_a_norm.weight", {lora}, on);
  if (split) return bind_head_shards(l, il);
  l.attn_output = binder_.matrix(blk + "attn_output.weight", {heads * v_head, embd}, on);
  if (binder_.has(blk + "attn_k_b.weight") || !binder_.has(blk + "attn_kv_b.weight")) {
    l.k_b = binder_.matrix(blk + "attn_k_b.weight", {nope, lora, heads}, on);
    l.v_b = binder_.matrix(blk + "attn_v_b.weight", {lora, v_head, heads}, on);
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
  l.k_b = binder_.owned(k_b, type, nope, lora, heads, blk + "attn_k_b (from attn_kv_b)", on);
  l.v_b = binder_.owned(v_b, type, lora, v_head, heads, blk + "attn_v_b (from attn_kv_b)", on);
}

// Each share's part of the head-split projections. The shares must cover the heads in order,
// the first on the layer's device.
void Deepseek2Model::bind_head_shards(Layer& l, uint32_t il) {
  const std::string blk = fmt::format("blk.{}.", il);
  const int64_t embd = hp_.n_embd, heads = hp_.n_head, nope = hp_.qk_nope_dim;
  const int64_t lora = hp_.kv_lora_rank, v_head = hp_.v_head_dim, q_row = hp_.qk_head_dim();
  const std::vector<AttentionShare>& shares = devices_.heads[il];
  int32_t next = 0;
  for (const AttentionShare& s : shares) {
    if (s.first_head != next || s.n_heads <= 0 || !s.device)
      fail("layer {}: the head shares must cover heads 0-{} in order, each with at least one head "
           "(share {} starts at head {})", il, heads - 1, &s - shares.data(), s.first_head);
    for (const AttentionShare* before = shares.data(); before != &s; ++before)
      if (before->device == s.device)
        fail("layer {}: {} has two head shares; give each device one share", il, s.device->name());
    next += s.n_heads;
  }
  if (next != heads || shares.front().device != l.device)
    fail("layer {}: the head shares cover {} of {} heads{}", il, next, heads,
         shares.front().device != l.device ? ", and the first is not on the layer's device" : "");
  if (!binder_.has(blk + "attn_k_b.weight"))
    fail("{}: layer {} stores the older combined attn_kv_b, which head-split attention does not "
         "take apart; keep each layer's heads on one device", binder_.file().name(), il);
  for (const AttentionShare& s : shares) {
    HeadShard shard{.device = s.device, .first_head = s.first_head, .n_heads = s.n_heads};
    Backend& on = *s.device;
    const int64_t first_row = s.first_head * q_row, n_rows = s.n_heads * q_row;
    shard.q = hp_.q_lora_rank > 0
                  ? binder_.rows(blk + "attn_q_b.weight", {hp_.q_lora_rank, heads * q_row}, first_row, n_rows, on)
                  : binder_.rows(blk + "attn_q.weight", {embd, heads * q_row}, first_row, n_rows, on);
    std::vector<int32_t> held(size_t(s.n_heads));
    for (int32_t h = 0; h < s.n_heads; ++h) held[size_t(h)] = s.first_head + h;
    shard.k_b = binder_.matrices(blk + "attn_k_b.weight", {nope, lora, heads}, held, on);
    shard.v_b = binder_.matrices(blk + "attn_v_b.weight", {lora, v_head, heads}, held, on);
    shard.attn_output = binder_.columns(blk + "attn_output.weight", {heads * v_head, embd},
                                        s.first_head * v_head, s.n_heads * v_head, on);
    l.head_shards.push_back(std::move(shard));
  }
}

const KvLayerView& Deepseek2Model::cache_copy(HeadShard& shard, const KvLayerView& cache) {
  for (const HeadShard::CacheCopy& c : shard.cache_copies)
    if (c.of == cache.data) return c.view;
  const size_t bytes = size_t(cache.n_seq * cache.n_ctx * cache.row_bytes());
  HeadShard::CacheCopy copy{.of = cache.data,
                            .buffer = shard.device->allocate(bytes, "copy of a layer's KV cache")};
  copy.view = cache;
  copy.view.data = copy.buffer->data();
  return shard.cache_copies.emplace_back(std::move(copy)).view;
}

void Deepseek2Model::split_attention(uint32_t il, const Batch& batch, const KvLayerView& cache,
                                     const float* h, float* out) {
  using W = Workspace;
  Layer& l = layers_[il];
  Backend& be = *l.device;
  Workspace& ws = workspace(be);
  const int64_t T = int64_t(batch.tokens.size()), embd = hp_.n_embd, nope = hp_.qk_nope_dim;
  const int64_t lora = hp_.kv_lora_rank, kv_row = hp_.kv_cache_dims(), q_row = hp_.qk_head_dim();
  const float eps = hp_.rms_norm_eps;
  const ActivationBits bits = projection_bits();
  // On the layer's device: the queries' input (q_a normed, or h itself without q LoRA) and the
  // normed, roped latent of each token, stored in its cache (q_a's norm in the same op).
  const int64_t q_in = hp_.q_lora_rank > 0 ? hp_.q_lora_rank : embd;
  float* q_a = hp_.q_lora_rank > 0 ? ws.get(W::kQueryLora, T * q_in) : nullptr;
  if (q_a)
    be.matmul({.weight = l.q_a,
               .input = h,
               .output = q_a,
               .n_tokens = T,
               .kernels = batch.kernels,
               .activations = bits});
  const float* q_input = q_a ? q_a : h;
  float* kv = ws.get(W::kLatent, T * kv_row);
  be.matmul({.weight = l.kv_a_mqa,
             .input = h,
             .output = kv,
             .n_tokens = T,
             .kernels = batch.kernels,
             .activations = bits});
  be.store_latent({.rows = kv,
                   .norm_weight = l.kv_a_norm,
                   .norm_dims = lora,
                   .eps = eps,
                   .rope = rope_,
                   .cache = cache,
                   .positions = ws.inputs.positions,
                   .seq_ids = ws.inputs.seq_ids,
                   .n_tokens = T,
                   .query_lora = q_a,
                   .query_lora_norm = q_a ? l.q_a_norm : nullptr,
                   .query_lora_dims = q_a ? q_in : 0});

  // Each share: its heads' queries, attention and part of the output projection. The other
  // devices' shares are started first (their devices work while this one does its own).
  auto run_share = [&](HeadShard& shard, const float* input, const float* latent, float* partial) {
    Backend& dev = *shard.device;
    Workspace& dws = workspace(dev);
    const StepInputs& in = dws.inputs;
    const int64_t n = shard.n_heads;
    const KvLayerView& view = &dev == &be ? cache : cache_copy(shard, cache);
    if (&dev != &be)
      dev.kv_store({.rows = latent, .cache = view, .positions = in.positions, .seq_ids = in.seq_ids,
                    .n_tokens = T});
    float* q = dws.get(W::kQuery, T * n * q_row);
    float* attn = dws.get(W::kAttention, T * n * hp_.v_head_dim);
    dev.matmul({.weight = shard.q,
                .input = input,
                .output = q,
                .n_tokens = T,
                .kernels = batch.kernels,
                .activations = bits});
    dev.mla_attention({.q = q,
                       .k_b = shard.k_b,
                       .v_b = shard.v_b,
                       .cache = view,
                       .positions = in.positions,
                       .seq_ids = in.seq_ids,
                       .n_tokens = T,
                       .n_heads = n,
                       .nope_dims = nope,
                       .v_head_dims = hp_.v_head_dim,
                       .scale = attention_scale_,
                       .output = attn,
                       .kernels = batch.kernels,
                       .rotate_queries = true,
                       .rope = rope_});
    dev.matmul({.weight = shard.attn_output,
                .input = attn,
                .output = partial,
                .n_tokens = T,
                .kernels = batch.kernels,
                .activations = bits});
  };
  for (HeadShard& shard : l.head_shards) {
    Backend& dev = *shard.device;
    if (&dev == &be) continue;
    Workspace& dws = workspace(dev);
    float* input = dws.get(W::kQueryLora, T * q_in);
    float* latent = dws.get(W::kLatent, T * kv_row);
    transfer(be, q_input, dev, input, size_t(T * q_in) * sizeof(float));
    transfer(be, kv, dev, latent, size_t(T * kv_row) * sizeof(float));
    run_share(shard, input, latent, dws.get(W::kPartial, T * embd));
  }
  run_share(l.head_shards.front(), q_input, kv, out);
  // The other shares' partial outputs, sent all at once into their own places here, then added
  // in share order by one op.
  const int64_t n_others = int64_t(l.head_shards.size()) - 1;
  float* others = ws.get(W::kOtherPartials, n_others * T * embd);
  std::vector<const float*> parts;
  for (HeadShard& shard : l.head_shards) {
    Backend& dev = *shard.device;
    if (&dev == &be) continue;
    float* place = others + int64_t(parts.size()) * T * embd;
    transfer(dev, workspace(dev).get(W::kPartial, T * embd), be, place,
             size_t(T * embd) * sizeof(float), CopiedBy::Sender);
    parts.push_back(place);
  }
  be.add_parts(out, parts, T * embd);
}

}  // namespace tandem
