// The step machinery of Transformer (transformer.h): binding the embeddings and head, each
// device's buffers, the step's inputs in each device's memory, moving activations between
// devices, the routing counts kept on the devices, decode steps captured as graphs and replayed,
// and the layer loop with the output head.
#include "model/transformer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <utility>

#include "core/error.h"
#include "core/transport.h"
#include "model/transformer_internal.h"

namespace tandem {
namespace {

// A device of this rank for the binder's default (a rank runs at least one part of the model).
Backend& some_device_here(const DevicePlan& plan) {
  for (Backend* d : {plan.embeddings, plan.output})
    if (d) return *d;
  for (Backend* d : plan.layers)
    if (d) return *d;
  for (const std::vector<Backend*>& layer : plan.experts)
    for (Backend* d : layer)
      if (d) return *d;
  fail("this rank runs no part of the model: use fewer ranks than the model has layers");
}

}  // namespace

Transformer::Transformer(const gguf::GgufFile& file, const DevicePlan& devices, ModelInfo info,
                         float rms_eps)
    : binder_(file, some_device_here(devices)),
      info_(std::move(info)),
      devices_(devices),
      rms_eps_(rms_eps) {
  TANDEM_CHECK(devices_.layers.size() == info_.n_layer && devices_.experts.size() == info_.n_layer);
  if (info_.head_split.v_head_dim == 0)
    for (uint32_t il = 0; il < devices_.heads.size(); ++il)
      if (!devices_.heads[il].empty())
        fail(
            "{}: layer {}: the plan splits its attention heads over devices; only MLA "
            "(deepseek2) does that, {} keeps each layer's attention on one device",
            file.name(), il, info_.arch);
  if (const RankPlan& ranks = devices_.ranks; ranks.spread()) {
    TANDEM_CHECK(ranks.layers.size() == info_.n_layer && ranks.experts.size() == info_.n_layer);
    for (uint32_t il = 0; il < info_.n_layer; ++il)
      if ((!devices_.heads.empty() && !devices_.heads[il].empty()) ||
          (il < devices_.expert_copies.size() && !devices_.expert_copies[il].empty()))
        fail(
            "layer {}: split heads and copies of experts work within one machine, not in a run "
            "over several ranks",
            il);
  }
  ffn_.resize(info_.n_layer);
  expert_seen_.resize(info_.n_layer);
  guessing_.assign(info_.n_layer, 0);
}

// Work still queued on a device reads the model's buffers: it ends first.
Transformer::~Transformer() {
  synchronize_devices(/*report=*/false);
  try {
    if (logits_send_) logits_send_->wait();  // rank 0 took it before it stopped the run
  } catch (const std::exception&) {
  }
}

void Transformer::bind_embeddings_and_head() {
  const int64_t embd = info_.n_embd, vocab = info_.n_vocab;
  if (devices_.embeddings)  // else on another rank
    token_embd_ = binder_.matrix("token_embd.weight", {embd, vocab}, *devices_.embeddings);
  if (!devices_.output) return;
  Backend& out = *devices_.output;
  output_norm_ = binder_.f32("output_norm.weight", {embd}, out);
  // Some files tie the LM head to the embeddings.
  output_ = binder_.matrix(binder_.has("output.weight") ? "output.weight" : "token_embd.weight",
                           {embd, vocab}, out);
}

void Transformer::finish_binding() {
  bind_routing_counts();
  graph_device_ = find_graph_device();
  // Devices are waited for by spinning unless the host computes a share of the step (a layer or
  // some routed experts): then the waiting thread sleeps and leaves the cores to that work.
  bool host_works = false;
  for (const FfnLayer& l : ffn_) {
    host_works |= l.device && l.device->uses_host_memory();
    for (const ExpertShard& shard : l.shards) host_works |= shard.device->uses_host_memory();
  }
  std::vector<Backend*> devices = {devices_.output};
  for (const FfnLayer& l : ffn_) devices.push_back(l.device);
  std::ranges::sort(devices);
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  for (Backend* d : devices)
    if (d && !d->uses_host_memory()) d->set_spin_waits(!host_works);
}

std::vector<Backend*> Transformer::extra_layer_devices(uint32_t) const {
  return {};
}

bool Transformer::read_on_demand(const WeightBinder::Bound& bound) const {
  if (!bound.in_place) return false;
  if (bound.tensor->name == "token_embd.weight") return output_.data != bound.tensor->data;
  for (const FfnLayer& l : ffn_)
    for (const gguf::TensorInfo* stack : l.expert_stacks)
      if (stack == bound.tensor) return true;
  return false;
}

void Transformer::start_reading_weights() const {
  // In the order the first token needs them: the output head (bound first, 172 MiB in the lite
  // model) last, so that layer 0 does not wait for it.
  const WeightBinder::Bound* head = nullptr;
  for (const WeightBinder::Bound& b : binder_.bound()) {
    if (!b.in_place || read_on_demand(b)) continue;
    if (b.tensor->data == output_.data)
      head = &b;
    else
      binder_.file().start_reading(b.tensor->data, b.tensor->n_bytes, /*urgent=*/false);
  }
  if (head)
    binder_.file().start_reading(head->tensor->data, head->tensor->n_bytes, /*urgent=*/false);
}

std::vector<gguf::FileRange> Transformer::touched_file_ranges() const {
  std::vector<gguf::FileRange> ranges;
  for (const WeightBinder::Bound& b : binder_.bound()) {
    const gguf::TensorInfo& t = *b.tensor;
    if (!read_on_demand(b)) {
      ranges.push_back({t.file_index, t.file_offset, t.n_bytes});
      continue;
    }
    for (size_t il = 0; il < ffn_.size(); ++il)
      for (const gguf::TensorInfo* stack : ffn_[il].expert_stacks) {
        if (stack != &t) continue;
        const uint64_t matrix_bytes = t.n_bytes / t.shape[2];
        for (size_t e = 0; e < expert_seen_[il].size(); ++e)
          if (expert_seen_[il][e])
            ranges.push_back({t.file_index, t.file_offset + e * matrix_bytes, matrix_bytes});
      }
  }
  return ranges;
}

void Transformer::bind_routing_counts() {
  const size_t per_device = size_t(info_.n_layer) * info_.n_expert;
  for (FfnLayer& l : ffn_) {
    if (!l.moe || !l.device) continue;
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
        static_cast<uint64_t*>(it->second->data()) + size_t(&l - ffn_.data()) * info_.n_expert;
  }
}

std::vector<std::vector<uint64_t>> Transformer::routing_counts() const {
  std::vector<std::vector<uint64_t>> counts(info_.n_layer);
  const size_t n_expert = info_.n_expert, per_device = size_t(info_.n_layer) * n_expert;
  std::vector<uint64_t> all(per_device);
  for (const auto& [device, buffer] : count_buffers_) {
    device->copy_to_host(all.data(), buffer->data(), per_device * sizeof(uint64_t));
    for (uint32_t il = 0; il < info_.n_layer; ++il)
      if (ffn_[il].moe && ffn_[il].device == device)
        counts[il].assign(all.begin() + il * n_expert, all.begin() + (il + 1) * n_expert);
  }
  return counts;
}

// Capturable when one device that can capture runs every layer and the head, and each routed
// expert lives there or in host memory (computed by a host task, part of the graph): a step then
// has no cut that would need the host to wait mid-step. The embeddings may live anywhere: the
// lookup runs before the graph.
Backend* Transformer::find_graph_device() const {
  Backend* g = devices_.output;
  if (!g || !g->can_capture() || devices_.ranks.spread()) return nullptr;
  for (uint32_t il = 0; il < ffn_.size(); ++il) {
    const FfnLayer& l = ffn_[il];
    if (l.device != g) return nullptr;
    for (const Backend* d : extra_layer_devices(il))
      if (d != g) return nullptr;
    for (const ExpertShard& shard : l.shards)
      if (shard.device != g && !shard.device->uses_host_memory()) return nullptr;
  }
  return g;
}

Transformer::Workspace& Transformer::workspace(Backend& on) {
  for (auto& [device, ws] : workspaces_)
    if (device == &on) return *ws;
  auto ws = std::make_unique<Workspace>();
  ws->device = &on;
  ws->generation = &buffer_generation_;
  workspaces_.emplace_back(&on, std::move(ws));
  return *workspaces_.back().second;
}

int32_t Transformer::my_rank() const {
  return devices_.ranks.spread() ? devices_.ranks.transport->rank() : 0;
}

void Transformer::move_between_ranks(uint32_t cut, const std::string& crossing, int32_t from,
                                     Backend* from_device, const void* src, int32_t to,
                                     Backend* to_device, void* dst, size_t bytes) {
  const int32_t me = my_rank();
  if (me != from && me != to) return;
  const bool sends = me == from;
  const std::string what = fmt::format("{}, step {}", crossing, steps_);
  if (RankChannel* channel = rank_channel(cut, crossing, sends ? to : from, sends,
                                          sends ? *from_device : *to_device)) {
    if (sends)
      channel->send(src, bytes, what);
    else
      channel->receive(dst, bytes, what);
    return;
  }
  if (rank_staging_.size() < bytes) rank_staging_.resize(bytes);
  const std::span<std::byte> staged(rank_staging_.data(), bytes);
  Transport& transport = *devices_.ranks.transport;
  if (sends) {
    from_device->copy_to_host(staged.data(), src, bytes);
    transport.send(to, staged, what);
  } else {
    transport.receive(from, staged, what);
    to_device->copy_from_host(dst, staged.data(), bytes);
  }
}

RankChannel* Transformer::rank_channel(uint32_t cut, const std::string& crossing, int32_t peer,
                                       bool sends, Backend& device) {
  if (auto known = rank_channels_.find(cut); known != rank_channels_.end()) return known->second;
  Transport& transport = *devices_.ranks.transport;
  my_channel_end_ = device.rank_channel_end();
  const std::string asking = fmt::format("how {} can go device to device", crossing);
  const auto mine = std::as_bytes(std::span(&my_channel_end_, 1));
  const auto theirs = std::as_writable_bytes(std::span(&their_channel_end_, 1));
  if (sends) {
    transport.send(peer, mine, asking);
    transport.receive(peer, theirs, asking);
  } else {
    transport.receive(peer, theirs, asking);
    transport.send(peer, mine, asking);
  }
  const RankChannelEnd me = my_channel_end_, them = their_channel_end_;
  RankChannel*& channel = rank_channels_[cut];  // null: through host memory from now on
  if (me.kind != them.kind || me.kind == RankChannelKind::ThroughHost ||
      me.device_id == them.device_id)
    return nullptr;
  const char* how = me.kind == RankChannelKind::Nccl ? "NCCL" : "a simulated device channel";
  if (me.version != them.version) {
    std::fprintf(stderr,
                 "tandem: rank %d: %s goes through host memory: rank %d has another version of "
                 "%s (%u, here %u)\n",
                 my_rank(), crossing.c_str(), peer, how, them.version, me.version);
    return nullptr;
  }
  // One channel per pair of devices, whichever way and at however many cuts: both ranks find the
  // same one, having told each other their devices.
  OpenChannel* open = nullptr;
  for (OpenChannel& known : open_channels_)
    if (known.peer == peer && known.device == &device && known.peer_device_id == them.device_id)
      open = &known;
  if (!open) {
    try {
      open_channels_.push_back({peer, &device, them.device_id,
                                device.open_rank_channel(transport, peer, sends, crossing)});
    } catch (...) {
      rank_channels_.erase(cut);  // the run ends; no cut is left half-decided
      throw;
    }
    open = &open_channels_.back();
  }
  channel = open->channel.get();
  // Once per pair and kind of crossing: that GPU buffers do go device to device is worth knowing,
  // and tests look for it.
  bool& told = cut > ffn_.size() ? open->told_experts : open->told_residual;
  if (told) return channel;
  told = true;
  if (sends)
    std::fprintf(stderr, "tandem: rank %d: %s goes from %s to rank %d's device directly (%s)\n",
                 my_rank(), crossing.c_str(), device.name().c_str(), peer, how);
  else
    std::fprintf(stderr, "tandem: rank %d: %s comes from rank %d's device into %s directly (%s)\n",
                 my_rank(), crossing.c_str(), peer, device.name().c_str(), how);
  return channel;
}

void Transformer::transfer(Backend& from, const void* src, Backend& to, void* dst, size_t bytes,
                           CopiedBy by) {
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

const Transformer::StepInputs& Transformer::step_inputs(Backend& on) const {
  for (const auto& [device, ws] : workspaces_)
    if (device == &on) return ws->inputs;
  check_failed("step inputs of a device that runs no layer", __FILE__, __LINE__);
}

// Each device that runs layers gets the batch's positions and sequence ids in its own memory,
// and the constant routing of dense FFNs; the embeddings device gets the token ids. Host-memory
// devices read the batch in place; the others' copies go from page-locked buffers, listed here
// and submitted by upload_inputs() (asynchronously, as the step's first ops).
void Transformer::prepare_step(const Batch& batch) {
  using W = Workspace;
  const int64_t T = int64_t(batch.tokens.size());
  for (auto& [device, ws] : workspaces_) ws->uploads.clear();
  auto stage = [&](Backend& on, W::Buffer which, W::HostBuffer staged,
                   std::span<const int32_t> values) -> const int32_t* {
    if (on.uses_host_memory()) return values.data();
    Workspace& ws = workspace(on);
    int32_t* dst = ws.ints(which, T);
    void* host = ws.host(staged, values.size_bytes());
    std::memcpy(host, values.data(), values.size_bytes());
    ws.uploads.push_back({.to = dst, .from = host, .bytes = values.size_bytes()});
    return dst;
  };
  if (step_devices_.empty()) {  // once: the devices that run layers or heads of one
    for (Backend* on : devices_.layers)
      if (on) step_devices_.push_back(on);  // null: a layer of another rank
    for (const std::vector<AttentionShare>& shares : devices_.heads)
      for (const AttentionShare& share : shares) step_devices_.push_back(share.device);
    std::sort(step_devices_.begin(), step_devices_.end());
    step_devices_.erase(std::unique(step_devices_.begin(), step_devices_.end()),
                        step_devices_.end());
  }
  if (devices_.embeddings)
    workspace(*devices_.embeddings).inputs.tokens =
        stage(*devices_.embeddings, W::kTokens, W::kHostTokens, batch.tokens);
  for (Backend* on : step_devices_) {
    Workspace& ws = workspace(*on);
    StepInputs& in = ws.inputs;
    in.positions = stage(*on, W::kPositions, W::kHostPositions, batch.positions);
    in.seq_ids = stage(*on, W::kSeqIds, W::kHostSeqIds, batch.seq_ids);
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

void Transformer::upload_inputs() {
  for (auto& [device, ws] : workspaces_)
    for (const Workspace::Upload& u : ws->uploads)
      device->copy_from_host_async(u.to, u.from, u.bytes);
}

void Transformer::forward(const Batch& batch, std::span<const KvLayerView> cache, float* logits,
                          std::unique_ptr<PendingTransfer>* logits_later) {
  const int64_t T = int64_t(batch.tokens.size());
  TANDEM_CHECK(batch.positions.size() == batch.tokens.size() &&
               batch.seq_ids.size() == batch.tokens.size());
  TANDEM_CHECK(cache.size() == ffn_.size());
  if (T == 0) return;
  for (int32_t token : batch.tokens)
    if (token < 0 || uint32_t(token) >= info_.n_vocab)
      fail("token id {} is outside the vocabulary (0..{})", token, info_.n_vocab - 1);
  for (int32_t row : batch.logit_rows) TANDEM_CHECK(row >= 0 && row < int64_t(T));
  finish_loading(/*show_progress=*/false);  // nothing left to do after the first call
  // Every device has finished the step when this returns, whatever happened: an op's error shows
  // with its own step, and nothing still runs when the caller reuses or frees its buffers.
  replayed_logits_ = nullptr;
  try {
    step(batch, cache, logits, logits_later);
  } catch (...) {
    replayed_logits_ = nullptr;
    ++steps_;
    synchronize_devices(/*report=*/false);
    throw;
  }
  ++steps_;
  synchronize_devices(/*report=*/true);
  if (replayed_logits_)
    std::memcpy(logits, replayed_logits_, replayed_logit_bytes_), replayed_logits_ = nullptr;
}

void Transformer::synchronize_devices(bool report) {
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

void Transformer::step(const Batch& batch, std::span<const KvLayerView> cache, float* logits,
                       std::unique_ptr<PendingTransfer>* logits_later) {
  using W = Workspace;
  const int64_t T = int64_t(batch.tokens.size()), R = int64_t(batch.logit_rows.size());
  const int64_t embd = info_.n_embd;
  prepare_step(batch);
  Backend* at = devices_.embeddings;  // the device holding the residual stream (null: another rank)

  // A decode-sized step with a logit row per token, in order, can be a graph.
  bool graph = captures_steps() && T <= kMaxGraphTokens && R == T;
  for (int64_t r = 0; graph && r < R; ++r) graph = batch.logit_rows[size_t(r)] == r;
  graph_step_ = graph;
  if (!graph) {
    upload_inputs();
    float* x = nullptr;
    if (at) {
      x = workspace(*at).get(W::kResidual, T * embd);
      at->get_rows(token_embd_, step_inputs(*at).tokens, T, x);  // [T, n_embd]
    }
    return run_layers(batch, cache, at, x, logits, /*capturing=*/false, logits_later);
  }

  // The graph device's step starts with its inputs' copies and the embeddings: looked up there,
  // or by the host into a page-locked buffer copied in as the step's first op. (Elsewhere: looked
  // up and moved before the step.)
  Backend& g = *graph_device_;
  float* residual = workspace(g).get(W::kResidual, T * embd);
  const size_t embedded_bytes = size_t(T * embd) * sizeof(float);
  const void* embedded = nullptr;
  if (at != &g && at->uses_host_memory()) {
    auto* host = static_cast<float*>(workspace(g).host(W::kHostEmbedded, embedded_bytes));
    at->get_rows(token_embd_, step_inputs(*at).tokens, T, host);
    embedded = host;
  } else if (at != &g) {
    Workspace& ws = workspace(*at);  // its token ids, then the lookup, before the graph's step
    for (const Workspace::Upload& u : std::exchange(ws.uploads, {}))
      at->copy_from_host_async(u.to, u.from, u.bytes);
    float* x = ws.get(W::kResidual, T * embd);
    at->get_rows(token_embd_, step_inputs(*at).tokens, T, x);
    transfer(*at, x, g, residual, embedded_bytes);
  }
  const auto run_step = [&](float* step_logits, bool capturing) {
    upload_inputs();
    if (at == &g)
      g.get_rows(token_embd_, step_inputs(g).tokens, T, residual);
    else if (embedded)
      g.copy_from_host_async(residual, embedded, embedded_bytes);
    run_layers(batch, cache, &g, residual, step_logits, capturing);
  };
  auto entry = std::find_if(graphs_.begin(), graphs_.end(), [&](const GraphEntry& e) {
    return e.n_tokens == T && e.kernels == batch.kernels;
  });
  if (entry == graphs_.end()) {
    graphs_.push_back({.n_tokens = T, .kernels = batch.kernels});
    entry = graphs_.end() - 1;
  }
  const size_t logit_bytes = size_t(R * info_.n_vocab) * sizeof(float);
  if (!entry->sized || entry->capture_failed) {  // the first step of a shape sizes every buffer
    workspace(g).host(W::kHostLogits, logit_bytes);
    run_step(logits, /*capturing=*/false);
    entry->sized = true;
    return;
  }
  if (!entry->graph || entry->generation != buffer_generation_ ||
      entry->cache != cache.front().data) {
    const uint64_t generation = buffer_generation_;
    entry->graph.reset();
    g.begin_capture();
    try {
      run_step(nullptr, /*capturing=*/true);
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
      return run_step(logits, /*capturing=*/false);
    }
    TANDEM_CHECK(buffer_generation_ == generation);  // nothing was allocated inside the capture
    entry->generation = generation;
    entry->cache = cache.front().data;
  }
  g.replay(*entry->graph);
  replayed_logits_ = static_cast<float*>(workspace(g).host(W::kHostLogits, logit_bytes));
  replayed_logit_bytes_ = logit_bytes;
}

void Transformer::run_layers(const Batch& batch, std::span<const KvLayerView> cache, Backend* at,
                             float* x, float* logits, bool capturing,
                             std::unique_ptr<PendingTransfer>* logits_later) {
  using W = Workspace;
  const int64_t T = int64_t(batch.tokens.size()), R = int64_t(batch.logit_rows.size());
  const int64_t embd = info_.n_embd;
  const RankPlan& ranks = devices_.ranks;
  const int32_t me = my_rank();
  int32_t holder = ranks.embeddings;  // the rank holding the residual stream (spread runs)
  bool normed = false;                // the last layer left the next one's normed input in h
  for (uint32_t il = 0; il < ffn_.size(); ++il) {
    const FfnLayer& l = ffn_[il];
    if (ranks.spread() && l.rank != holder) {  // a cut between ranks: the residual stream moves
      float* moved = l.device ? workspace(*l.device).get(W::kResidual, T * embd) : nullptr;
      move_between_ranks(il, fmt::format("layer {}'s input", il), holder, at, x, l.rank, l.device,
                         moved, size_t(T * embd) * sizeof(float));
      holder = l.rank;
      if (l.device) x = moved, at = l.device;
    }
    if (l.rank != me) {  // another rank's layer: this one may hold some of its experts
      if (l.moe && std::ranges::find(l.expert_peers, me) != l.expert_peers.end())
        experts_for_layer_rank(l, T, batch.kernels);
      continue;
    }
    Backend& be = *l.device;
    Workspace& ws = workspace(be);
    if (at != &be) {  // a cut between devices: the residual stream moves
      float* moved = ws.get(W::kResidual, T * embd);
      transfer(*at, x, be, moved, size_t(T * embd) * sizeof(float));
      x = moved, at = &be;
    }
    // The next layer's first norm ends this one when it runs here too.
    const bool next_here =
        il + 1 < ffn_.size() && ffn_[il + 1].rank == me && ffn_[il + 1].device == &be;
    LayerStep s{.batch = batch,
                .cache = cache[il],
                .be = be,
                .ws = ws,
                .in = ws.inputs,
                .n_tokens = T,
                .x = x,
                .h = ws.get(W::kNormed, T * embd),
                .out = ws.get(W::kOutput, T * embd),
                .normed = normed,
                .next_norm = next_here ? attention_norm(il + 1) : nullptr};
    layer(il, s);
    normed = s.next_norm != nullptr;
  }

  // ---- output head, only for the rows that need logits ----
  if (R == 0) return;
  Backend* head = devices_.output;  // null: another rank's
  float* last = nullptr;
  if (holder == me) {
    last = workspace(*at).get(W::kLast, R * embd);
    for (int64_t r = 0; r < R;) {  // runs of consecutive rows as one copy each
      const int32_t row = batch.logit_rows[size_t(r)];
      int64_t n = 1;
      while (r + n < R && batch.logit_rows[size_t(r + n)] == row + n) ++n;
      at->copy_rows(last + r * embd, embd, x + int64_t(row) * embd, embd, n, embd);
      r += n;
    }
  }
  if (ranks.spread() && ranks.output != holder) {
    float* moved = head ? workspace(*head).get(W::kLast, R * embd) : nullptr;
    move_between_ranks(uint32_t(ffn_.size()), "the output head's input", holder, at, last,
                       ranks.output, head, moved, size_t(R * embd) * sizeof(float));
    last = moved, at = head;
  }
  const size_t logit_bytes = size_t(R * info_.n_vocab) * sizeof(float);
  if (head) {
    if (at != head) {
      float* moved = workspace(*head).get(W::kLast, R * embd);
      transfer(*at, last, *head, moved, size_t(R * embd) * sizeof(float));
      last = moved;
    }
    float* out_logits = workspace(*head).get(W::kLogits, R * info_.n_vocab);
    head->rms_norm({.input = last,
                    .weight = output_norm_,
                    .output = last,
                    .n_rows = R,
                    .dim = embd,
                    .input_stride = embd,
                    .output_stride = embd,
                    .eps = rms_eps_});
    head->matmul({.weight = output_,
                  .input = last,
                  .output = out_logits,
                  .n_tokens = R,
                  .kernels = batch.kernels,
                  .activations = head_activations()});
    if (capturing) {  // read by forward() after the replay
      head->copy_to_host_async(workspace(*head).host(Workspace::kHostLogits, logit_bytes),
                               out_logits, logit_bytes);
      return;
    }
    // On a head's rank that is not rank 0 they go straight into the buffer they are sent from,
    // once its last send is done.
    float* host_logits = logits;
    if (ranks.spread() && me != 0) {
      if (logits_send_) logits_send_->wait();
      logits_sent_.resize(logit_bytes);
      host_logits = reinterpret_cast<float*>(logits_sent_.data());
    }
    head->copy_to_host(host_logits, out_logits, logit_bytes);
  }
  // Rank 0 samples: the logits go there from the head's rank. Sent without waiting and received
  // later by a rank 0 with other steps in flight: safe with MPI's in-order matching only where
  // rank 0 takes no part in a step after its own share (rank_spread.h overlapping_stages).
  if (ranks.spread() && ranks.output != 0) {
    const std::span<std::byte> bytes(reinterpret_cast<std::byte*>(logits), logit_bytes);
    const std::string what = fmt::format("the logits, step {}", steps_);
    if (me == ranks.output) logits_send_ = ranks.transport->send_later(0, logits_sent_, what);
    if (me == 0) {
      std::unique_ptr<PendingTransfer> receive =
          ranks.transport->receive_later(ranks.output, bytes, what);
      if (logits_later)
        *logits_later = std::move(receive);
      else
        receive->wait();
    }
  }
}

RmsNormOp Transformer::residual_norm(const LayerStep& s, const float* weight) const {
  const int64_t embd = info_.n_embd;
  return {.input = s.x,
          .weight = weight,
          .output = s.h,
          .n_rows = s.n_tokens,
          .dim = embd,
          .input_stride = embd,
          .output_stride = embd,
          .eps = rms_eps_};
}

void Transformer::norm_input(LayerStep& s, const float* weight) const {
  if (!s.normed) s.be.rms_norm(residual_norm(s, weight));
}

void Transformer::add_output_then_norm(LayerStep& s, const float* weight) const {
  RmsNormOp op = residual_norm(s, weight);
  op.residual = s.x;
  op.add = s.out;
  s.be.rms_norm(op);
}

}  // namespace tandem
