// The step machinery of Deepseek2Model around its forward pass: each device's buffers, the
// step's inputs in each device's memory, moving activations between devices, the routing counts
// kept on the devices, and decode steps captured as graphs and replayed.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

#include "core/error.h"
#include "model/deepseek2.h"
#include "model/deepseek2_internal.h"

namespace tandem {

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
    l.route_counts =
        static_cast<uint64_t*>(it->second->data()) + size_t(&l - layers_.data()) * hp_.n_expert;
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
    for (const HeadShard& shard : l.head_shards)
      if (shard.device != g) return nullptr;
    for (const ExpertShard& shard : l.shards)
      if (shard.device != g && !shard.device->uses_host_memory()) return nullptr;
  }
  return g;
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

void Deepseek2Model::transfer(Backend& from, const void* src, Backend& to, void* dst,
                              size_t bytes, CopiedBy by) {
  if (&from == &to) {
    if (src != dst)
      to.copy_rows(static_cast<float*>(dst), 0, static_cast<const float*>(src), 0, 1,
                   int64_t(bytes / sizeof(float)));
    return;
  }
  const bool peer = by == CopiedBy::Sender ? from.copy_to_peer(to, dst, src, bytes)
                                           : to.copy_from_peer(from, dst, src, bytes);
  if (peer) return;  // GPU to GPU: no host wait
  if (staging_.size() < bytes) staging_.resize(bytes);
  from.copy_to_host(staging_.data(), src, bytes);
  to.copy_from_host(dst, staging_.data(), bytes);
}

const Deepseek2Model::StepInputs& Deepseek2Model::step_inputs(Backend& on) const {
  for (const auto& [device, ws] : workspaces_)
    if (device == &on) return ws->inputs;
  check_failed("step inputs of a device that runs no layer", __FILE__, __LINE__);
}

// Each device that runs layers gets the batch's positions and sequence ids in its own memory,
// and the constant routing of dense FFNs; the embeddings device gets the token ids. Host-memory
// devices read the batch in place.
void Deepseek2Model::prepare_step(const Batch& batch) {
  using W = Workspace;
  const int64_t T = int64_t(batch.tokens.size());
  auto upload = [&](Backend& on, W::Buffer which,
                    std::span<const int32_t> values) -> const int32_t* {
    if (on.uses_host_memory()) return values.data();
    int32_t* dst = workspace(on).ints(which, T);
    on.copy_from_host(dst, values.data(), values.size_bytes());
    return dst;
  };
  if (step_devices_.empty()) {  // once: the devices that run layers or heads of one
    step_devices_.assign(devices_.layers.begin(), devices_.layers.end());
    for (const std::vector<AttentionShare>& shares : devices_.heads)
      for (const AttentionShare& share : shares) step_devices_.push_back(share.device);
    std::sort(step_devices_.begin(), step_devices_.end());
    step_devices_.erase(std::unique(step_devices_.begin(), step_devices_.end()), step_devices_.end());
  }
  workspace(*devices_.embeddings).inputs.tokens = upload(*devices_.embeddings, W::kTokens, batch.tokens);
  for (Backend* on : step_devices_) {
    Workspace& ws = workspace(*on);
    StepInputs& in = ws.inputs;
    in.positions = upload(*on, W::kPositions, batch.positions);
    in.seq_ids = upload(*on, W::kSeqIds, batch.seq_ids);
    // Constant contents, written once for each new length (and again if growing them failed).
    if (T > ws.dense_filled) {
      ws.dense_filled = 0;
      int32_t* ids = ws.ints(W::kDenseIds, T);
      float* weights = ws.get(W::kDenseWeights, T);
      const std::vector<int32_t> zeros(size_t(T), 0);
      const std::vector<float> ones(size_t(T), 1.0f);
      on->copy_from_host(ids, zeros.data(), zeros.size() * sizeof(int32_t));
      on->copy_from_host(weights, ones.data(), ones.size() * sizeof(float));
      ws.dense_filled = T;
    }
    int32_t* ids = ws.ints(W::kDenseIds, T);
    float* weights = ws.get(W::kDenseWeights, T);
    in.dense_ids = ids;
    in.dense_weights = weights;
  }
}

void Deepseek2Model::forward(const Batch& batch, std::span<const KvLayerView> cache,
                             float* logits) {
  const int64_t T = int64_t(batch.tokens.size());
  TANDEM_CHECK(batch.positions.size() == batch.tokens.size() &&
               batch.seq_ids.size() == batch.tokens.size());
  TANDEM_CHECK(cache.size() == layers_.size());
  if (T == 0) return;
  for (int32_t token : batch.tokens)
    if (token < 0 || uint32_t(token) >= hp_.n_vocab)
      fail("token id {} is outside the vocabulary (0..{})", token, hp_.n_vocab - 1);
  for (int32_t row : batch.logit_rows) TANDEM_CHECK(row >= 0 && row < int64_t(T));
  finish_loading(/*show_progress=*/false);  // nothing left to do after the first call
  // Every device has finished the step when this returns, whatever happened: an op's error shows
  // with its own step, and nothing still runs when the caller reuses or frees its buffers.
  try {
    step(batch, cache, logits);
  } catch (...) {
    synchronize_devices(/*report=*/false);
    throw;
  }
  synchronize_devices(/*report=*/true);
}

void Deepseek2Model::synchronize_devices(bool report) {
  std::exception_ptr first;
  for (auto& [device, ws] : workspaces_) {
    try {
      device->synchronize();  // each one, even after another failed
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first && report) std::rethrow_exception(first);
}

void Deepseek2Model::step(const Batch& batch, std::span<const KvLayerView> cache, float* logits) {
  using W = Workspace;
  const int64_t T = int64_t(batch.tokens.size()), R = int64_t(batch.logit_rows.size());
  const int64_t embd = hp_.n_embd;
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
  const size_t logit_bytes = size_t(R * hp_.n_vocab) * sizeof(float);
  if (!entry->sized || entry->capture_failed) {  // the first step of a shape sizes every buffer
    workspace(g).host(W::kHostLogits, logit_bytes);
    run_layers(batch, cache, &g, residual, logits, /*capturing=*/false);
    entry->sized = true;
    return;
  }
  if (!entry->graph || entry->generation != buffer_generation_ ||
      entry->cache != cache.front().data) {
    const uint64_t generation = buffer_generation_;
    entry->graph.reset();
    g.begin_capture();
    try {
      run_layers(batch, cache, &g, residual, nullptr, /*capturing=*/true);
      entry->graph = g.end_capture();
    } catch (const std::exception& e) {
      try {
        (void)g.end_capture();  // out of capture mode; the recording is void
      } catch (...) {
      }
      // Nothing ran: this step and later ones of this shape go op by op, which fails on its own
      // if the error was not the capture's.
      entry->capture_failed = true;
      std::fprintf(
          stderr,
          "tandem: warning: %s could not capture a step of %lld tokens as a graph (%s); such "
          "steps run op by op\n",
          g.name().c_str(), (long long)T, e.what());
      return run_layers(batch, cache, &g, residual, logits, /*capturing=*/false);
    }
    TANDEM_CHECK(buffer_generation_ == generation);  // nothing was allocated inside the capture
    entry->generation = generation;
    entry->cache = cache.front().data;
  }
  g.replay(*entry->graph);
  g.synchronize();
  std::memcpy(logits, workspace(g).host(W::kHostLogits, logit_bytes), logit_bytes);
}

}  // namespace tandem
