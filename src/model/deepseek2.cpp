#include "model/deepseek2.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>

#include "core/error.h"
#include "core/replica_choice.h"
#include "gguf/gguf_file.h"
#include "model/deepseek2_internal.h"
#include "quant/quant.h"

namespace tandem {

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
  expert_seen_.resize(n_layers_);
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
    expert_seen_[il].assign(size_t(n_exp), 0);
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
  bind_routing_counts();
  graph_device_ = find_graph_device();
}

// Work still queued on a device reads the model's buffers: it ends first.
Deepseek2Model::~Deepseek2Model() { synchronize_devices(/*report=*/false); }

void Deepseek2Model::bind_experts(Layer& l, uint32_t il) {
  const std::string blk = fmt::format("blk.{}.", il);
  const int64_t embd = hp_.n_embd, ff = hp_.n_ff_expert, n_exp = hp_.n_expert;
  const std::vector<Backend*>& where = devices_.experts[il];
  TANDEM_CHECK(int64_t(where.size()) == n_exp);
  static const std::vector<std::vector<Backend*>> no_copies;
  const std::vector<std::vector<Backend*>>& copies =
      il < devices_.expert_copies.size() ? devices_.expert_copies[il] : no_copies;
  TANDEM_CHECK(copies.empty() || int64_t(copies.size()) == n_exp);
  auto holds = [&](Backend* d, int32_t e) {
    return where[size_t(e)] == d ||
           (!copies.empty() && std::ranges::find(copies[size_t(e)], d) != copies[size_t(e)].end());
  };
  std::vector<Backend*> devices;  // in order of first appearance: homes, then copies
  for (Backend* d : where)
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  for (const std::vector<Backend*>& of : copies)
    for (Backend* d : of)
      if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  for (Backend* d : devices) {
    ExpertShard shard;
    shard.device = d;
    shard.local_index.assign(size_t(n_exp), -1);
    std::vector<int32_t> held;
    for (int32_t e = 0; e < n_exp; ++e)
      if (holds(d, e)) {
        shard.local_index[size_t(e)] = int32_t(held.size());
        held.push_back(e);
      }
    shard.gate = binder_.matrices(blk + "ffn_gate_exps.weight", {embd, ff, n_exp}, held, *d);
    shard.up = binder_.matrices(blk + "ffn_up_exps.weight", {embd, ff, n_exp}, held, *d);
    shard.down = binder_.matrices(blk + "ffn_down_exps.weight", {ff, embd, n_exp}, held, *d);
    if (d->uses_host_memory()) {
      shard.device_local_index = shard.local_index.data();
    } else {
      shard.local_index_buffer = d->allocate(size_t(n_exp) * sizeof(int32_t), blk + "expert index");
      d->copy_from_host(shard.local_index_buffer->data(), shard.local_index.data(), size_t(n_exp) * sizeof(int32_t));
      shard.device_local_index = static_cast<const int32_t*>(shard.local_index_buffer->data());
    }
    l.shards.push_back(std::move(shard));
  }
  if (std::ranges::any_of(copies, [](const auto& of) { return !of.empty(); }))
    bind_expert_copies(l, il, copies);
  l.expert_stacks = {&binder_.info(blk + "ffn_gate_exps.weight", {embd, ff, n_exp}),
                     &binder_.info(blk + "ffn_up_exps.weight", {embd, ff, n_exp}),
                     &binder_.info(blk + "ffn_down_exps.weight", {ff, embd, n_exp})};
}

// The holders table of a layer whose experts have copies, on every device that holds some.
void Deepseek2Model::bind_expert_copies(Layer& l, uint32_t il,
                                        const std::vector<std::vector<Backend*>>& copies) {
  const int64_t n_exp = hp_.n_expert;
  const std::vector<Backend*>& where = devices_.experts[il];
  auto shard_of = [&](const Backend* d) {
    for (size_t i = 0; i < l.shards.size(); ++i)
      if (l.shards[i].device == d) return int32_t(i);
    return int32_t(-1);
  };
  auto kind = [](const Backend* d) { return d->name().substr(0, d->name().find(':')); };
  if (l.shards.size() > size_t(kMaxReplicaShards))
    fail("layer {}: its experts are spread over {} devices; copies of experts work over at most {}",
         il, l.shards.size(), kMaxReplicaShards);
  for (const std::vector<Backend*>& of : copies)
    l.max_holders = std::max(l.max_holders, int32_t(1 + of.size()));
  // Per expert its holders' shard numbers, the home first, -1 padding.
  std::vector<int32_t> holders(size_t(n_exp * l.max_holders), -1);
  for (int64_t e = 0; e < n_exp; ++e) {
    int32_t* h = &holders[size_t(e * l.max_holders)];
    h[0] = shard_of(where[size_t(e)]);
    for (size_t i = 0; i < copies[size_t(e)].size(); ++i) {
      const Backend* d = copies[size_t(e)][i];
      if (d->uses_host_memory() || kind(d) != kind(where[size_t(e)]))
        fail("layer {} expert {}: a copy on {} beside its home on {}; copies of experts go only to "
             "devices of the home's kind with memory of their own (the same kernels give the "
             "same bits)",
             il, e, d->name(), where[size_t(e)]->name());
      h[i + 1] = shard_of(d);
    }
  }
  const size_t table_bytes = holders.size() * sizeof(int32_t);
  for (ExpertShard& shard : l.shards) {
    Backend& d = *shard.device;
    if (d.uses_host_memory()) continue;  // the host's experts have no copies: its index is fixed
    const std::string what = fmt::format("blk.{}.expert holders", il);
    shard.holders_buffer = d.allocate(table_bytes, what);
    d.copy_from_host(shard.holders_buffer->data(), holders.data(), table_bytes);
    shard.step_index_buffer = d.allocate(size_t(n_exp) * sizeof(int32_t), what);
    std::vector<int32_t> home(size_t(n_exp), -1);
    for (int64_t e = 0; e < n_exp; ++e)
      if (where[size_t(e)] == &d) home[size_t(e)] = shard.local_index[size_t(e)];
    shard.home_index_buffer = d.allocate(size_t(n_exp) * sizeof(int32_t), what);
    d.copy_from_host(shard.home_index_buffer->data(), home.data(), size_t(n_exp) * sizeof(int32_t));
  }
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
        for (size_t e = 0; e < expert_seen_[il].size(); ++e)
          if (expert_seen_[il][e])
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
  const size_t bytes = size_t(cache.n_seq * cache.n_ctx * cache.row()) * sizeof(float);
  HeadShard::CacheCopy copy{.of = cache.data,
                            .buffer = shard.device->allocate(bytes, "copy of a layer's KV cache")};
  copy.view = cache;
  copy.view.data = copy.buffer->floats();
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
  // On the layer's device: the queries' input (q_a normed, or h itself without q LoRA) and the
  // normed, roped latent of each token, stored in its cache.
  const int64_t q_in = hp_.q_lora_rank > 0 ? hp_.q_lora_rank : embd;
  const float* q_input = h;
  if (hp_.q_lora_rank > 0) {
    float* q_a = ws.get(W::kQueryLora, T * q_in);
    be.matmul({.weight = l.q_a, .input = h, .output = q_a, .n_tokens = T, .kernels = batch.kernels});
    be.rms_norm({.input = q_a, .weight = l.q_a_norm, .output = q_a, .n_rows = T, .dim = q_in,
                 .input_stride = q_in, .output_stride = q_in, .eps = eps});
    q_input = q_a;
  }
  float* kv = ws.get(W::kLatent, T * kv_row);
  be.matmul({.weight = l.kv_a_mqa, .input = h, .output = kv, .n_tokens = T, .kernels = batch.kernels});
  be.rms_norm({.input = kv, .weight = l.kv_a_norm, .output = kv, .n_rows = T, .dim = lora,
               .input_stride = kv_row, .output_stride = kv_row, .eps = eps});
  be.rope({.data = kv, .positions = ws.inputs.positions, .n_tokens = T, .n_heads = 1,
           .head_stride = kv_row, .token_stride = kv_row, .offset = lora, .params = rope_});
  be.kv_store({.rows = kv, .cache = cache, .positions = ws.inputs.positions,
               .seq_ids = ws.inputs.seq_ids, .n_tokens = T});

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
    dev.matmul({.weight = shard.q, .input = input, .output = q, .n_tokens = T, .kernels = batch.kernels});
    dev.rope({.data = q, .positions = in.positions, .n_tokens = T, .n_heads = n,
              .head_stride = q_row, .token_stride = n * q_row, .offset = nope, .params = rope_});
    dev.mla_attention({.q = q, .k_b = shard.k_b, .v_b = shard.v_b, .cache = view,
                       .positions = in.positions, .seq_ids = in.seq_ids, .n_tokens = T,
                       .n_heads = n, .nope_dims = nope, .v_head_dims = hp_.v_head_dim,
                       .scale = attention_scale_, .output = attn, .kernels = batch.kernels});
    dev.matmul({.weight = shard.attn_output, .input = attn, .output = partial, .n_tokens = T,
                .kernels = batch.kernels});
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

void Deepseek2Model::run_layers(const Batch& batch, std::span<const KvLayerView> cache, Backend* at,
                                float* x, float* logits, bool capturing) {
  using W = Workspace;
  const int64_t T = int64_t(batch.tokens.size()), R = int64_t(batch.logit_rows.size());
  const int64_t embd = hp_.n_embd, heads = hp_.n_head, nope = hp_.qk_nope_dim;
  const int64_t lora = hp_.kv_lora_rank, kv_row = hp_.kv_cache_dims(), q_row = hp_.qk_head_dim();
  const float eps = hp_.rms_norm_eps;

  for (size_t il = 0; il < layers_.size(); ++il) {
    const Layer& l = layers_[il];
    Backend& be = *l.device;
    Workspace& ws = workspace(be);
    const StepInputs& in = ws.inputs;
    if (at != &be) {  // a cut between devices: the residual stream moves
      float* moved = ws.get(W::kResidual, T * embd);
      transfer(*at, x, be, moved, size_t(T * embd) * sizeof(float));
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
    if (!l.head_shards.empty()) {
      split_attention(uint32_t(il), batch, cache[il], h, out);
    } else {
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
      be.rope({.data = q, .positions = in.positions, .n_tokens = T, .n_heads = heads,
               .head_stride = q_row, .token_stride = heads * q_row, .offset = nope, .params = rope_});
      be.rope({.data = kv, .positions = in.positions, .n_tokens = T, .n_heads = 1,
               .head_stride = kv_row, .token_stride = kv_row, .offset = lora, .params = rope_});
      be.kv_store({.rows = kv, .cache = cache[il], .positions = in.positions, .seq_ids = in.seq_ids,
                   .n_tokens = T});
      be.mla_attention({.q = q, .k_b = l.k_b, .v_b = l.v_b, .cache = cache[il],
                        .positions = in.positions, .seq_ids = in.seq_ids,
                        .n_tokens = T, .n_heads = heads, .nope_dims = nope,
                        .v_head_dims = hp_.v_head_dim, .scale = attention_scale_, .output = attn,
                        .kernels = batch.kernels});
      be.matmul({.weight = l.attn_output, .input = attn, .output = out, .n_tokens = T, .kernels = batch.kernels});
    }
    be.add(x, out, T * embd);

    // ---- feed-forward: dense SwiGLU, or routed experts plus shared experts ----
    be.rms_norm({.input = x, .weight = l.ffn_norm, .output = h, .n_rows = T, .dim = embd,
                 .input_stride = embd, .output_stride = embd, .eps = eps});
    if (!l.moe) {
      float* slots = ws.get(W::kSlots, T * std::max<int64_t>(hp_.n_expert_used, 1) * embd);
      be.moe({.input = h, .gate = l.ffn_gate, .up = l.ffn_up, .down = l.ffn_down,
              .expert_ids = in.dense_ids, .n_expert = 1, .n_tokens = T, .top_k = 1,
              .dim = embd, .ffn_dims = hp_.n_ff_dense, .slots = slots, .kernels = batch.kernels,
              .activations = ffn_activations_});
      be.moe_reduce({.slots = slots, .weights = in.dense_weights, .n_tokens = T, .top_k = 1,
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
  for (int64_t r = 0; r < R;) {  // runs of consecutive rows as one copy each
    const int32_t row = batch.logit_rows[size_t(r)];
    int64_t n = 1;
    while (r + n < R && batch.logit_rows[size_t(r + n)] == row + n) ++n;
    at->copy_rows(last + r * embd, embd, x + int64_t(row) * embd, embd, n, embd);
    r += n;
  }
  if (at != &head) {
    float* moved = workspace(head).get(W::kLast, R * embd);
    transfer(*at, last, head, moved, size_t(R * embd) * sizeof(float));
    last = moved;
  }
  float* out_logits = workspace(head).get(W::kLogits, R * hp_.n_vocab);
  head.rms_norm({.input = last, .weight = output_norm_, .output = last, .n_rows = R, .dim = embd,
                 .input_stride = embd, .output_stride = embd, .eps = eps});
  head.matmul({.weight = output_, .input = last, .output = out_logits, .n_tokens = R, .kernels = batch.kernels});
  const size_t logit_bytes = size_t(R * hp_.n_vocab) * sizeof(float);
  if (capturing) {  // read by forward() after the replay
    head.copy_to_host_async(workspace(head).host(Workspace::kHostLogits, logit_bytes), out_logits, logit_bytes);
    return;
  }
  head.copy_to_host(logits, out_logits, logit_bytes);
}

// The layer's routing for `h`: top-k expert ids and weights per token, in the layer device's
// memory; `counts` (or null) counts the choices.
void Deepseek2Model::route(const Layer& l, const float* h, int64_t T, KernelChoice kernels,
                           int32_t* ids, float* weights, uint64_t* counts) {
  Backend& be = *l.device;
  float* logits = workspace(be).get(Workspace::kRouter, T * hp_.n_expert);
  be.matmul({.weight = l.router, .input = h, .output = logits, .n_tokens = T, .kernels = kernels});
  be.moe_route({.logits = logits, .bias = l.expert_bias, .n_tokens = T, .n_expert = hp_.n_expert,
                .top_k = hp_.n_expert_used,
                .gating = hp_.gating == ExpertGating::Sigmoid ? MoeGating::Sigmoid : MoeGating::Softmax,
                .n_groups = hp_.n_expert_group, .n_groups_used = hp_.n_group_used,
                .normalize = hp_.expert_weights_norm, .scale = hp_.expert_weights_scale,
                .expert_ids = ids, .expert_weights = weights, .counts = counts});
}

bool Deepseek2Model::start_reading_expert(const Layer& l, int32_t e, bool urgent) const {
  bool reading = false;
  for (const ExpertShard& shard : l.shards)
    if (const int32_t i = shard.local_index[size_t(e)]; i >= 0 && shard.device->uses_host_memory())
      for (const WeightView* stack : {&shard.gate, &shard.up, &shard.down})
        reading |= binder_.file().start_reading(stack->matrix(i).data, stack->matrix_bytes(), urgent);
  return reading;
}

void Deepseek2Model::read_ahead_on_host(const Layer& l, const float* h, const int32_t* ids,
                                        int64_t T, KernelChoice kernels) {
  using W = Workspace;
  const size_t il = size_t(&l - layers_.data());
  const int64_t k = hp_.n_expert_used;
  for (int64_t s = 0; s < T * k; ++s) {
    // An expert's first use: start reading all of it from disk at once if it is not in memory
    // yet (on a warm cache this costs one mincore() call, once per expert).
    if (uint8_t& seen = expert_seen_[il][size_t(ids[s])]; !seen) {
      seen = 1;
      start_reading_expert(l, ids[s], /*urgent=*/true);
    }
  }
  // Cold start: guess the next layer's choice from this layer's input (consecutive layers'
  // inputs differ little) and start reading those experts now, so that the disk works while
  // this layer computes instead of after it. A wrong guess costs a read, never a result. Once
  // a guess finds nothing to read (a warm cache), that layer is not guessed for again.
  if (il + 1 < layers_.size() && guessing_[il + 1] && layers_[il + 1].device == l.device) {
    const Layer& next = layers_[il + 1];
    Workspace& ws = workspace(*l.device);
    int32_t* guess = ws.ints(W::kGuessIds, T * k);
    route(next, h, T, kernels, guess, ws.get(W::kGuessWeights, T * k), /*counts=*/nullptr);
    bool reading = false;
    for (int64_t s = 0; s < T * k; ++s)
      if (!expert_seen_[il + 1][size_t(guess[s])]) reading |= start_reading_expert(next, guess[s], /*urgent=*/false);
    guessing_[il + 1] = reading;
  }
}

// Routing runs on the layer's device and stays there. Each device holding chosen experts
// computes their slots at the same time as the layer's device computes the shared experts and
// its own: devices with memory of their own get the input and routing copied over; the host's
// experts run in a host task on the layer device's stream (copies in and out in stream order,
// so a captured step includes them). Every device writes only its own experts' slots into
// zeroed buffers, and the layer's device adds them up (x + 0 is exact) and sums the slots in
// routing order: the result does not depend on how the experts are spread.
void Deepseek2Model::routed_experts(const Layer& l, const float* h, int64_t T,
                                    KernelChoice kernels, float* out, float* shared_out) {
  using W = Workspace;
  Backend& be = *l.device;
  Workspace& ws = workspace(be);
  const StepInputs& in = ws.inputs;
  const int64_t embd = hp_.n_embd, k = hp_.n_expert_used, slot_floats = T * k * embd;
  const size_t il = size_t(&l - layers_.data());
  int32_t* ids = ws.ints(W::kExpertIds, T * k);
  float* weights = ws.get(W::kExpertWeights, T * k);
  route(l, h, T, kernels, ids, weights, l.route_counts);
  if (be.uses_host_memory()) read_ahead_on_host(l, h, ids, T, kernels);

  float* slots = ws.get(W::kSlots, slot_floats);
  const bool own_shard = std::any_of(l.shards.begin(), l.shards.end(),
                                     [&](const ExpertShard& shard) { return shard.device == &be; });
  if (own_shard && l.shards.size() > 1) be.zero(slots, slot_floats);
  // With copies of experts, each device first works out which of its experts it computes this
  // step (all of them reach the same answer from the same routing). A step with as many slots as
  // the layer has experts (a prompt chunk) chooses nearly all of them: each is read at home.
  const bool use_copies = T * k < hp_.n_expert;
  int32_t busy_shard = -1;  // the layer's device, which also runs the shared experts
  for (size_t i = 0; i < l.shards.size(); ++i)
    if (l.shards[i].device == &be) busy_shard = int32_t(i);
  auto op_for = [&](const ExpertShard& shard, const float* input, const int32_t* shard_ids, float* shard_slots) {
    const int32_t* local_index = shard.device_local_index;
    if (shard.home_index_buffer && !use_copies) {
      local_index = static_cast<const int32_t*>(shard.home_index_buffer->data());
    } else if (shard.step_index_buffer) {
      auto* step_index = static_cast<int32_t*>(shard.step_index_buffer->data());
      const auto* holders = static_cast<const int32_t*>(shard.holders_buffer->data());
      shard.device->pick_replicas({.expert_ids = shard_ids, .n_slots = T * k, .holders = holders,
                                   .max_holders = l.max_holders, .n_expert = hp_.n_expert,
                                   .shard = int32_t(&shard - l.shards.data()),
                                   .busy_shard = busy_shard,
                                   .busy_load = int32_t(hp_.n_expert_shared),
                                   .local_index = shard.device_local_index,
                                   .step_local_index = step_index});
      local_index = step_index;
    }
    return MoeOp{.input = input, .gate = shard.gate, .up = shard.up, .down = shard.down,
                 .expert_ids = shard_ids, .local_index = local_index,
                 .n_expert = hp_.n_expert, .n_tokens = T, .top_k = k, .dim = embd,
                 .ffn_dims = hp_.n_ff_expert, .slots = shard_slots, .kernels = kernels,
                 .activations = ffn_activations_};
  };

  // Other devices with memory of their own: input and routing over, their experts started.
  for (const ExpertShard& shard : l.shards) {
    Backend& device = *shard.device;
    if (&device == &be || device.uses_host_memory()) continue;
    Workspace& remote = workspace(device);
    float* input = remote.get(W::kNormed, T * embd);
    int32_t* remote_ids = remote.ints(W::kExpertIds, T * k);
    float* remote_slots = remote.get(W::kSlots, slot_floats);
    transfer(be, h, device, input, size_t(T * embd) * sizeof(float));
    transfer(be, ids, device, remote_ids, size_t(T * k) * sizeof(int32_t));
    device.zero(remote_slots, slot_floats);
    device.moe(op_for(shard, input, remote_ids, remote_slots));  // asynchronous on its stream
  }
  // The host's experts while the layer runs on a device: a host task on its stream.
  std::shared_ptr<Event> host_done;
  float* host_slots = nullptr;
  for (const ExpertShard& shard : l.shards) {
    if (shard.device == &be || !shard.device->uses_host_memory()) continue;
    TANDEM_CHECK(!host_done);  // one host backend: its buffers below serve one shard a layer
    auto* host_input = static_cast<float*>(ws.host(W::kHostInput, size_t(T * embd) * sizeof(float)));
    auto* host_ids = static_cast<int32_t*>(ws.host(W::kHostIds, size_t(T * k) * sizeof(int32_t)));
    host_slots = static_cast<float*>(ws.host(W::kHostSlots, size_t(slot_floats) * sizeof(float)));
    be.copy_to_host_async(host_input, h, size_t(T * embd) * sizeof(float));
    be.copy_to_host_async(host_ids, ids, size_t(T * k) * sizeof(int32_t));
    const MoeOp op = op_for(shard, host_input, host_ids, host_slots);
    host_done = be.host_task([this, &l, &shard, op, il] {
      std::vector<uint8_t>& seen = expert_seen_[il];
      for (int64_t s = 0; s < op.n_tokens * op.top_k; ++s) {
        const int32_t e = op.expert_ids[s];
        if (shard.local_index[size_t(e)] < 0) {  // another device's slot: must add as zero
          std::fill_n(op.slots + s * op.dim, op.dim, 0.0f);
        } else if (!seen[size_t(e)]) {
          seen[size_t(e)] = 1;
          start_reading_expert(l, e, /*urgent=*/true);
        }
      }
      shard.device->moe(op);
    });
  }
  // Meanwhile on the layer's device: the shared experts, then its own routed experts.
  if (shared_out) {
    float* shared_slot = ws.get(W::kSharedSlot, T * embd);
    be.moe({.input = h, .gate = l.gate_shexp, .up = l.up_shexp, .down = l.down_shexp,
            .expert_ids = in.dense_ids, .n_expert = 1, .n_tokens = T, .top_k = 1, .dim = embd,
            .ffn_dims = int64_t(hp_.n_ff_expert) * hp_.n_expert_shared, .slots = shared_slot,
            .kernels = kernels, .activations = ffn_activations_});
    be.moe_reduce({.slots = shared_slot, .weights = in.dense_weights, .n_tokens = T,
                   .top_k = 1, .dim = embd, .output = shared_out});
  }
  for (const ExpertShard& shard : l.shards)
    if (shard.device == &be) be.moe(op_for(shard, h, ids, slots));

  // The other devices' slots, sent all at once, each into its own place here (the first straight
  // into `slots` when this device holds none of the layer's experts), then added in by one op.
  int64_t n_others = 0;
  for (const ExpertShard& shard : l.shards) n_others += shard.device != &be;
  const int64_t n_places = own_shard ? n_others : n_others - 1;
  float* others = n_places > 0 ? ws.get(W::kOtherSlots, n_places * slot_floats) : nullptr;
  std::vector<const float*> parts;
  bool have_slots = own_shard;
  for (const ExpertShard& shard : l.shards) {
    Backend& device = *shard.device;
    if (&device == &be) continue;
    float* place = have_slots ? others + int64_t(parts.size()) * slot_floats : slots;
    if (device.uses_host_memory()) {
      be.wait_for(host_done);
      be.copy_from_host_async(place, host_slots, size_t(slot_floats) * sizeof(float));
    } else {
      transfer(device, workspace(device).get(W::kSlots, slot_floats), be, place,
               size_t(slot_floats) * sizeof(float), CopiedBy::Sender);
    }
    if (have_slots) parts.push_back(place);
    have_slots = true;
  }
  be.add_parts(slots, parts, slot_floats);
  be.moe_reduce({.slots = slots, .weights = weights, .n_tokens = T, .top_k = k, .dim = embd,
                 .output = out});
}

}  // namespace tandem
