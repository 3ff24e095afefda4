#include "model/deepseek2.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

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
  uint64_t* route_counts = nullptr;        // [n_expert] choices so far, on `device`
  bool moe = false;
  Backend* device = nullptr;               // runs everything above but the expert shards
};

// The routed experts of one layer that live on one device: stacks of their gate, up and down
// matrices (n_expert_here x the dense shapes with n_ff_expert) and where each expert sits.
struct Deepseek2Model::ExpertShard {
  Backend* device = nullptr;
  WeightView gate, up, down;
  std::vector<int32_t> local_index;  // [n_expert]: matrix in the stacks, -1 if elsewhere (host)
  const int32_t* device_local_index = nullptr;  // the same in the device's memory
  std::shared_ptr<DeviceBuffer> local_index_buffer;
};

// The step's per-token arrays as one device's ops read them (its memory).
struct Deepseek2Model::StepInputs {
  const int32_t* tokens = nullptr;      // [T], on the embeddings device only
  const int32_t* positions = nullptr;   // [T]
  const int32_t* seq_ids = nullptr;     // [T]
  const int32_t* dense_ids = nullptr;   // [T] zeros: a dense FFN is expert 0 of 1
  const float* dense_weights = nullptr; // [T] ones
};

// A decode step's graph for one shape; `seen` before it is captured: the first step of a shape
// runs op by op and sizes every buffer, so that nothing allocates inside the capture.
struct Deepseek2Model::GraphEntry {
  int64_t n_tokens;
  KernelChoice kernels;
  bool seen = false;
  uint64_t generation = 0;  // buffer_generation_ when captured
  std::unique_ptr<Graph> graph;
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
    kOtherSlots, // [T, top_k, n_embd] slots another device computed, to be added
    kExpertIds,  // [T, top_k] int32 routing of the current MoE layer
    kExpertWeights,  // [T, top_k]
    kGuessIds,   // [T, top_k] int32 the next layer's routing guessed from this one's input
    kGuessWeights,   // [T, top_k]
    kTokens,     // [T] int32
    kPositions,  // [T] int32
    kSeqIds,     // [T] int32
    kDenseIds,   // [T] int32 zeros
    kDenseWeights,   // [T] ones
    kLast,       // [rows, n_embd] hidden states that need logits
    kLogits,     // [rows, n_vocab]
    kCount
  };
  // Host memory of this device's kind (page-locked for a GPU) for its asynchronous copies.
  enum HostBuffer {
    kHostInput,   // [T, n_embd] a MoE layer's input, for the host's experts
    kHostIds,     // [T, top_k] int32 its routing
    kHostSlots,   // [T, top_k, n_embd] the host's expert outputs
    kHostLogits,  // [rows, n_vocab] logits of a replayed graph
    kHostCount
  };
  Backend* device = nullptr;
  uint64_t* generation = nullptr;  // the model's buffer_generation_
  std::shared_ptr<DeviceBuffer> buffers[kCount];
  std::shared_ptr<DeviceBuffer> host_buffers[kHostCount];
  StepInputs inputs;
  int64_t dense_filled = 0;  // entries of kDenseIds / kDenseWeights holding their constants

  float* get(Buffer which, int64_t n_floats) { return static_cast<float*>(grow(which, size_t(n_floats) * 4)); }
  int32_t* ints(Buffer which, int64_t n) { return static_cast<int32_t*>(grow(which, size_t(n) * 4)); }
  void* host(HostBuffer which, size_t bytes) {
    static constexpr const char* kNames[kHostCount] = {"host experts' input", "host experts' routing",
                                                       "host experts' outputs", "logits (host)"};
    std::shared_ptr<DeviceBuffer>& buffer = host_buffers[which];
    if (!buffer || buffer->size() < std::max<size_t>(bytes, 1)) {
      buffer.reset();
      buffer = device->allocate_host(std::max<size_t>(bytes, 1), kNames[which]);
      ++*generation;
    }
    return buffer->data();
  }

 private:
  void* grow(Buffer which, size_t bytes) {
    static constexpr const char* kNames[kCount] = {
        "residual stream", "normed activations", "q LoRA activations", "queries", "latent keys",
        "attention output", "sub-layer output", "shared experts output", "shared experts slot",
        "router logits", "expert outputs", "expert outputs of another device", "expert ids",
        "expert weights", "guessed expert ids", "guessed expert weights", "token ids",
        "positions", "sequence ids", "dense routing ids", "dense routing weights",
        "final hidden states", "logits"};
    bytes = std::max<size_t>(bytes, 4);
    std::shared_ptr<DeviceBuffer>& buffer = buffers[which];
    if (!buffer || buffer->size() < bytes) {
      buffer.reset();  // give the old one back first: budgets are tight on small devices
      buffer = device->allocate(bytes, kNames[which]);
      ++*generation;  // graphs captured with the old pointer are stale now
    }
    return buffer->data();
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

Deepseek2Model::~Deepseek2Model() = default;

void Deepseek2Model::bind_routing_counts() {
  const size_t per_device = size_t(n_layers_) * hp_.n_expert;
  for (Layer& l : layers_) {
    if (!l.moe) continue;
    auto it = std::find_if(count_buffers_.begin(), count_buffers_.end(),
                           [&](const auto& entry) { return entry.first == l.device; });
    if (it == count_buffers_.end()) {
      auto buffer = l.device->allocate(per_device * sizeof(uint64_t), "expert choice counts");
      const std::vector<uint64_t> zeros(per_device, 0);
      l.device->copy_from_host(buffer->data(), zeros.data(), per_device * sizeof(uint64_t));
      count_buffers_.emplace_back(l.device, std::move(buffer));
      it = count_buffers_.end() - 1;
    }
    l.route_counts = static_cast<uint64_t*>(it->second->data()) + size_t(&l - layers_.data()) * hp_.n_expert;
  }
}

std::vector<std::vector<uint64_t>> Deepseek2Model::routing_counts() const {
  std::vector<std::vector<uint64_t>> counts(n_layers_);
  const size_t per_device = size_t(n_layers_) * hp_.n_expert;
  std::vector<uint64_t> all(per_device);
  for (const auto& [device, buffer] : count_buffers_) {
    device->copy_to_host(all.data(), buffer->data(), per_device * sizeof(uint64_t));
    for (uint32_t il = 0; il < n_layers_; ++il)
      if (layers_[il].moe && layers_[il].device == device)
        counts[il].assign(all.begin() + il * hp_.n_expert, all.begin() + (il + 1) * hp_.n_expert);
  }
  return counts;
}

// Capturable when one device that can capture runs every layer and the head, and each routed
// expert lives there or in host memory (computed by a host task, part of the graph): a step then
// has no cut that would need the host to wait mid-step. The embeddings may live anywhere: the
// lookup runs before the graph.
Backend* Deepseek2Model::find_graph_device() const {
  Backend* g = devices_.output;
  if (!g || !g->can_capture()) return nullptr;
  for (const Layer& l : layers_) {
    if (l.device != g) return nullptr;
    for (const ExpertShard& shard : l.shards)
      if (shard.device != g && !shard.device->uses_host_memory()) return nullptr;
  }
  return g;
}

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
    if (d->uses_host_memory()) {
      shard.device_local_index = shard.local_index.data();
    } else {
      shard.local_index_buffer = d->allocate(size_t(n_exp) * sizeof(int32_t), blk + "expert index");
      d->copy_from_host(shard.local_index_buffer->data(), shard.local_index.data(), size_t(n_exp) * sizeof(int32_t));
      shard.device_local_index = static_cast<const int32_t*>(shard.local_index_buffer->data());
    }
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
  ws->generation = &buffer_generation_;
  workspaces_.emplace_back(&on, std::move(ws));
  return *workspaces_.back().second;
}

void Deepseek2Model::transfer(Backend& from, const void* src, Backend& to, void* dst, size_t bytes) {
  if (&from == &to) {
    if (src != dst)
      to.copy_rows(static_cast<float*>(dst), 0, static_cast<const float*>(src), 0, 1, int64_t(bytes / sizeof(float)));
    return;
  }
  if (to.copy_from_peer(from, dst, src, bytes)) return;  // GPU to GPU: no host wait
  if (staging_.size() < bytes) staging_.resize(bytes);
  from.copy_to_host(staging_.data(), src, bytes);
  to.copy_from_host(dst, staging_.data(), bytes);
}

const Deepseek2Model::StepInputs& Deepseek2Model::step_inputs(Backend& on) const {
  for (const auto& [device, ws] : workspaces_)
    if (device == &on) return ws->inputs;
  TANDEM_CHECK(!"step inputs of a device that runs no layer");
  __builtin_unreachable();
}

// Each device that runs layers gets the batch's positions and sequence ids in its own memory,
// and the constant routing of dense FFNs; the embeddings device gets the token ids. Host-memory
// devices read the batch in place.
void Deepseek2Model::prepare_step(const Batch& batch) {
  using W = Workspace;
  const int64_t T = int64_t(batch.tokens.size());
  auto upload = [&](Backend& on, W::Buffer which, std::span<const int32_t> values) -> const int32_t* {
    if (on.uses_host_memory()) return values.data();
    int32_t* dst = workspace(on).ints(which, T);
    on.copy_from_host(dst, values.data(), values.size_bytes());
    return dst;
  };
  std::vector<Backend*> devices(devices_.layers.begin(), devices_.layers.end());
  devices.push_back(devices_.embeddings);
  std::sort(devices.begin(), devices.end());
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  for (Backend* on : devices) {
    Workspace& ws = workspace(*on);
    StepInputs& in = ws.inputs;
    if (on == devices_.embeddings) in.tokens = upload(*on, W::kTokens, batch.tokens);
    if (std::find(devices_.layers.begin(), devices_.layers.end(), on) == devices_.layers.end()) continue;
    in.positions = upload(*on, W::kPositions, batch.positions);
    in.seq_ids = upload(*on, W::kSeqIds, batch.seq_ids);
    // Constant contents, written once for each new length.
    int32_t* ids = ws.ints(W::kDenseIds, T);
    float* weights = ws.get(W::kDenseWeights, T);
    if (T > ws.dense_filled) {
      const std::vector<int32_t> zeros(size_t(T), 0);
      const std::vector<float> ones(size_t(T), 1.0f);
      on->copy_from_host(ids, zeros.data(), zeros.size() * sizeof(int32_t));
      on->copy_from_host(weights, ones.data(), ones.size() * sizeof(float));
      ws.dense_filled = T;
    }
    in.dense_ids = ids;
    in.dense_weights = weights;
  }
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
  for (int32_t row : batch.logit_rows) TANDEM_CHECK(row >= 0 && row < T);
  const int64_t embd = hp_.n_embd;
  finish_loading(/*show_progress=*/false);  // nothing left to do after the first call
  prepare_step(batch);

  Backend* at = devices_.embeddings;  // the device holding the residual stream
  float* x = workspace(*at).get(W::kResidual, T * embd);
  at->get_rows(token_embd_, step_inputs(*at).tokens, T, x);  // [T, n_embd]

  // A decode-sized step with a logit row per token, in order, can be a graph.
  bool graph = captures_steps() && T <= kMaxGraphTokens && R == T;
  for (int64_t r = 0; graph && r < R; ++r) graph = batch.logit_rows[size_t(r)] == r;
  if (!graph) return run_layers(batch, cache, at, x, logits, /*capturing=*/false);

  Backend& g = *graph_device_;
  float* residual = workspace(g).get(W::kResidual, T * embd);
  if (at != &g) transfer(*at, x, g, residual, size_t(T * embd) * sizeof(float));
  auto entry = std::find_if(graphs_.begin(), graphs_.end(), [&](const GraphEntry& e) {
    return e.n_tokens == T && e.kernels == batch.kernels;
  });
  if (entry == graphs_.end()) {
    graphs_.push_back({.n_tokens = T, .kernels = batch.kernels});
    entry = graphs_.end() - 1;
  }
  if (!entry->seen) {  // the first step of this shape sizes every buffer, op by op
    entry->seen = true;
    workspace(g).host(W::kHostLogits, size_t(R * hp_.n_vocab) * sizeof(float));
    return run_layers(batch, cache, &g, residual, logits, /*capturing=*/false);
  }
  if (!entry->graph || entry->generation != buffer_generation_) {
    const uint64_t generation = buffer_generation_;
    g.begin_capture();
    try {
      run_layers(batch, cache, &g, residual, nullptr, /*capturing=*/true);
    } catch (...) {
      try {
        (void)g.end_capture();  // leave the device out of capture mode; the recording is void
      } catch (...) {
      }
      entry->graph.reset();
      throw;
    }
    entry->graph = g.end_capture();
    TANDEM_CHECK(buffer_generation_ == generation);  // nothing was allocated inside the capture
    entry->generation = generation;
  }
  g.replay(*entry->graph);
  g.synchronize();
  std::memcpy(logits, workspace(g).host(W::kHostLogits, 0), size_t(R * hp_.n_vocab) * sizeof(float));
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
    be.add(x, out, T * embd);

    // ---- feed-forward: dense SwiGLU, or routed experts plus shared experts ----
    be.rms_norm({.input = x, .weight = l.ffn_norm, .output = h, .n_rows = T, .dim = embd,
                 .input_stride = embd, .output_stride = embd, .eps = eps});
    if (!l.moe) {
      float* slots = ws.get(W::kSlots, T * std::max<int64_t>(hp_.n_expert_used, 1) * embd);
      be.moe({.input = h, .gate = l.ffn_gate, .up = l.ffn_up, .down = l.ffn_down,
              .expert_ids = in.dense_ids, .n_expert = 1, .n_tokens = T, .top_k = 1,
              .dim = embd, .ffn_dims = hp_.n_ff_dense, .slots = slots, .kernels = batch.kernels});
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
  // Every device is done with this step: the head's result depended on all of them. Waiting on
  // each also reports what failed there asynchronously (a host task's error) with this step.
  for (auto& [device, ws] : workspaces_) device->synchronize();
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
  auto op_for = [&](const ExpertShard& shard, const float* input, const int32_t* shard_ids, float* shard_slots) {
    return MoeOp{.input = input, .gate = shard.gate, .up = shard.up, .down = shard.down,
                 .expert_ids = shard_ids, .local_index = shard.device_local_index,
                 .n_expert = hp_.n_expert, .n_tokens = T, .top_k = k, .dim = embd,
                 .ffn_dims = hp_.n_ff_expert, .slots = shard_slots, .kernels = kernels};
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
            .kernels = kernels});
    be.moe_reduce({.slots = shared_slot, .weights = in.dense_weights, .n_tokens = T,
                   .top_k = 1, .dim = embd, .output = shared_out});
  }
  for (const ExpertShard& shard : l.shards)
    if (shard.device == &be) be.moe(op_for(shard, h, ids, slots));

  // The other devices' slots: the first taken as they are when this device holds none of the
  // layer's experts, the others added in.
  bool have_slots = own_shard;
  for (const ExpertShard& shard : l.shards) {
    Backend& device = *shard.device;
    if (&device == &be) continue;
    float* other = have_slots ? ws.get(W::kOtherSlots, slot_floats) : slots;
    if (device.uses_host_memory()) {
      be.wait_for(host_done);
      be.copy_from_host_async(other, host_slots, size_t(slot_floats) * sizeof(float));
    } else {
      transfer(device, workspace(device).get(W::kSlots, slot_floats), be, other,
               size_t(slot_floats) * sizeof(float));
    }
    if (have_slots) be.add(slots, other, slot_floats);
    have_slots = true;
  }
  be.moe_reduce({.slots = slots, .weights = weights, .n_tokens = T, .top_k = k, .dim = embd,
                 .output = out});
}

}  // namespace tandem
