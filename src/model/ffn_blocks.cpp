// The FFN blocks of Transformer (transformer.h): a dense SwiGLU, or a MoE layer whose router runs
// on the layer's device and whose routed experts are spread over the devices that hold them
// (copies of experts included), with the host's experts in a host task and the shared experts on
// the layer's device; plus the cold-start reads of experts used in place.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/replica_choice.h"
#include "core/transport.h"
#include "model/transformer.h"
#include "model/transformer_internal.h"

namespace tandem {

void Transformer::bind_ffn(uint32_t il, const MoeConfig& moe) {
  FfnLayer& l = ffn_[il];
  l.device = devices_.layers[il];
  l.moe = info_.is_moe_layer(il);
  if (const RankPlan& ranks = devices_.ranks; ranks.spread()) {
    l.rank = ranks.layers[il];
    if (l.moe)
      for (int32_t r : ranks.experts[il])
        if (r != l.rank && std::ranges::find(l.expert_peers, r) == l.expert_peers.end())
          l.expert_peers.push_back(r);
    std::ranges::sort(l.expert_peers);
  }
  if (!l.device) {  // another rank's layer: of it, this rank may hold some routed experts
    if (l.moe) {
      l.config = moe;
      expert_seen_[il].assign(size_t(info_.n_expert), 0);
      bind_experts(l, il, moe);
    }
    return;
  }
  Backend& on = *l.device;
  const std::string blk = fmt::format("blk.{}.", il);
  const int64_t embd = info_.n_embd;
  if (!l.moe) {
    const int64_t ff = info_.n_ff_dense;
    l.ffn_gate = binder_.matrix(blk + "ffn_gate.weight", {embd, ff}, on);
    l.ffn_up = binder_.matrix(blk + "ffn_up.weight", {embd, ff}, on);
    l.ffn_down = binder_.matrix(blk + "ffn_down.weight", {ff, embd}, on);
    return;
  }
  const int64_t n_exp = info_.n_expert;
  l.config = moe;
  expert_seen_[il].assign(size_t(n_exp), 0);
  guessing_[il] = 1;
  l.router = binder_.matrix(blk + "ffn_gate_inp.weight", {embd, n_exp}, on);
  if (moe.biases) l.router_bias = binder_.f32(blk + "ffn_gate_inp.bias", {n_exp}, on);
  if (binder_.has(blk + "exp_probs_b.bias"))
    l.expert_bias = binder_.f32(blk + "exp_probs_b.bias", {n_exp}, on);
  bind_experts(l, il, moe);
  if (info_.n_expert_shared > 0) {
    const int64_t shared_ff = int64_t(info_.n_ff_expert) * info_.n_expert_shared;
    l.gate_shexp = binder_.matrix(blk + "ffn_gate_shexp.weight", {embd, shared_ff}, on);
    l.up_shexp = binder_.matrix(blk + "ffn_up_shexp.weight", {embd, shared_ff}, on);
    l.down_shexp = binder_.matrix(blk + "ffn_down_shexp.weight", {shared_ff, embd}, on);
  }
}

void Transformer::bind_experts(FfnLayer& l, uint32_t il, const MoeConfig& moe) {
  const std::string blk = fmt::format("blk.{}.", il);
  const int64_t embd = info_.n_embd, ff = info_.n_ff_expert, n_exp = info_.n_expert;
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
  for (Backend* d : where)        // null: an expert another rank holds
    if (d && std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
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
    if (moe.biases) {
      shard.gate_bias = binder_.f32_rows(blk + "ffn_gate_exps.bias", {ff, n_exp}, held, *d);
      shard.up_bias = binder_.f32_rows(blk + "ffn_up_exps.bias", {ff, n_exp}, held, *d);
      shard.down_bias = binder_.f32_rows(blk + "ffn_down_exps.bias", {embd, n_exp}, held, *d);
    }
    if (d->uses_host_memory()) {
      shard.device_local_index = shard.local_index.data();
    } else {
      shard.local_index_buffer = d->allocate(size_t(n_exp) * sizeof(int32_t), blk + "expert index");
      d->copy_from_host(shard.local_index_buffer->data(), shard.local_index.data(),
                        size_t(n_exp) * sizeof(int32_t));
      shard.device_local_index = static_cast<const int32_t*>(shard.local_index_buffer->data());
    }
    l.shards.push_back(std::move(shard));
  }
  if (std::ranges::any_of(copies, [](const auto& of) { return !of.empty(); }))
    bind_expert_copies(l, il, copies);
  if (l.device && devices_.stream_experts_min_tokens > 0) bind_stream_groups(l, il);
  l.expert_stacks = {&binder_.info(blk + "ffn_gate_exps.weight", {embd, ff, n_exp}),
                     &binder_.info(blk + "ffn_up_exps.weight", {embd, ff, n_exp}),
                     &binder_.info(blk + "ffn_down_exps.weight", {ff, embd, n_exp})};
}

// The holders table of a layer whose experts have copies, on every device that holds some.
void Transformer::bind_expert_copies(FfnLayer& l, uint32_t il,
                                     const std::vector<std::vector<Backend*>>& copies) {
  const int64_t n_exp = info_.n_expert;
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
        fail(
            "layer {} expert {}: a copy on {} beside its home on {}; copies of experts go only to "
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

namespace {

// Where the parts of `count` experts of a shard sit in a stream buffer: the three stacks' runs of
// matrices, then the biases' rows, each on a 256-byte boundary.
struct StreamLayout {
  size_t gate = 0, up = 0, down = 0, gate_bias = 0, up_bias = 0, down_bias = 0, bytes = 0;
};
StreamLayout stream_layout(const WeightView& gate, const WeightView& up, const WeightView& down,
                           bool biases, int64_t count, int64_t ff, int64_t embd) {
  StreamLayout at;
  size_t end = 0;
  auto place = [&](size_t bytes) {
    const size_t offset = end;
    end += (bytes + 255) / 256 * 256;
    return offset;
  };
  at.gate = place(gate.matrix_bytes() * size_t(count));
  at.up = place(up.matrix_bytes() * size_t(count));
  at.down = place(down.matrix_bytes() * size_t(count));
  if (biases) {
    at.gate_bias = place(size_t(count * ff) * sizeof(float));
    at.up_bias = place(size_t(count * ff) * sizeof(float));
    at.down_bias = place(size_t(count * embd) * sizeof(float));
  }
  at.bytes = end;
  return at;
}

}  // namespace

void Transformer::bind_stream_groups(FfnLayer& l, uint32_t il) {
  Backend& to = *l.device;
  if (to.uses_host_memory()) return;
  const int64_t ff = info_.n_ff_expert, embd = info_.n_embd, n_exp = info_.n_expert;
  for (ExpertShard& shard : l.shards) {
    if (!shard.device->uses_host_memory()) continue;
    if (!to.can_multiply(shard.gate.type) || !to.can_multiply(shard.up.type) ||
        !to.can_multiply(shard.down.type))
      continue;  // an interleaved (CPU-only) layout: computed on the host whatever the chunk
    const int64_t held = shard.gate.n_mats;
    auto layout = [&](int64_t count) {
      return stream_layout(shard.gate, shard.up, shard.down, shard.gate_bias != nullptr, count, ff,
                           embd);
    };
    const size_t one = layout(1).bytes;
    const int64_t per_group =
        std::clamp<int64_t>(int64_t(devices_.stream_group_bytes / one), 1, held);
    const int64_t n_groups = (held + per_group - 1) / per_group;
    std::vector<int32_t> index(size_t(n_groups * n_exp), -1);  // each group's local index
    for (int64_t e = 0; e < n_exp; ++e)
      if (const int32_t m = shard.local_index[size_t(e)]; m >= 0)
        index[size_t(m / per_group * n_exp + e)] = int32_t(m % per_group);
    shard.stream_index = to.allocate(index.size() * sizeof(int32_t),
                                     fmt::format("blk.{}.streamed experts' index", il));
    to.copy_from_host(shard.stream_index->data(), index.data(), index.size() * sizeof(int32_t));
    const auto* on_device = static_cast<const int32_t*>(shard.stream_index->data());
    for (int64_t g = 0; g < n_groups; ++g)
      shard.stream_groups.push_back({.first = int32_t(g * per_group),
                                     .count = int32_t(std::min(per_group, held - g * per_group)),
                                     .index = on_device + g * n_exp});
    shard.stream_buffer_bytes = layout(per_group).bytes;
  }
}

bool Transformer::streams_host_experts(const FfnLayer& l, int64_t n_tokens) const {
  // Not in a step that runs as a graph: its replays could not copy from pageable weights, and
  // the step that sized it must compute as they do.
  const int64_t from = devices_.stream_experts_min_tokens;
  return from > 0 && n_tokens >= from && !graph_step_ &&
         std::ranges::any_of(l.shards,
                             [](const ExpertShard& s) { return !s.stream_groups.empty(); });
}

// Each group: its weights copied on the device's copy lane into one of two buffers, once the
// op that read that buffer last (two groups back, maybe in the layer before) is done, then
// computed on the device's stream. So a group's copy overlaps the product of the one before it,
// and the link sets the pace.
void Transformer::stream_host_experts(const FfnLayer& l, const ExpertShard& shard,
                                      const float* input, const int32_t* ids, float* slots,
                                      int64_t T, KernelChoice kernels) {
  using W = Workspace;
  Backend& be = *l.device;
  Workspace& ws = workspace(be);
  const int64_t ff = info_.n_ff_expert, embd = info_.n_embd;
  std::shared_ptr<Event>* released = ws.stream_released;  // each buffer's last reader
  for (size_t g = 0; g < shard.stream_groups.size(); ++g) {
    const ExpertShard::StreamGroup& group = shard.stream_groups[g];
    const size_t b = g % 2;
    uint8_t* buffer = ws.bytes(b == 0 ? W::kStreamed0 : W::kStreamed1, shard.stream_buffer_bytes);
    const StreamLayout at = stream_layout(shard.gate, shard.up, shard.down,
                                          shard.gate_bias != nullptr, group.count, ff, embd);
    MoeOp op = shard_op(l, shard, input, ids, group.index, slots, T, kernels);
    auto upload = [&](WeightView& view, size_t offset, std::shared_ptr<Event> after) {
      const WeightView from = view.matrix(group.first);
      be.upload_weights(buffer + offset, from.data, view.matrix_bytes() * size_t(group.count),
                        std::move(after));
      view.data = buffer + offset;
      view.n_mats = group.count;
    };
    upload(op.gate, at.gate, released[b]);
    upload(op.up, at.up, nullptr);  // after the gate's copy on the same lane
    upload(op.down, at.down, nullptr);
    if (shard.gate_bias) {
      auto upload_rows = [&](const float*& rows, size_t offset, int64_t width) {
        be.upload_weights(buffer + offset, rows + group.first * width,
                          size_t(group.count * width) * sizeof(float), nullptr);
        rows = reinterpret_cast<const float*>(buffer + offset);
      };
      upload_rows(op.gate_bias, at.gate_bias, ff);
      upload_rows(op.up_bias, at.up_bias, ff);
      upload_rows(op.down_bias, at.down_bias, embd);
    }
    be.moe(op);
    released[b] = be.record_event();
  }
}

void Transformer::ffn(uint32_t il, LayerStep& s) {
  using W = Workspace;
  const FfnLayer& l = ffn_[il];
  const int64_t T = s.n_tokens, embd = info_.n_embd;
  Backend& be = s.be;
  if (!l.moe) {
    float* slots = s.ws.get(W::kSlots, T * std::max<int64_t>(info_.n_expert_used, 1) * embd);
    be.moe({.input = s.h,
            .gate = l.ffn_gate,
            .up = l.ffn_up,
            .down = l.ffn_down,
            .expert_ids = s.in.dense_ids,
            .n_expert = 1,
            .n_tokens = T,
            .top_k = 1,
            .dim = embd,
            .ffn_dims = info_.n_ff_dense,
            .slots = slots,
            .kernels = s.batch.kernels,
            .activations = ffn_activations_});
    be.moe_reduce({.slots = slots,
                   .weights = s.in.dense_weights,
                   .n_tokens = T,
                   .top_k = 1,
                   .dim = embd,
                   .output = s.out,
                   .residual = s.x,
                   .norm_weight = s.next_norm,
                   .norm_eps = rms_eps_,
                   .norm_output = s.h});
    return;
  }
  float* shared = info_.n_expert_shared > 0 ? s.ws.get(W::kShared, T * embd) : nullptr;
  routed_experts(l, s, shared);
}

// The layer's routing for `h`: top-k expert ids and weights per token, in the layer device's
// memory; `counts` (or null) counts the choices. The router's product is part of the op
// (MoeRouteOp::router): a GPU routes in the launch that computes the logits, and with
// `prepare_experts_input` (the layer device's MoeOp over `h` comes next) also quantizes `h`
// for the experts there.
void Transformer::route(const FfnLayer& l, const float* h, int64_t T, KernelChoice kernels,
                        int32_t* ids, float* weights, uint64_t* counts,
                        bool prepare_experts_input) {
  Backend& be = *l.device;
  float* logits = workspace(be).get(Workspace::kRouter, T * info_.n_expert);
  const MoeConfig& c = l.config;
  be.moe_route({.logits = logits,
                .bias = l.expert_bias,
                .n_tokens = T,
                .n_expert = info_.n_expert,
                .top_k = info_.n_expert_used,
                .gating = c.gating,
                .n_groups = c.n_groups,
                .n_groups_used = c.n_groups_used,
                .normalize = c.normalize,
                .scale = c.scale,
                .expert_ids = ids,
                .expert_weights = weights,
                .counts = counts,
                .router = l.router,
                .input = h,
                .router_bias = l.router_bias,
                .kernels = kernels,
                .prepare_experts_input = prepare_experts_input});
}

bool Transformer::start_reading_expert(const FfnLayer& l, int32_t e, bool urgent) const {
  bool reading = false;
  for (const ExpertShard& shard : l.shards)
    if (const int32_t i = shard.local_index[size_t(e)]; i >= 0 && shard.device->uses_host_memory())
      for (const WeightView* stack : {&shard.gate, &shard.up, &shard.down})
        reading |=
            binder_.file().start_reading(stack->matrix(i).data, stack->matrix_bytes(), urgent);
  return reading;
}

void Transformer::read_ahead_on_host(const FfnLayer& l, const float* h, const int32_t* ids,
                                     int64_t T, KernelChoice kernels) {
  using W = Workspace;
  const size_t il = size_t(&l - ffn_.data());
  const int64_t k = info_.n_expert_used;
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
  if (il + 1 < ffn_.size() && guessing_[il + 1] && ffn_[il + 1].device == l.device) {
    const FfnLayer& next = ffn_[il + 1];
    Workspace& ws = workspace(*l.device);
    int32_t* guess = ws.ints(W::kGuessIds, T * k);
    route(next, h, T, kernels, guess, ws.get(W::kGuessWeights, T * k), /*counts=*/nullptr,
          /*prepare_experts_input=*/false);
    bool reading = false;
    for (int64_t s = 0; s < T * k; ++s)
      if (!expert_seen_[il + 1][size_t(guess[s])])
        reading |= start_reading_expert(next, guess[s], /*urgent=*/false);
    guessing_[il + 1] = reading;
  }
}

void Transformer::read_first_uses(const FfnLayer& l, const ExpertShard& shard, const int32_t* ids,
                                  int64_t n) {
  std::vector<uint8_t>& seen = expert_seen_[size_t(&l - ffn_.data())];
  for (int64_t s = 0; s < n; ++s)
    if (const int32_t e = ids[s]; shard.local_index[size_t(e)] >= 0 && !seen[size_t(e)]) {
      seen[size_t(e)] = 1;
      start_reading_expert(l, e, /*urgent=*/true);
    }
}

MoeOp Transformer::shard_op(const FfnLayer& l, const ExpertShard& shard, const float* input,
                            const int32_t* ids, const int32_t* local_index, float* slots, int64_t T,
                            KernelChoice kernels) const {
  return MoeOp{.input = input,
               .gate = shard.gate,
               .up = shard.up,
               .down = shard.down,
               .expert_ids = ids,
               .local_index = local_index,
               .n_expert = info_.n_expert,
               .n_tokens = T,
               .top_k = info_.n_expert_used,
               .dim = info_.n_embd,
               .ffn_dims = info_.n_ff_expert,
               .slots = slots,
               .kernels = kernels,
               .activations = ffn_activations_,
               .activation = l.config.activation,
               .gate_bias = shard.gate_bias,
               .up_bias = shard.up_bias,
               .down_bias = shard.down_bias};
}

// Routing runs on the layer's device and stays there. Each device holding chosen experts
// computes their slots at the same time as the layer's device computes the shared experts and
// its own: devices with memory of their own get the input and routing copied over; the host's
// experts run in a host task on the layer device's stream (copies in and out in stream order,
// so a captured step includes them), except in a prompt chunk large enough to stream them to the
// layer's device instead (stream_host_experts). Every device writes only its own experts' slots
// into zeroed buffers, and the layer's device adds them up (x + 0 is exact) and sums the slots in
// routing order: the result does not depend on how the experts are spread.
void Transformer::routed_experts(const FfnLayer& l, LayerStep& s, float* shared_out) {
  using W = Workspace;
  const float* h = s.h;
  const int64_t T = s.n_tokens;
  const KernelChoice kernels = s.batch.kernels;
  Backend& be = *l.device;
  Workspace& ws = workspace(be);
  const StepInputs& in = ws.inputs;
  const int64_t embd = info_.n_embd, k = info_.n_expert_used, slot_floats = T * k * embd;
  int32_t* ids = ws.ints(W::kExpertIds, T * k);
  float* weights = ws.get(W::kExpertWeights, T * k);
  const bool own_shard = std::any_of(l.shards.begin(), l.shards.end(),
                                     [&](const ExpertShard& shard) { return shard.device == &be; });
  // The experts here take `h` at 8 bits: the routing may quantize it for them.
  route(l, h, T, kernels, ids, weights, l.route_counts,
        /*prepare_experts_input=*/own_shard && ffn_activations_ == ActivationBits::Eight);
  if (be.uses_host_memory()) read_ahead_on_host(l, h, ids, T, kernels);

  // A prompt chunk large enough streams the host's experts here: computed into `slots` like
  // this device's own.
  const bool streaming = streams_host_experts(l, T);
  auto streamed = [&](const ExpertShard& shard) {
    return streaming && !shard.stream_groups.empty();
  };
  const bool slots_here = own_shard || streaming;
  float* slots = ws.get(W::kSlots, slot_floats);
  if (slots_here && (l.shards.size() > 1 || !l.expert_peers.empty())) be.zero(slots, slot_floats);
  // With copies of experts, each device first works out which of its experts it computes this
  // step (all of them reach the same answer from the same routing). A step with as many slots as
  // the layer has experts (a prompt chunk) chooses nearly all of them: each is read at home.
  const bool use_copies = T * k < info_.n_expert;
  int32_t busy_shard = -1;  // the layer's device, which also runs the shared experts
  for (size_t i = 0; i < l.shards.size(); ++i)
    if (l.shards[i].device == &be) busy_shard = int32_t(i);
  auto op_for = [&](const ExpertShard& shard, const float* input, const int32_t* shard_ids,
                    float* shard_slots) {
    const int32_t* local_index = shard.device_local_index;
    if (shard.home_index_buffer && !use_copies) {
      local_index = static_cast<const int32_t*>(shard.home_index_buffer->data());
    } else if (shard.step_index_buffer) {
      auto* step_index = static_cast<int32_t*>(shard.step_index_buffer->data());
      const auto* holders = static_cast<const int32_t*>(shard.holders_buffer->data());
      shard.device->pick_replicas({.expert_ids = shard_ids,
                                   .n_slots = T * k,
                                   .holders = holders,
                                   .max_holders = l.max_holders,
                                   .n_expert = info_.n_expert,
                                   .shard = int32_t(&shard - l.shards.data()),
                                   .busy_shard = busy_shard,
                                   .busy_load = int32_t(info_.n_expert_shared),
                                   .local_index = shard.device_local_index,
                                   .step_local_index = step_index});
      local_index = step_index;
    }
    return shard_op(l, shard, input, shard_ids, local_index, shard_slots, T, kernels);
  };
  // Other ranks holding some of the layer's experts start on them now.
  if (!l.expert_peers.empty()) send_to_expert_peers(l, h, ids, T);

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
    if (shard.device == &be || !shard.device->uses_host_memory() || streamed(shard)) continue;
    TANDEM_CHECK(!host_done);  // one host backend: its buffers below serve one shard a layer
    auto* host_input =
        static_cast<float*>(ws.host(W::kHostInput, size_t(T * embd) * sizeof(float)));
    auto* host_ids = static_cast<int32_t*>(ws.host(W::kHostIds, size_t(T * k) * sizeof(int32_t)));
    host_slots = static_cast<float*>(ws.host(W::kHostSlots, size_t(slot_floats) * sizeof(float)));
    be.copy_to_host_async(host_input, h, size_t(T * embd) * sizeof(float));
    be.copy_to_host_async(host_ids, ids, size_t(T * k) * sizeof(int32_t));
    const MoeOp op = op_for(shard, host_input, host_ids, host_slots);
    host_done = be.host_task([this, &l, &shard, op] {
      for (int64_t s = 0; s < op.n_tokens * op.top_k; ++s)
        if (shard.local_index[size_t(op.expert_ids[s])] < 0)  // another device's: adds as zero
          std::fill_n(op.slots + s * op.dim, op.dim, 0.0f);
      read_first_uses(l, shard, op.expert_ids, op.n_tokens * op.top_k);
      shard.device->moe(op);
    });
  }
  // Meanwhile on the layer's device: the shared experts, then its own routed experts, as one op
  // (SharedExpertsOp: a GPU runs them in the same launches).
  MoeOp own{
      .input = h, .n_tokens = T, .dim = embd, .kernels = kernels, .activations = ffn_activations_};
  if (shared_out)
    own.shared = {.gate = l.gate_shexp,
                  .up = l.up_shexp,
                  .down = l.down_shexp,
                  .ffn_dims = int64_t(info_.n_ff_expert) * info_.n_expert_shared,
                  .zero_ids = in.dense_ids,
                  .one_weights = in.dense_weights,
                  .slot = ws.get(W::kSharedSlot, T * embd),
                  .output = shared_out};
  for (const ExpertShard& shard : l.shards)
    if (shard.device == &be) {
      const SharedExpertsOp shared = own.shared;
      own = op_for(shard, h, ids, slots);
      own.shared = shared;
      own.input_prepared = ffn_activations_ == ActivationBits::Eight;  // by route() above
    }
  if (own.gate.data) {
    be.moe(own);
  } else if (shared_out) {  // no routed experts here: the shared ones alone
    be.moe(shared_experts_moe(own));
    be.moe_reduce(shared_experts_reduce(own));
  }
  for (const ExpertShard& shard : l.shards)
    if (streamed(shard)) stream_host_experts(l, shard, h, ids, slots, T, kernels);

  // The other devices' slots, sent all at once, each into its own place here (the first straight
  // into `slots` when this device holds none of the layer's experts), then added in by one op.
  int64_t n_others = int64_t(l.expert_peers.size());  // other ranks' slots come as parts too
  for (const ExpertShard& shard : l.shards) n_others += shard.device != &be && !streamed(shard);
  const int64_t n_places = slots_here ? n_others : n_others - 1;
  float* others = n_places > 0 ? ws.get(W::kOtherSlots, n_places * slot_floats) : nullptr;
  std::vector<const float*> parts;
  bool have_slots = slots_here;
  for (const ExpertShard& shard : l.shards) {
    Backend& device = *shard.device;
    if (&device == &be || streamed(shard)) continue;
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
  for (int32_t peer : l.expert_peers) {
    float* place = have_slots ? others + int64_t(parts.size()) * slot_floats : slots;
    if (!receive_peer_slots(l, peer, place, T)) {  // routed no token: its part is all zeros
      if (!have_slots) be.zero(slots, slot_floats);
      have_slots = true;
      continue;
    }
    if (have_slots) parts.push_back(place);
    have_slots = true;
  }
  be.add_parts(slots, parts, slot_floats);
  be.moe_reduce({.slots = slots,
                 .weights = weights,
                 .n_tokens = T,
                 .top_k = k,
                 .dim = embd,
                 .output = s.out,
                 .residual = s.x,
                 .shared = shared_out,
                 .norm_weight = s.next_norm,  // the next layer's first norm, into h
                 .norm_eps = rms_eps_,
                 .norm_output = s.h});
}

}  // namespace tandem

namespace tandem {

// The exchange with the ranks that hold some of a layer's experts. The layer's rank sends every
// token's routing, and the input of just the tokens routed to at least one of the peer's experts
// (which the peer finds from the routing, so no count goes first); the peer computes the slots of
// its own experts for those tokens and sends back just those, in slot order, which the layer's
// rank puts in place among zeros. Each expert sees the same tokens as on one machine, and the sum
// of the parts is the same (x + 0 is exact), however the experts are spread. A peer routed no
// token sends and receives nothing more.

const std::vector<int32_t>& Transformer::tokens_routed_to(size_t il, int32_t rank,
                                                          const int32_t* ids, int64_t n_tokens) {
  const int64_t k = info_.n_expert_used;
  const std::vector<int32_t>& expert_rank = devices_.ranks.experts[il];
  routed_tokens_.clear();
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t j = 0; j < k; ++j)
      if (expert_rank[size_t(ids[t * k + j])] == rank) {
        routed_tokens_.push_back(int32_t(t));
        break;
      }
  return routed_tokens_;
}

RankChannel* Transformer::expert_channel(const FfnLayer& l, int32_t other, Backend& device) {
  const uint32_t il = uint32_t(&l - ffn_.data());
  const uint32_t cut = uint32_t(ffn_.size()) + 1 +
                       il * uint32_t(devices_.ranks.transport->n_ranks()) + uint32_t(other);
  if (auto known = rank_channels_.find(cut); known != rank_channels_.end()) return known->second;
  return rank_channel(cut, fmt::format("layer {}'s experts' exchange", il), other,
                      /*sends=*/l.rank == my_rank(), device);
}

void Transformer::gather_rows(Backend& device, float* dst, const float* src,
                              std::span<const int32_t> rows, bool scatter) const {
  const int64_t embd = info_.n_embd;
  for (size_t i = 0; i < rows.size();) {
    size_t n = 1;
    while (i + n < rows.size() && rows[i + n] == rows[i] + int32_t(n)) ++n;
    float* to = scatter ? dst + int64_t(rows[i]) * embd : dst + int64_t(i) * embd;
    const float* from = scatter ? src + int64_t(i) * embd : src + int64_t(rows[i]) * embd;
    device.copy_rows(to, embd, from, embd, int64_t(n), embd);
    i += n;
  }
}

void Transformer::send_to_expert_peers(const FfnLayer& l, const float* h, const int32_t* ids,
                                       int64_t T) {
  using W = Workspace;
  const int64_t embd = info_.n_embd, k = info_.n_expert_used;
  const size_t il = size_t(&l - ffn_.data());
  Backend& be = *l.device;
  peer_ids_.resize(size_t(T * k));
  be.copy_to_host(peer_ids_.data(), ids, peer_ids_.size() * sizeof(int32_t));
  bool input_on_host = false;
  Transport& transport = *devices_.ranks.transport;
  for (int32_t peer : l.expert_peers) {
    transport.send(peer, std::as_bytes(std::span(peer_ids_)),
                   fmt::format("layer {}'s routing, step {}", il, steps_));
    RankChannel* channel = expert_channel(l, peer, be);
    const std::vector<int32_t>& tokens = tokens_routed_to(il, peer, peer_ids_.data(), T);
    if (tokens.empty()) continue;
    const std::string what = fmt::format("layer {}'s experts' input, step {}", il, steps_);
    if (channel) {  // the routed rows packed on the device and sent from there
      float* packed = workspace(be).get(W::kRankPacked, int64_t(tokens.size()) * embd);
      gather_rows(be, packed, h, tokens, /*scatter=*/false);
      channel->send(packed, tokens.size() * size_t(embd) * sizeof(float), what);
      continue;
    }
    if (!input_on_host) {
      peer_input_.resize(size_t(T * embd));
      be.copy_to_host(peer_input_.data(), h, peer_input_.size() * sizeof(float));
      input_on_host = true;
    }
    routed_input_.resize(tokens.size() * size_t(embd));
    for (size_t i = 0; i < tokens.size(); ++i)
      std::copy_n(peer_input_.data() + tokens[i] * embd, embd, routed_input_.data() + i * embd);
    transport.send(peer, std::as_bytes(std::span(routed_input_)), what);
  }
}

// The slots (indices into [n_slots]) whose expert `rank` holds, in order.
static std::vector<int32_t> slots_held_by(const std::vector<int32_t>& expert_rank,
                                          const std::vector<int32_t>& ids, int32_t rank) {
  std::vector<int32_t> held;
  for (size_t s = 0; s < ids.size(); ++s)
    if (expert_rank[size_t(ids[s])] == rank) held.push_back(int32_t(s));
  return held;
}

bool Transformer::receive_peer_slots(const FfnLayer& l, int32_t peer, float* place, int64_t T) {
  using W = Workspace;
  const int64_t embd = info_.n_embd, n_slots = T * info_.n_expert_used;
  const size_t il = size_t(&l - ffn_.data());
  // peer_ids_ holds the routing sent to the peers.
  const std::vector<int32_t> held = slots_held_by(devices_.ranks.experts[il], peer_ids_, peer);
  if (held.empty()) return false;
  const int64_t n_held = int64_t(held.size());
  const std::string what = fmt::format("layer {}'s expert outputs, step {}", il, steps_);
  Backend& be = *l.device;
  if (RankChannel* channel = expert_channel(l, peer, be)) {  // opened when the input went
    float* packed = workspace(be).get(W::kRankPacked, n_held * embd);
    channel->receive(packed, size_t(n_held * embd) * sizeof(float), what);
    be.zero(place, n_slots * embd);
    gather_rows(be, place, packed, held, /*scatter=*/true);
    return true;
  }
  packed_slots_.resize(size_t(n_held * embd));
  devices_.ranks.transport->receive(peer, std::as_writable_bytes(std::span(packed_slots_)), what);
  peer_slots_.assign(size_t(n_slots * embd), 0.0f);
  for (int64_t i = 0; i < n_held; ++i)
    std::copy_n(packed_slots_.data() + i * embd, embd, peer_slots_.data() + held[size_t(i)] * embd);
  be.copy_from_host(place, peer_slots_.data(), peer_slots_.size() * sizeof(float));
  return true;
}

void Transformer::experts_for_layer_rank(const FfnLayer& l, int64_t T_all, KernelChoice kernels) {
  const int64_t k = info_.n_expert_used;
  const size_t il = size_t(&l - ffn_.data());
  Transport& transport = *devices_.ranks.transport;
  std::vector<int32_t>& all_ids = peer_routing_;
  all_ids.resize(size_t(T_all * k));
  transport.receive(l.rank, std::as_writable_bytes(std::span(all_ids)),
                    fmt::format("layer {}'s routing, step {}", il, steps_));
  for (int32_t e : all_ids)
    if (e < 0 || e >= int32_t(info_.n_expert))
      fail("layer {}: rank {} sent expert {} of {}: the ranks disagree on the model", il, l.rank, e,
           info_.n_expert);
  // The device end: the first of this rank's devices holding the layer's experts, when none of
  // them computes in host memory (whose slots would go through the host anyway).
  Backend* end = l.shards.front().device;
  for (const ExpertShard& shard : l.shards)
    if (shard.device->uses_host_memory()) end = shard.device;
  RankChannel* channel = expert_channel(l, l.rank, *end);
  const std::vector<int32_t>& tokens = tokens_routed_to(il, my_rank(), all_ids.data(), T_all);
  if (tokens.empty()) return;
  // From here on, the tokens routed here only: their rows of the routing, then their input.
  const int64_t T = int64_t(tokens.size());
  peer_ids_.resize(size_t(T * k));
  for (int64_t i = 0; i < T; ++i)
    std::copy_n(all_ids.data() + tokens[size_t(i)] * k, k, peer_ids_.data() + i * k);
  if (channel)
    experts_on_devices(l, *end, *channel, T, T_all, kernels);
  else
    experts_through_host(l, T, T_all, kernels);
}

// A peer's experts with the input and outputs in host memory, sent and received over MPI.
void Transformer::experts_through_host(const FfnLayer& l, int64_t T, int64_t T_all,
                                       KernelChoice kernels) {
  using W = Workspace;
  const int64_t embd = info_.n_embd, n_slots = T * info_.n_expert_used;
  const size_t il = size_t(&l - ffn_.data());
  Transport& transport = *devices_.ranks.transport;
  peer_input_.resize(size_t(T * embd));
  transport.receive(l.rank, std::as_writable_bytes(std::span(peer_input_)),
                    fmt::format("layer {}'s experts' input, step {}", il, steps_));
  // Each of this rank's devices computes its experts' slots (the others stay zero); one expert
  // is on one device, so adding the devices' slots up is exact.
  peer_slots_.assign(size_t(n_slots * embd), 0.0f);
  for (const ExpertShard& shard : l.shards) {
    Backend& device = *shard.device;
    if (device.uses_host_memory()) {
      read_first_uses(l, shard, peer_ids_.data(), n_slots);
      device_slots_.assign(peer_slots_.size(), 0.0f);
      MoeOp op = shard_op(l, shard, peer_input_.data(), peer_ids_.data(), shard.device_local_index,
                          device_slots_.data(), T, kernels);
      op.step_tokens = T_all;
      device.moe(op);
      device.synchronize();
    } else {
      Workspace& ws = workspace(device);
      float* input = ws.get(W::kNormed, T * embd);
      int32_t* ids = ws.ints(W::kExpertIds, n_slots);
      float* slots = ws.get(W::kSlots, n_slots * embd);
      device.copy_from_host(input, peer_input_.data(), peer_input_.size() * sizeof(float));
      device.copy_from_host(ids, peer_ids_.data(), peer_ids_.size() * sizeof(int32_t));
      device.zero(slots, n_slots * embd);
      MoeOp op = shard_op(l, shard, input, ids, shard.device_local_index, slots, T, kernels);
      op.step_tokens = T_all;
      device.moe(op);
      device_slots_.resize(peer_slots_.size());
      device.copy_to_host(device_slots_.data(), slots, device_slots_.size() * sizeof(float));
    }
    for (size_t i = 0; i < peer_slots_.size(); ++i) peer_slots_[i] += device_slots_[i];
  }
  const std::vector<int32_t> held = slots_held_by(devices_.ranks.experts[il], peer_ids_, my_rank());
  packed_slots_.resize(held.size() * size_t(embd));
  for (size_t i = 0; i < held.size(); ++i)
    std::copy_n(peer_slots_.data() + held[i] * embd, embd, packed_slots_.data() + i * embd);
  transport.send(l.rank, std::as_bytes(std::span(packed_slots_)),
                 fmt::format("layer {}'s expert outputs, step {}", il, steps_));
}

// A peer's experts with the input received straight into device `end` and the outputs sent from
// there (the channel): the other devices of this rank that hold some of the layer's experts get
// the input from `end` and give back their slots, which `end` adds to its own (x + 0 is exact).
void Transformer::experts_on_devices(const FfnLayer& l, Backend& end, RankChannel& channel,
                                     int64_t T, int64_t T_all, KernelChoice kernels) {
  using W = Workspace;
  const int64_t embd = info_.n_embd, n_slots = T * info_.n_expert_used;
  const size_t il = size_t(&l - ffn_.data());
  Workspace& ws = workspace(end);
  float* input = ws.get(W::kNormed, T * embd);
  channel.receive(input, size_t(T * embd) * sizeof(float),
                  fmt::format("layer {}'s experts' input, step {}", il, steps_));
  int32_t* ids = ws.ints(W::kExpertIds, n_slots);
  end.copy_from_host(ids, peer_ids_.data(), peer_ids_.size() * sizeof(int32_t));
  float* slots = ws.get(W::kSlots, n_slots * embd);
  end.zero(slots, n_slots * embd);
  float* others = l.shards.size() > 1
                      ? ws.get(W::kOtherSlots, int64_t(l.shards.size() - 1) * n_slots * embd)
                      : nullptr;
  auto run = [&](const ExpertShard& shard, const float* shard_input, const int32_t* shard_ids,
                 float* shard_slots) {
    MoeOp op = shard_op(l, shard, shard_input, shard_ids, shard.device_local_index, shard_slots, T,
                        kernels);
    op.step_tokens = T_all;
    shard.device->moe(op);
  };
  for (const ExpertShard& shard : l.shards) {  // the others first, on their own streams
    Backend& device = *shard.device;
    if (&device == &end) continue;
    Workspace& remote = workspace(device);
    float* remote_input = remote.get(W::kNormed, T * embd);
    int32_t* remote_ids = remote.ints(W::kExpertIds, n_slots);
    float* remote_slots = remote.get(W::kSlots, n_slots * embd);
    transfer(end, input, device, remote_input, size_t(T * embd) * sizeof(float));
    transfer(end, ids, device, remote_ids, size_t(n_slots) * sizeof(int32_t));
    device.zero(remote_slots, n_slots * embd);
    run(shard, remote_input, remote_ids, remote_slots);
  }
  for (const ExpertShard& shard : l.shards)
    if (shard.device == &end) run(shard, input, ids, slots);
  std::vector<const float*> parts;
  for (const ExpertShard& shard : l.shards) {
    Backend& device = *shard.device;
    if (&device == &end) continue;
    float* place = others + int64_t(parts.size()) * n_slots * embd;
    transfer(device, workspace(device).get(W::kSlots, n_slots * embd), end, place,
             size_t(n_slots * embd) * sizeof(float), CopiedBy::Sender);
    parts.push_back(place);
  }
  end.add_parts(slots, parts, n_slots * embd);
  const std::vector<int32_t> held = slots_held_by(devices_.ranks.experts[il], peer_ids_, my_rank());
  float* packed = ws.get(W::kRankPacked, int64_t(held.size()) * embd);
  gather_rows(end, packed, slots, held, /*scatter=*/false);
  channel.send(packed, held.size() * size_t(embd) * sizeof(float),
               fmt::format("layer {}'s expert outputs, step {}", il, steps_));
}

}  // namespace tandem
