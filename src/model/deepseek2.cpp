#include "model/deepseek2.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
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
  std::vector<ExpertShard> shards;         // the routed experts, by device
  WeightView gate_shexp, up_shexp, down_shexp;  // shared experts, width n_ff_expert * n_shared
  // The file's tensors of the routed experts (gate, up, down stacks of all experts).
  std::array<const gguf::TensorInfo*, 3> expert_stacks{};
  bool moe = false;
  Backend* device = nullptr;               // runs everything above but the expert shards
};

// The routed experts of one layer that live on one device: stacks of their gate, up and down
// matrices (n_expert_here x the dense shapes with n_ff_expert) and where each expert sits.
struct Deepseek2Model::ExpertShard {
  Backend* device = nullptr;
  WeightView gate, up, down;
  std::vector<int32_t> local_index;  // [n_expert]: matrix in the stacks, -1 if elsewhere
};

// Activation buffers of one device, allocated on first use and grown for larger batches: a
// device that only holds experts gets only the buffers the experts need.
struct Deepseek2Model::Workspace {
  enum Buffer {
    kResidual,   // [T, n_embd] residual stream
    kNormed,     // [T, n_embd] normed input of a sub-layer
    kQueryLora,  // [T, q_lora]
    kQuery,      // [T, n_head, nope + rope]
    kLatent,     // [T, kv_lora + rope]
    kAttention,  // [T, n_head * v_head]
    kOutput,     // [T, n_embd] sub-layer output
    kShared,     // [T, n_embd] shared experts output
    kSharedSlot, // [T, 1, n_embd] shared experts before weighting
    kRouter,     // [T, n_expert]
    kSlots,      // [T, top_k, n_embd] expert outputs before weighting
    kLast,       // [rows, n_embd] hidden states that need logits
    kLogits,     // [rows, n_vocab]
    kCount
  };
  Backend* device = nullptr;
  std::shared_ptr<DeviceBuffer> buffers[kCount];

  float* get(Buffer which, int64_t n_floats) {
    static constexpr const char* kNames[kCount] = {
        "residual stream", "normed activations", "q LoRA activations", "queries", "latent keys",
        "attention output", "sub-layer output", "shared experts output", "shared experts slot",
        "router logits",
        "expert outputs", "final hidden states", "logits"};
    const size_t bytes = size_t(std::max<int64_t>(n_floats, 1)) * sizeof(float);
    std::shared_ptr<DeviceBuffer>& buffer = buffers[which];
    if (!buffer || buffer->size() < bytes) {
      buffer.reset();  // give the old one back first: budgets are tight on small devices
      buffer = device->allocate(bytes, kNames[which]);
    }
    return buffer->floats();
  }
};

Deepseek2Model::Deepseek2Model(const gguf::GgufFile& file, Backend& backend)
    : Deepseek2Model(file, [&] {
        const Deepseek2Hparams hp = read_deepseek2_hparams(file);
        return DevicePlan::single(backend, hp.n_layer - hp.n_nextn_layers, hp.n_expert);
      }()) {}

Deepseek2Model::Deepseek2Model(const gguf::GgufFile& file, const DevicePlan& devices)
    : hp_(read_deepseek2_hparams(file)), devices_(devices), binder_(file, *devices.embeddings) {
  const int64_t embd = hp_.n_embd, vocab = hp_.n_vocab;
  n_layers_ = hp_.n_layer - hp_.n_nextn_layers;  // V3 files may append MTP blocks: not run
  TANDEM_CHECK(devices_.layers.size() == n_layers_ && devices_.experts.size() == n_layers_);
  token_embd_ = binder_.matrix("token_embd.weight", {embd, vocab}, *devices_.embeddings);
  Backend& out = *devices_.output;
  output_norm_ = binder_.f32("output_norm.weight", {embd}, out);
  // Some files tie the LM head to the embeddings.
  output_ = binder_.matrix(binder_.has("output.weight") ? "output.weight" : "token_embd.weight", {embd, vocab}, out);

  layers_.resize(n_layers_);
  routing_counts_.resize(n_layers_);
  guessing_.assign(n_layers_, 0);
  for (uint32_t il = 0; il < n_layers_; ++il) {
    Layer& l = layers_[il];
    Backend& on = *devices_.layers[il];
    l.device = &on;
    const std::string blk = fmt::format("blk.{}.", il);
    l.attn_norm = binder_.f32(blk + "attn_norm.weight", {embd}, on);
    bind_attention(l, il, on);
    l.ffn_norm = binder_.f32(blk + "ffn_norm.weight", {embd}, on);
    l.moe = hp_.is_moe_layer(il);
    if (!l.moe) {
      const int64_t ff = hp_.n_ff_dense;
      l.ffn_gate = binder_.matrix(blk + "ffn_gate.weight", {embd, ff}, on);
      l.ffn_up = binder_.matrix(blk + "ffn_up.weight", {embd, ff}, on);
      l.ffn_down = binder_.matrix(blk + "ffn_down.weight", {ff, embd}, on);
      continue;
    }
    const int64_t n_exp = hp_.n_expert;
    routing_counts_[il].assign(size_t(n_exp), 0);
    guessing_[il] = 1;
    l.router = binder_.matrix(blk + "ffn_gate_inp.weight", {embd, n_exp}, on);
    if (binder_.has(blk + "exp_probs_b.bias")) l.expert_bias = binder_.f32(blk + "exp_probs_b.bias", {n_exp}, on);
    bind_experts(l, il);
    if (hp_.n_expert_shared > 0) {
      const int64_t shared_ff = int64_t(hp_.n_ff_expert) * hp_.n_expert_shared;
      l.gate_shexp = binder_.matrix(blk + "ffn_gate_shexp.weight", {embd, shared_ff}, on);
      l.up_shexp = binder_.matrix(blk + "ffn_up_shexp.weight", {embd, shared_ff}, on);
      l.down_shexp = binder_.matrix(blk + "ffn_down_shexp.weight", {shared_ff, embd}, on);
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

void Deepseek2Model::bind_experts(Layer& l, uint32_t il) {
  const std::string blk = fmt::format("blk.{}.", il);
  const int64_t embd = hp_.n_embd, ff = hp_.n_ff_expert, n_exp = hp_.n_expert;
  const std::vector<Backend*>& where = devices_.experts[il];
  TANDEM_CHECK(int64_t(where.size()) == n_exp);
  std::vector<Backend*> devices;  // in order of first appearance
  for (Backend* d : where)
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  for (Backend* d : devices) {
    ExpertShard shard;
    shard.device = d;
    shard.local_index.assign(size_t(n_exp), -1);
    std::vector<int32_t> held;
    for (int32_t e = 0; e < n_exp; ++e)
      if (where[size_t(e)] == d) {
        shard.local_index[size_t(e)] = int32_t(held.size());
        held.push_back(e);
      }
    shard.gate = binder_.matrices(blk + "ffn_gate_exps.weight", {embd, ff, n_exp}, held, *d);
    shard.up = binder_.matrices(blk + "ffn_up_exps.weight", {embd, ff, n_exp}, held, *d);
    shard.down = binder_.matrices(blk + "ffn_down_exps.weight", {ff, embd, n_exp}, held, *d);
    l.shards.push_back(std::move(shard));
  }
  l.expert_stacks = {&binder_.info(blk + "ffn_gate_exps.weight", {embd, ff, n_exp}),
                     &binder_.info(blk + "ffn_up_exps.weight", {embd, ff, n_exp}),
                     &binder_.info(blk + "ffn_down_exps.weight", {ff, embd, n_exp})};
}

bool Deepseek2Model::read_on_demand(const WeightBinder::Bound& bound) const {
  if (!bound.in_place) return false;
  if (bound.tensor->name == "token_embd.weight") return output_.data != bound.tensor->data;
  for (const Layer& l : layers_)
    for (const gguf::TensorInfo* stack : l.expert_stacks)
      if (stack == bound.tensor) return true;
  return false;
}

void Deepseek2Model::start_reading_weights() const {
  // In the order the first token needs them: the output head (bound first, 172 MiB in the lite
  // model) last, so that layer 0 does not wait for it.
  const WeightBinder::Bound* head = nullptr;
  for (const WeightBinder::Bound& b : binder_.bound()) {
    if (!b.in_place || read_on_demand(b)) continue;
    if (b.tensor->data == output_.data) head = &b;
    else binder_.file().start_reading(b.tensor->data, b.tensor->n_bytes, /*urgent=*/false);
  }
  if (head) binder_.file().start_reading(head->tensor->data, head->tensor->n_bytes, /*urgent=*/false);
}

std::vector<gguf::FileRange> Deepseek2Model::touched_file_ranges() const {
  std::vector<gguf::FileRange> ranges;
  for (const WeightBinder::Bound& b : binder_.bound()) {
    const gguf::TensorInfo& t = *b.tensor;
    if (!read_on_demand(b)) {
      ranges.push_back({t.file_index, t.file_offset, t.n_bytes});
      continue;
    }
    for (size_t il = 0; il < layers_.size(); ++il)
      for (const gguf::TensorInfo* stack : layers_[il].expert_stacks) {
        if (stack != &t) continue;
        const uint64_t matrix_bytes = t.n_bytes / t.shape[2];
        for (size_t e = 0; e < routing_counts_[il].size(); ++e)
          if (routing_counts_[il][e] > 0)
            ranges.push_back({t.file_index, t.file_offset + e * matrix_bytes, matrix_bytes});
      }
  }
  return ranges;
}

void Deepseek2Model::bind_attention(Layer& l, uint32_t il, Backend& on) {
  const std::string blk = fmt::format("blk.{}.", il);
  const int64_t embd = hp_.n_embd, heads = hp_.n_head, nope = hp_.qk_nope_dim;
  const int64_t lora = hp_.kv_lora_rank, v_head = hp_.v_head_dim;
  const int64_t q_dim = heads * hp_.qk_head_dim();
  if (hp_.q_lora_rank > 0) {
    l.q_a = binder_.matrix(blk + "attn_q_a.weight", {embd, hp_.q_lora_rank}, on);
    l.q_a_norm = binder_.f32(blk + "attn_q_a_norm.weight", {hp_.q_lora_rank}, on);
    l.q_b = binder_.matrix(blk + "attn_q_b.weight", {hp_.q_lora_rank, q_dim}, on);
  } else {
    l.q = binder_.matrix(blk + "attn_q.weight", {embd, q_dim}, on);
  }
  l.kv_a_mqa = binder_.matrix(blk + "attn_kv_a_mqa.weight", {embd, hp_.kv_cache_dims()}, on);
  l.kv_a_norm = binder_.f32(blk + "attn_kv_a_norm.weight", {lora}, on);
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

Deepseek2Model::Workspace& Deepseek2Model::workspace(Backend& on) {
  for (auto& [device, ws] : workspaces_)
    if (device == &on) return *ws;
  auto ws = std::make_unique<Workspace>();
  ws->device = &on;
  workspaces_.emplace_back(&on, std::move(ws));
  return *workspaces_.back().second;
}

void Deepseek2Model::transfer(Backend& from, const float* src, Backend& to, float* dst, int64_t n) {
  if (&from == &to) {
    if (src != dst) to.copy_rows(dst, n, src, n, 1, n);
    return;
  }
  if (staging_.size() < size_t(n)) staging_.resize(size_t(n));
  from.copy_to_host(staging_.data(), src, size_t(n) * sizeof(float));
  to.copy_from_host(dst, staging_.data(), size_t(n) * sizeof(float));
}

void Deepseek2Model::forward(const Batch& batch, std::span<const KvLayerView> cache, float* logits) {
  using W = Workspace;
  const int64_t T = int64_t(batch.tokens.size()), R = int64_t(batch.logit_rows.size());
  TANDEM_CHECK(batch.positions.size() == batch.tokens.size() && batch.seq_ids.size() == batch.tokens.size());
  TANDEM_CHECK(cache.size() == layers_.size());
  if (T == 0) return;
  for (int32_t token : batch.tokens)
    if (token < 0 || uint32_t(token) >= hp_.n_vocab)
      fail("token id {} is outside the vocabulary (0..{})", token, hp_.n_vocab - 1);
  const int64_t embd = hp_.n_embd, heads = hp_.n_head, nope = hp_.qk_nope_dim;
  const int64_t lora = hp_.kv_lora_rank, kv_row = hp_.kv_cache_dims(), q_row = hp_.qk_head_dim();
  const float eps = hp_.rms_norm_eps;
  dense_ids_.assign(size_t(T), 0);  // a dense FFN (or the shared experts) is expert 0 of 1
  dense_weights_.assign(size_t(T), 1.0f);

  Backend* at = devices_.embeddings;  // the device holding the residual stream
  float* x = workspace(*at).get(W::kResidual, T * embd);
  at->get_rows(token_embd_, batch.tokens.data(), T, x);  // [T, n_embd]

  for (size_t il = 0; il < layers_.size(); ++il) {
    const Layer& l = layers_[il];
    Backend& be = *l.device;
    Workspace& ws = workspace(be);
    if (at != &be) {  // a cut between devices: the residual stream moves
      float* moved = ws.get(W::kResidual, T * embd);
      transfer(*at, x, be, moved, T * embd);
      x = moved, at = &be;
    }
    float* h = ws.get(W::kNormed, T * embd);
    float* q = ws.get(W::kQuery, T * heads * q_row);
    float* kv = ws.get(W::kLatent, T * kv_row);
    float* attn = ws.get(W::kAttention, T * heads * hp_.v_head_dim);
    float* out = ws.get(W::kOutput, T * embd);

    // ---- attention ----
    be.rms_norm({.input = x, .weight = l.attn_norm, .output = h, .n_rows = T, .dim = embd,
                 .input_stride = embd, .output_stride = embd, .eps = eps});
    if (hp_.q_lora_rank > 0) {
      const int64_t q_lora = hp_.q_lora_rank;
      float* q_a = ws.get(W::kQueryLora, T * q_lora);
      be.matmul({.weight = l.q_a, .input = h, .output = q_a, .n_tokens = T, .kernels = batch.kernels});
      be.rms_norm({.input = q_a, .weight = l.q_a_norm, .output = q_a, .n_rows = T, .dim = q_lora,
                   .input_stride = q_lora, .output_stride = q_lora, .eps = eps});
      be.matmul({.weight = l.q_b, .input = q_a, .output = q, .n_tokens = T, .kernels = batch.kernels});
    } else {
      be.matmul({.weight = l.q, .input = h, .output = q, .n_tokens = T, .kernels = batch.kernels});
    }
    // The compressed latent (normalized) and the shared rope key of each token.
    be.matmul({.weight = l.kv_a_mqa, .input = h, .output = kv, .n_tokens = T, .kernels = batch.kernels});
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
                      .v_head_dims = hp_.v_head_dim, .scale = attention_scale_, .output = attn,
                      .kernels = batch.kernels});
    be.matmul({.weight = l.attn_output, .input = attn, .output = out, .n_tokens = T, .kernels = batch.kernels});
    be.add(x, out, T * embd);

    // ---- feed-forward: dense SwiGLU, or routed experts plus shared experts ----
    be.rms_norm({.input = x, .weight = l.ffn_norm, .output = h, .n_rows = T, .dim = embd,
                 .input_stride = embd, .output_stride = embd, .eps = eps});
    float* slots = ws.get(W::kSlots, T * std::max<int64_t>(hp_.n_expert_used, 1) * embd);
    if (!l.moe) {
      be.moe({.input = h, .gate = l.ffn_gate, .up = l.ffn_up, .down = l.ffn_down,
              .expert_ids = dense_ids_.data(), .n_expert = 1, .n_tokens = T, .top_k = 1,
              .dim = embd, .ffn_dims = hp_.n_ff_dense, .slots = slots, .kernels = batch.kernels});
      be.moe_reduce({.slots = slots, .weights = dense_weights_.data(), .n_tokens = T, .top_k = 1,
                     .dim = embd, .output = out});
      be.add(x, out, T * embd);
      continue;
    }
    float* shared = hp_.n_expert_shared > 0 ? ws.get(W::kShared, T * embd) : nullptr;
    routed_experts(l, h, T, batch.kernels, out, shared);
    be.add(x, out, T * embd);
    if (shared) be.add(x, shared, T * embd);
  }

  // ---- output head, only for the rows that need logits ----
  if (R == 0) return;
  Backend& head = *devices_.output;
  Workspace& ws = workspace(*at);
  float* last = ws.get(W::kLast, R * embd);
  for (int64_t r = 0; r < R; ++r) {
    const int32_t row = batch.logit_rows[size_t(r)];
    TANDEM_CHECK(row >= 0 && row < T);
    at->copy_rows(last + r * embd, embd, x + int64_t(row) * embd, embd, 1, embd);
  }
  if (at != &head) {
    float* moved = workspace(head).get(W::kLast, R * embd);
    transfer(*at, last, head, moved, R * embd);
    last = moved;
  }
  float* out_logits = workspace(head).get(W::kLogits, R * hp_.n_vocab);
  head.rms_norm({.input = last, .weight = output_norm_, .output = last, .n_rows = R, .dim = embd,
                 .input_stride = embd, .output_stride = embd, .eps = eps});
  head.matmul({.weight = output_, .input = last, .output = out_logits, .n_tokens = R, .kernels = batch.kernels});
  head.copy_to_host(logits, out_logits, size_t(R * hp_.n_vocab) * sizeof(float));
  head.synchronize();
}

// The layer's routing for `h`: top-k expert ids and weights per token, into host vectors.
void Deepseek2Model::route(const Layer& l, const float* h, int64_t T, KernelChoice kernels,
                           std::vector<int32_t>& ids, std::vector<float>& weights) {
  Backend& be = *l.device;
  float* logits = workspace(be).get(Workspace::kRouter, T * hp_.n_expert);
  ids.resize(size_t(T * hp_.n_expert_used));
  weights.resize(size_t(T * hp_.n_expert_used));
  be.matmul({.weight = l.router, .input = h, .output = logits, .n_tokens = T, .kernels = kernels});
  be.moe_route({.logits = logits, .bias = l.expert_bias, .n_tokens = T, .n_expert = hp_.n_expert,
                .top_k = hp_.n_expert_used,
                .gating = hp_.gating == ExpertGating::Sigmoid ? MoeGating::Sigmoid : MoeGating::Softmax,
                .n_groups = hp_.n_expert_group, .n_groups_used = hp_.n_group_used,
                .normalize = hp_.expert_weights_norm, .scale = hp_.expert_weights_scale,
                .expert_ids = ids.data(), .expert_weights = weights.data()});
  be.synchronize();  // the host reads the routing to know which devices have work
}

bool Deepseek2Model::start_reading_expert(const Layer& l, int32_t e, bool urgent) const {
  bool reading = false;
  for (const ExpertShard& shard : l.shards)
    if (const int32_t i = shard.local_index[size_t(e)]; i >= 0 && shard.device->uses_host_memory())
      for (const WeightView* stack : {&shard.gate, &shard.up, &shard.down})
        reading |= binder_.file().start_reading(stack->matrix(i).data, stack->matrix_bytes(), urgent);
  return reading;
}

// Routing runs on the layer's device; each device holding chosen experts computes their slots at
// the same time (the host only submits), while the layer's device computes the shared experts
// into `shared_out`; the slots come back to the layer's device, which sums them in routing
// order, so the result is the same however the experts are spread.
void Deepseek2Model::routed_experts(const Layer& l, const float* h, int64_t T,
                                    KernelChoice kernels, float* out, float* shared_out) {
  using W = Workspace;
  Backend& be = *l.device;
  Workspace& ws = workspace(be);
  const int64_t embd = hp_.n_embd, k = hp_.n_expert_used;
  route(l, h, T, kernels, expert_ids_, expert_weights_);
  const size_t il = size_t(&l - layers_.data());
  std::vector<uint64_t>& counts = routing_counts_[il];
  for (int32_t e : expert_ids_) {
    // An expert's first use: start reading all of it from disk at once if it is not in memory
    // yet (on a warm cache this costs one mincore() call, once per expert).
    if (counts[size_t(e)]++ == 0) start_reading_expert(l, e, /*urgent=*/true);
  }
  // Cold start: guess the next layer's choice from this layer's input (consecutive layers'
  // inputs differ little) and start reading those experts now, so that the disk works while
  // this layer computes instead of after it. A wrong guess costs a read, never a result. Once
  // a guess finds nothing to read (a warm cache), that layer is not guessed for again.
  if (il + 1 < layers_.size() && guessing_[il + 1] && layers_[il + 1].device == l.device) {
    const Layer& next = layers_[il + 1];
    route(next, h, T, kernels, guessed_ids_, guessed_weights_);
    bool reading = false;
    for (int32_t e : guessed_ids_)
      if (routing_counts_[il + 1][size_t(e)] == 0) reading |= start_reading_expert(next, e, /*urgent=*/false);
    guessing_[il + 1] = reading;
  }

  float* slots = ws.get(W::kSlots, T * k * embd);
  shard_work_.clear();
  for (const ExpertShard& shard : l.shards) {
    bool used = false;
    for (int32_t e : expert_ids_) used |= shard.local_index[size_t(e)] >= 0;
    if (!used) continue;
    const MoeOp op = {.input = h, .gate = shard.gate, .up = shard.up, .down = shard.down,
                      .expert_ids = expert_ids_.data(), .local_index = shard.local_index.data(),
                      .n_expert = hp_.n_expert, .n_tokens = T, .top_k = k, .dim = embd,
                      .ffn_dims = hp_.n_ff_expert, .slots = slots, .kernels = kernels};
    if (shard.device == &be) {
      shard_work_.push_back({&shard, nullptr});  // run after the remote ones are submitted
      continue;
    }
    Workspace& remote = workspace(*shard.device);
    float* input = remote.get(W::kNormed, T * embd);
    transfer(be, h, *shard.device, input, T * embd);
    float* remote_slots = remote.get(W::kSlots, T * k * embd);
    MoeOp remote_op = op;
    remote_op.input = input;
    remote_op.slots = remote_slots;
    shard.device->moe(remote_op);  // asynchronous on devices with their own stream
    shard_work_.push_back({&shard, remote_slots});
  }
  // While the other devices work: the shared experts, then this device's own routed experts.
  if (shared_out) {
    float* shared_slot = ws.get(W::kSharedSlot, T * embd);
    be.moe({.input = h, .gate = l.gate_shexp, .up = l.up_shexp, .down = l.down_shexp,
            .expert_ids = dense_ids_.data(), .n_expert = 1, .n_tokens = T, .top_k = 1, .dim = embd,
            .ffn_dims = int64_t(hp_.n_ff_expert) * hp_.n_expert_shared, .slots = shared_slot,
            .kernels = kernels});
    be.moe_reduce({.slots = shared_slot, .weights = dense_weights_.data(), .n_tokens = T,
                   .top_k = 1, .dim = embd, .output = shared_out});
  }
  for (const ShardWork& r : shard_work_)
    if (!r.slots)
      be.moe({.input = h, .gate = r.shard->gate, .up = r.shard->up, .down = r.shard->down,
              .expert_ids = expert_ids_.data(), .local_index = r.shard->local_index.data(),
              .n_expert = hp_.n_expert, .n_tokens = T, .top_k = k, .dim = embd,
              .ffn_dims = hp_.n_ff_expert, .slots = slots, .kernels = kernels});
  for (const ShardWork& r : shard_work_) {
    if (!r.slots) continue;
    Backend& device = *r.shard->device;
    if (staging_.size() < size_t(T * k * embd)) staging_.resize(size_t(T * k * embd));
    device.copy_to_host(staging_.data(), r.slots, size_t(T * k * embd) * sizeof(float));
    for (int64_t s = 0; s < T * k; ++s)
      if (r.shard->local_index[size_t(expert_ids_[size_t(s)])] >= 0)
        be.copy_from_host(slots + s * embd, staging_.data() + s * embd, size_t(embd) * sizeof(float));
  }
  be.moe_reduce({.slots = slots, .weights = expert_weights_.data(), .n_tokens = T, .top_k = k,
                 .dim = embd, .output = out});
}

}  // namespace tandem
