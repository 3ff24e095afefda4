#include "plan/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "core/replica_choice.h"

namespace tandem::plan {

const DeviceKindCost& CostParams::of(DeviceKind kind) const {
  switch (kind) {
    case DeviceKind::Cpu:
      return cpu;
    case DeviceKind::Cuda:
      return cuda;
    case DeviceKind::Sim:
      return sim;
  }
  return cpu;
}

double link_seconds(const LinkCost& link, double messages, double bytes) {
  return messages * link.latency_s + bytes / std::max(link.bandwidth_bytes_per_s, 1e6);
}

const LinkCost& CostParams::gpu_link(LinkKind kind) const {
  switch (kind) {
    case LinkKind::Nvlink:
      return nvlink;
    case LinkKind::Pcie5:
      return pcie5;
    case LinkKind::Pcie4:
      return pcie4;
  }
  return pcie4;
}

const LinkCost& CostParams::host_link(LinkKind kind) const {
  return kind == LinkKind::Pcie5 ? host_pcie5 : host_pcie4;
}

double expected_distinct_experts(uint32_t n_expert, uint32_t n_used, int64_t batch) {
  if (n_expert == 0 || batch <= 0) return 0;
  const double p = std::min(1.0, double(n_used) / double(n_expert));
  return double(n_expert) * (1.0 - std::pow(1.0 - p, double(batch)));
}

double expected_distinct_experts(const std::vector<double>& choice_probability, int64_t batch) {
  double sum = 0;
  for (double p : choice_probability)
    sum += 1.0 - std::pow(1.0 - std::clamp(p, 0.0, 1.0), double(std::max<int64_t>(batch, 0)));
  return sum;
}

std::vector<double> expert_choice_probabilities(const ModelInventory& inventory,
                                                const RoutingProfile* profile, uint32_t layer) {
  const ModelInfo& hp = inventory.info;
  const double uniform = hp.n_expert ? double(hp.n_expert_used) / double(hp.n_expert) : 0.0;
  std::vector<double> p(hp.n_expert, uniform);
  if (!profile || layer >= profile->counts.size()) return p;
  const std::vector<uint64_t>& counts = profile->counts[layer];
  if (counts.size() != hp.n_expert) return p;
  double total = 0;
  for (uint64_t c : counts) total += double(c);
  if (total <= 0) return p;
  // Each token makes n_expert_used choices, so tokens seen = total / k and p_e = k * c_e / total.
  for (size_t e = 0; e < counts.size(); ++e)
    p[e] = std::min(1.0, double(hp.n_expert_used) * double(counts[e]) / total);
  return p;
}

double group_flops_per_token(const ModelInfo& info, const InventoryGroup& group) {
  const double d = info.n_embd;
  switch (group.kind) {
    case WeightGroup::Attention:
      return info.attention_flops_per_token;
    case WeightGroup::Router:
      return 2 * d * info.n_expert;
    case WeightGroup::SharedExperts:
      return 2 * 3 * d * info.n_ff_expert * info.n_expert_shared;
    case WeightGroup::DenseFfn:
      return 2 * 3 * d * info.n_ff_dense;
    case WeightGroup::RoutedExperts:
      return 2 * 3 * d * info.n_ff_expert;
    case WeightGroup::OutputHead:
      return 2 * d * info.n_vocab;
    default:
      return 0;  // embeddings are a row copy; norms are negligible
  }
}

uint64_t head_share_bytes(const ModelInfo& info, uint64_t attention_bytes, int32_t n_heads) {
  if (info.n_head == 0) return 0;
  return uint64_t(info.head_split.head_fraction * double(attention_bytes) * double(n_heads) /
                  double(info.n_head));
}

namespace {

// FNV-1a over bytes: the cache keys of the copies' sampling (StepModel).
struct Fnv1a {
  uint64_t value = 1469598103934665603ull;
  void mix(const void* data, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i)
      value = (value ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  }
};

double total(const Prediction& t) {
  return t.decode_seconds_gpu + t.decode_seconds_cpu + t.decode_seconds_transfer +
         t.decode_seconds_disk;
}

// One step of `batch` tokens: what it reads and computes, and how long that takes where.
struct StepShape {
  int64_t batch = 1;          // tokens in the step
  double context = 0;         // tokens each of them attends to
  double kv_tokens_read = 0;  // KV rows read from the cache in the whole step
  double kv_sequences =
      1;  // the sequences they belong to (a window layer reads its window of each)
  int64_t logit_rows = 1;     // rows the output head computes
  DType cache_type = DType::F32;  // the KV cache's values
  // Routed experts in the host's memory whose layer runs on a GPU are streamed to it and
  // computed there (DevicePlan::stream_experts_min_tokens), not computed by the host.
  bool stream_host_experts = false;
};

// P(X = c) for X ~ Binomial(n, q), c = 0..n, with negligible tails dropped: (c, probability).
std::vector<std::pair<int, double>> binomial(int n, double q) {
  std::vector<std::pair<int, double>> pmf;
  if (n <= 0 || q <= 0) return {{0, 1.0}};
  if (q >= 1) return {{n, 1.0}};
  const double lq = std::log(q), lr = std::log1p(-q), lgn = std::lgamma(n + 1.0);
  double kept = 0;
  for (int c = 0; c <= n; ++c) {
    const double p =
        std::exp(lgn - std::lgamma(c + 1.0) - std::lgamma(n - c + 1.0) + c * lq + (n - c) * lr);
    if (p < 1e-12) continue;
    pmf.emplace_back(c, p);
    kept += p;
  }
  for (auto& [c, p] : pmf) p /= kept;
  return pmf;
}

// E[max_i X_i] for independent discrete X_i given as (value, probability) lists.
double expected_max(const std::vector<std::vector<std::pair<double, double>>>& dists) {
  struct Point {
    double value, p;
    size_t which;
  };
  std::vector<Point> points;
  for (size_t i = 0; i < dists.size(); ++i)
    for (const auto& [v, p] : dists[i]) points.push_back({v, p, i});
  if (points.empty()) return 0;
  std::sort(points.begin(), points.end(), [](const Point& a, const Point& b) {
    return a.value != b.value ? a.value < b.value : a.which < b.which;
  });
  // Sweep up the values: P(max <= v) is the product of each one's CDF at v.
  std::vector<double> cdf(dists.size(), 0.0);
  double expected = 0, before = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    cdf[points[i].which] += points[i].p;
    if (i + 1 < points.size() && points[i + 1].value == points[i].value) continue;
    double after = 1;
    for (double c : cdf) after *= std::min(c, 1.0);
    expected += points[i].value * (after - before);
    before = after;
  }
  return expected;
}

class StepModel {
 public:
  StepModel(const ModelInventory& inv, const Hardware& hw, const Placement& placement,
            const RoutingProfile* profile, const CostParams& params)
      : inv_(inv), hw_(hw), placement_(placement), params_(params) {
    TANDEM_CHECK(placement.group_device.size() == inv.groups.size());
    TANDEM_CHECK(placement.layer_device.size() == inv.n_layers);
    layers_.resize(inv.n_layers);
    used_.assign(placement.devices.size(), false);
    for (size_t i = 0; i < inv.groups.size(); ++i) {
      const InventoryGroup& g = inv.groups[i];
      if (g.layer >= 0 && uint32_t(g.layer) < inv.n_layers)
        layers_[size_t(g.layer)].push_back(i);
      else if (g.kind == WeightGroup::OutputHead)
        output_ = int64_t(i);
      else if (g.kind == WeightGroup::Embedding)
        embedding_ = int64_t(i);
      used_[size_t(compute_device(placement.group_device[i]))] = true;
    }
    for (int32_t d : placement.layer_device) used_[size_t(compute_device(d))] = true;
    for (uint32_t l = 0; l < inv.n_layers; ++l)
      choice_.push_back(expert_choice_probabilities(inv, profile, l));
    // Layers with copies of experts: who holds each expert (devices as shard numbers).
    holders_.resize(inv.n_layers);
    for (size_t i = 0; i < placement.group_copies.size() && i < inv.groups.size(); ++i) {
      const InventoryGroup& g = inv.groups[i];
      const std::vector<int32_t>& copies = placement.group_copies[i];
      if (copies.empty() || g.kind != WeightGroup::RoutedExperts || g.layer < 0 ||
          placement.devices.size() > size_t(kMaxReplicaShards))
        continue;
      LayerHolders& h = holders_[size_t(g.layer)];
      h.max_holders = std::max(h.max_holders, 1 + int32_t(copies.size()));
      for (int32_t d : copies) used_[size_t(d)] = true;
    }
    for (uint32_t l = 0; l < inv.n_layers; ++l) {
      LayerHolders& h = holders_[l];
      if (h.max_holders == 0) continue;
      h.table.assign(size_t(inv.info.n_expert) * size_t(h.max_holders), -1);
      for (size_t i : layers_[l]) {
        const InventoryGroup& g = inv.groups[i];
        if (g.kind != WeightGroup::RoutedExperts || g.expert < 0 ||
            uint32_t(g.expert) >= inv.info.n_expert)
          continue;
        int32_t* row = &h.table[size_t(g.expert) * size_t(h.max_holders)];
        row[0] = compute_device(placement.group_device[i]);
        if (i < placement.group_copies.size())
          for (size_t c = 0; c < placement.group_copies[i].size(); ++c)
            row[c + 1] = placement.group_copies[i][c];
      }
    }
  }

  // Seconds for one step, split by where the critical path spends them.
  // `node_s`, when given: each machine's share of the step (Hardware::n_nodes), each layer counted
  // on its attention's machine with its experts wherever they are, the head on its own.
  Prediction step_seconds(const StepShape& s, std::vector<double>* node_s = nullptr) const {
    Prediction t;
    if (node_s) node_s->assign(size_t(std::max(hw_.n_nodes, 1)), 0.0);
    const auto count_on = [&](int32_t dev, double before) {
      if (node_s) (*node_s)[size_t(spec(dev).node)] += total(t) - before;
    };
    const ModelInfo& hp = inv_.info;
    const double activation_bytes = double(s.batch) * hp.n_embd * 4;  // F32 hidden state
    // What a MoE layer sends to a device holding some of its experts (input rows and routing)
    // and takes back (one output row per token and chosen expert: k times the input).
    const double expert_in_bytes = activation_bytes + double(s.batch) * hp.n_expert_used * 4;
    const double expert_out_bytes = activation_bytes * std::max<uint32_t>(hp.n_expert_used, 1);
    int32_t prev =
        compute_device(embedding_ >= 0 ? placement_.group_device[size_t(embedding_)] : 0);
    for (uint32_t l = 0; l < inv_.n_layers; ++l) {
      const double layer_start = total(t);
      const int32_t owner = compute_device(placement_.layer_device[l]);
      if (owner != prev) t.decode_seconds_transfer += transfer_s(prev, owner, activation_bytes);
      prev = owner;

      // Attention block on the owner: weights, KV rows, and the attention itself (absorbed
      // MLA: scores over kv_lora + rope dims, output over kv_lora dims, per head). Split by
      // heads, each share's device reads the whole latent cache and its heads' part of the
      // weights; the owner keeps q_a, kv_a and the rest.
      const std::vector<HeadShare>* heads =
          l < placement_.layer_heads.size() && placement_.layer_heads[l].size() > 1
              ? &placement_.layer_heads[l]
              : nullptr;
      Part attn, head_part;  // head_part: all heads' work, before it is divided
      // A sliding-window layer's queries see at most its window.
      const double window = double(hp.kv[l].window);
      const double keys = window > 0 ? std::min(s.context, window) : s.context;
      const double rows_read =
          window > 0 ? std::min(s.kv_tokens_read, window * s.kv_sequences) : s.kv_tokens_read;
      head_part.bytes += double(hp.kv_bytes_per_token(l, s.cache_type)) * rows_read;
      head_part.flops += hp.attention_flops_per_key * keys * double(s.batch);
      attn.ops = params_.attention_ops - (heads ? params_.head_ops : 0);
      const double head_fraction = heads ? hp.head_split.head_fraction : 0.0;
      InventoryGroup head_weights{};  // the divided attention weights, all heads' bytes
      // The FFN block, per device that holds a part of it (index into placement_.devices).
      std::vector<Part> ffn(placement_.devices.size());
      Part streamed;  // the host's experts streamed to the owner (StepShape::stream_host_experts)
      for (size_t gi : layers_[l]) {
        const InventoryGroup& g = inv_.groups[gi];
        const int32_t where = placement_.group_device[gi];
        const int32_t dev = compute_device(where);
        const double flops = group_flops_per_token(hp, g);
        if (g.kind == WeightGroup::RoutedExperts) {
          const double p = g.expert >= 0 && size_t(g.expert) < choice_[l].size()
                               ? choice_[l][size_t(g.expert)]
                               : 0;
          if (uses_copies(l, s.batch) && gi < placement_.group_copies.size())
            for (int32_t c : placement_.group_copies[gi]) {  // a device that may compute it
              ffn[size_t(c)].ops = params_.ffn_ops;
              ffn[size_t(c)].expert_bytes = kernel_bytes(g, c);
            }
          if (s.stream_host_experts && streams_to_owner(g, where, owner)) {
            streamed.bytes += double(g.bytes);
            streamed.flops += flops * p * double(s.batch);
            continue;
          }
          const double touched = 1.0 - std::pow(1.0 - p, double(s.batch));
          Part& part = ffn[size_t(dev)];
          if (where == kOnDisk) {
            part.disk_bytes += touched * double(g.bytes);
          } else if (p > 0) {
            part.experts += 1;
            part.touched += touched;
            part.touched_bytes += touched * kernel_bytes(g, dev);
          }
          part.flops += flops * p * double(s.batch);
          part.ops = params_.ffn_ops;
        } else if (g.kind == WeightGroup::Attention || g.kind == WeightGroup::Router ||
                   g.kind == WeightGroup::Norms) {
          // Read on the layer's device; a group pinned elsewhere costs a round trip.
          const double divided = g.kind == WeightGroup::Attention ? head_fraction : 0.0;
          attn.bytes += (1 - divided) * kernel_bytes(g, owner);
          attn.flops += (1 - divided) * flops * double(s.batch);
          head_weights.bytes += uint64_t(divided * double(g.bytes));
          head_weights.interleaved_bytes += uint64_t(divided * double(g.interleaved_bytes));
          head_weights.host_kernel_extra_bytes += uint64_t(divided * double(g.host_kernel_extra_bytes));
          head_part.flops += divided * flops * double(s.batch);
          if (dev != owner) attn.extra_s += 2 * transfer_s(owner, dev, activation_bytes);
        } else {
          Part& part = ffn[size_t(dev)];
          if (where == kOnDisk) part.disk_bytes += double(g.bytes);
          else part.bytes += kernel_bytes(g, dev);
          part.flops += flops * double(s.batch);
          part.ops = params_.ffn_ops;
        }
      }
      if (!heads) {
        attn.bytes += head_part.bytes, attn.flops += head_part.flops;
        add_to(t, owner, seconds(owner, attn));
      } else {
        add_to(t, owner, seconds(owner, attn));
        add(t, heads_seconds(owner, *heads, head_part, head_weights, s.batch));
      }
      if (streamed.bytes > 0) {
        // All of them, whatever the routing (the host does not wait for it), a group at a time:
        // each group's copy overlaps the product of the one before, so the slower of the link
        // and the GPU's products sets the pace, after the owner's own experts.
        const double groups = std::ceil(streamed.bytes / params_.stream_group_bytes);
        // From the weights' pageable memory: the driver stages them (pageable_copy_efficiency).
        const double copy_s = link_seconds(link_between(0, owner), groups,
                                           streamed.bytes / params_.pageable_copy_efficiency);
        const double compute_s =
            seconds(owner, {.bytes = streamed.bytes, .flops = streamed.flops, .ops = int(groups)});
        Part& part = ffn[size_t(owner)];
        part.extra_s += std::max(copy_s, compute_s);
        part.ops = params_.ffn_ops;
      }
      add(t, ffn_seconds(l, s.batch, owner, ffn, expert_in_bytes, expert_out_bytes));
      count_on(owner, layer_start);
    }
    if (output_ >= 0) {
      const double head_start = total(t);
      const InventoryGroup& g = inv_.groups[size_t(output_)];
      const int32_t where = placement_.group_device[size_t(output_)];
      const int32_t dev = compute_device(where);
      if (dev != prev)
        t.decode_seconds_transfer += transfer_s(prev, dev, double(s.logit_rows) * hp.n_embd * 4);
      Part head{.bytes = where == kOnDisk ? 0 : kernel_bytes(g, dev),
                .disk_bytes = where == kOnDisk ? double(g.bytes) : 0,
                .flops = group_flops_per_token(hp, g) * double(s.logit_rows),
                .ops = 2};
      add_to(t, dev, seconds(dev, head) - disk_s(head));
      t.decode_seconds_disk += disk_s(head);
      // The host reads the logits back from a GPU, or from another machine, at the step's end.
      if (is_gpu(dev) || spec(dev).node != 0)
        t.decode_seconds_transfer += transfer_s(dev, 0, double(s.logit_rows) * hp.n_vocab * 4);
      count_on(dev, head_start);
    }
    // Each GPU in the step launches its captured graph once.
    for (size_t d = 0; d < used_.size(); ++d)
      if (used_[d] && spec(int32_t(d)).kind == DeviceKind::Cuda) {
        const double before = total(t);
        t.decode_seconds_gpu += params_.gpu_step_launch_s;
        count_on(int32_t(d), before);
      }
    return t;
  }

  // How many steps of different sequences can run at once, each on another machine, as the
  // runtime overlaps them (rank_spread.h overlapping_stages): the machines a step passes through,
  // when the first machine's share (rank 0's: the host, its GPUs) comes first, holds all its
  // layers' experts, and it takes no part after; 1 otherwise.
  int32_t overlapping_stages() const {
    const auto node_of = [&](int32_t where) { return spec(compute_device(where)).node; };
    if (embedding_ >= 0 && node_of(placement_.group_device[size_t(embedding_)]) != 0) return 1;
    std::vector<int32_t> seen = {0};  // the machines the step passes through
    int32_t holder = 0;
    for (uint32_t l = 0; l < inv_.n_layers; ++l) {
      const int32_t owner = node_of(placement_.layer_device[l]);
      bool first_takes_part = false, others_take_part = false;
      for (size_t gi : layers_[l]) {
        const int32_t node = node_of(placement_.group_device[gi]);
        first_takes_part |= node == 0;
        others_take_part |= node != 0;
      }
      if (owner == 0) {
        if (holder != 0 || others_take_part) return 1;
        continue;
      }
      if (first_takes_part) return 1;
      holder = owner;
      if (std::ranges::find(seen, holder) == seen.end()) seen.push_back(holder);
    }
    const int32_t head = output_ >= 0 ? node_of(placement_.group_device[size_t(output_)]) : 0;
    if (head == 0) return 1;
    if (std::ranges::find(seen, head) == seen.end()) seen.push_back(head);
    return int32_t(seen.size());
  }

 private:
  struct Part {
    double bytes = 0;       // read from the device's memory whatever the routing
    double disk_bytes = 0;  // read from the file first (expected)
    double flops = 0;       // expected
    int ops = 0;
    double extra_s = 0;  // transfers the part needs on its own
    // Routed experts in memory that the step may choose: how many, how many it touches on
    // average, and the bytes those read on average. Which ones it touches is random.
    double experts = 0, touched = 0, touched_bytes = 0;
    double expert_bytes = 0;  // one expert's bytes, for a device that holds only copies
  };
  // A layer whose experts have copies: its holders table as core/replica_choice.h takes it, with
  // device indices as shard numbers; max_holders 0 when the layer has no copies.
  struct LayerHolders {
    std::vector<int32_t> table;
    int32_t max_holders = 0;
  };
  // Whether a routed-expert group at `where` is streamed to its layer's device `owner` when a step
  // streams: held by this machine's host in a layout a GPU reads, the layer on a GPU beside it.
  bool streams_to_owner(const InventoryGroup& g, int32_t where, int32_t owner) const {
    return g.kind == WeightGroup::RoutedExperts && where == 0 && is_gpu(owner) &&
           spec(owner).node == spec(0).node && !g.not_on_cuda && g.interleaved_bytes == 0;
  }

 public:
  // Whether some layer has experts a prompt chunk could stream (streams_to_owner). Not where
  // some experts are read from disk: the runtime's host shard holds them too (mapped), and every
  // chunk would read them from the file again.
  bool can_stream() const {
    for (size_t gi = 0; gi < inv_.groups.size(); ++gi)
      if (inv_.groups[gi].kind == WeightGroup::RoutedExperts &&
          placement_.group_device[gi] == kOnDisk)
        return false;
    for (uint32_t l = 0; l < inv_.n_layers; ++l)
      for (size_t gi : layers_[l])
        if (streams_to_owner(inv_.groups[gi], placement_.group_device[gi],
                             compute_device(placement_.layer_device[l])))
          return true;
    return false;
  }

 private:
  // Steps with fewer slots than the layer has experts (decode) use the copies; a prompt chunk
  // chooses nearly every expert anyway and reads each at home (as the executor does).
  bool uses_copies(uint32_t layer, int64_t batch) const {
    const ModelInfo& hp = inv_.info;
    return !holders_[layer].table.empty() &&
           batch * int64_t(hp.n_expert_used) < int64_t(hp.n_expert);
  }
  // One thing a parallel layer waits for: a device's part after its input arrived, or the host's
  // cores taking their parts in turn. Its time is random when it is one device's routed experts.
  struct Branch {
    int32_t dev = 0;
    double start_s = 0;  // copies before it can start
    Part part;           // its compute, when `random`
    bool random = false;
    double fixed_s = 0;  // its whole time, when not random
    Prediction mean;     // its average time by kind
  };

  // Groups streamed from disk are computed by the host.
  static int32_t compute_device(int32_t where) { return where == kOnDisk ? 0 : where; }

  static void add(Prediction& t, const Prediction& u) {
    t.decode_seconds_gpu += u.decode_seconds_gpu;
    t.decode_seconds_cpu += u.decode_seconds_cpu;
    t.decode_seconds_transfer += u.decode_seconds_transfer;
    t.decode_seconds_disk += u.decode_seconds_disk;
  }

  const DeviceSpec& spec(int32_t dev) const { return placement_.devices[size_t(dev)].spec; }
  bool is_gpu(int32_t dev) const { return spec(dev).kind == DeviceKind::Cuda; }

  // A part with `touched` of its routed experts read (the average when negative).
  Part with_touched(Part part, double touched) const {
    const double per_expert =
        part.touched > 0 ? part.touched_bytes / part.touched : part.expert_bytes;
    part.bytes += touched < 0 ? part.touched_bytes : touched * per_expert;
    return part;
  }
  double part_seconds(int32_t dev, const Part& part, double touched) const {
    return seconds(dev, with_touched(part, touched));
  }
  Prediction part_mean(int32_t dev, const Part& part) const {
    Prediction p;
    const Part avg = with_touched(part, -1);
    add_to(p, dev, seconds(dev, avg) - disk_s(avg));
    p.decode_seconds_disk += disk_s(avg);
    return p;
  }

  // The FFN block of a layer whose attention is on `owner`: every device's part at once, the
  // layer waiting for the slowest (the expected maximum over the routing, not the maximum of the
  // averages: with experts spread over many devices some device usually gets more than its
  // share), then the gather of the other GPUs' outputs on the owner, all sent at once.
  Prediction ffn_seconds(uint32_t layer, int64_t batch, int32_t owner, const std::vector<Part>& ffn,
                         double in_bytes, double out_bytes) const {
    std::vector<Branch> branches;
    // What the owner does before any other device can start: the FFN's norm and the routing (the
    // router's bytes are counted with the attention block's).
    const double routing_s = 2 * params_.of(spec(owner).kind).op_overhead_s;
    // With copies of experts, every device but the host first picks which it computes (one op).
    const bool copies = uses_copies(layer, batch);
    // Parts on a machine's host memory (its CPU, simulated devices, disk) take turns on that
    // host's cores: a branch per machine, the sum of its parts, each away from the owner with
    // its round trip and a sync. Machines' hosts work at once.
    for (int32_t node = 0; node < std::max(hw_.n_nodes, 1); ++node) {
      Branch host{.dev = 0};
      int host_parts = 0;
      int32_t host_dev = -1;
      bool host_waits_for_routing = false;  // a host part away from the owner
      for (size_t d = 0; d < ffn.size(); ++d) {
        const Part& part = ffn[d];
        if (part.ops == 0 || is_gpu(int32_t(d)) || spec(int32_t(d)).node != node) continue;
        Prediction p = part_mean(int32_t(d), part);
        if (copies && d != 0) add_to(p, int32_t(d), small_op_s(int32_t(d)));  // pick_replicas
        if (int32_t(d) != owner) {
          if (!host_waits_for_routing) host.start_s += routing_s, host_waits_for_routing = true;
          const double round_trip_s = host_round_trip_s(owner, int32_t(d), in_bytes, out_bytes);
          host.start_s += round_trip_s;
          p.decode_seconds_transfer += round_trip_s;
        }
        add(host.mean, p);
        ++host_parts, host_dev = int32_t(d);
      }
      if (host_waits_for_routing) add_to(host.mean, owner, routing_s);
      if (host_parts > 0) {
        const Part& only = ffn[size_t(host_dev)];
        host.dev = host_dev;
        host.random = host_parts == 1 && only.disk_bytes == 0 && only.experts > 0;
        host.part = only;
        host.fixed_s = total(host.mean);
        branches.push_back(host);
      }
    }
    // GPU parts: the owner's starts at once; another GPU's after the broadcast of the input,
    // which shares the sender's link among the receivers.
    int remote_gpus = 0;
    for (size_t d = 0; d < ffn.size(); ++d)
      remote_gpus += ffn[d].ops > 0 && is_gpu(int32_t(d)) && int32_t(d) != owner;
    // The gather: every other GPU sends its slots when its part ends, all at once (each copy on
    // its own stream), so the layer's device waits one latency after the slowest part plus the
    // bytes of all of them through its link, then adds them in with one op.
    double gather_copy_s = 0;
    for (size_t d = 0; d < ffn.size(); ++d) {
      if (ffn[d].ops == 0 || !is_gpu(int32_t(d))) continue;
      Branch b{.dev = int32_t(d), .part = ffn[d]};
      const bool remote = int32_t(d) != owner;
      if (remote) {
        const LinkCost link = link_between(owner, int32_t(d));
        b.start_s = routing_s + link.latency_s + remote_gpus * in_bytes / link.bandwidth_bytes_per_s;
        // There it zeroes its slots and runs one moe op.
        b.part.ops = 1;
        b.part.extra_s += params_.gpu_small_op_s;
        gather_copy_s = link.latency_s + remote_gpus * out_bytes / link.bandwidth_bytes_per_s;
      } else if (remote_gpus > 0 || !branches.empty()) {  // branches: the hosts' so far
        b.part.extra_s += params_.gpu_small_op_s;  // its slots zeroed before the others add in
      }
      if (copies) b.part.extra_s += params_.gpu_small_op_s;  // pick_replicas before its experts
      b.random = (b.part.experts > 0 || b.part.expert_bytes > 0) && b.part.disk_bytes == 0;
      b.mean = part_mean(b.dev, b.part);
      if (remote) {
        add_to(b.mean, owner, routing_s);
        b.mean.decode_seconds_transfer += b.start_s - routing_s;
      }
      b.fixed_s = total(b.mean);
      branches.push_back(b);
    }
    Prediction out;
    if (branches.empty()) return out;

    size_t slowest = 0;
    for (size_t i = 0; i < branches.size(); ++i)
      if (branches[i].fixed_s > branches[slowest].fixed_s) slowest = i;
    double expected_slowest_s = 0;
    if (copies) {
      expected_slowest_s = sampled_slowest_s(layer, batch, owner, branches);
    } else {
      std::vector<std::vector<std::pair<double, double>>> dists;
      for (const Branch& b : branches) {
        std::vector<std::pair<double, double>> dist;
        if (!b.random) {
          dist.emplace_back(b.fixed_s, 1.0);
        } else {
          const int n = int(std::lround(b.part.experts));
          for (const auto& [c, p] : binomial(n, b.part.touched / std::max(b.part.experts, 1.0)))
            dist.emplace_back(b.start_s + part_seconds(b.dev, b.part, c), p);
        }
        dists.push_back(std::move(dist));
      }
      expected_slowest_s = expected_max(dists);
    }
    // The slowest branch on average carries the time; what the layer waits beyond its average
    // (another device's unlucky routing) counts as that branch's kind of time.
    out = branches[slowest].mean;
    const double wait_s = std::max(expected_slowest_s - total(out), 0.0);
    add_to(out, branches[slowest].dev, wait_s);
    out.decode_seconds_transfer += gather_copy_s;
    if (remote_gpus > 0) add_to(out, owner, small_op_s(owner));
    return out;
  }

  // E[the slowest branch] of a layer whose experts have copies: each device's experts depend on
  // the others' (the executor gives each chosen expert to one holder, core/replica_choice.h), so
  // the layer is sampled: routings drawn from the choice probabilities (the same seed for every
  // layer: the same plan always predicts the same, and layers alike in everything the answer
  // depends on share one sampling), given to holders by the executor's own rule. 512 draws of a
  // one-token step (the mean's error ~0.03 experts' time), fewer of bigger ones. FLOPs stay with
  // the experts' homes (negligible beside the bytes at these batch sizes).
  double sampled_slowest_s(uint32_t layer, int64_t batch, int32_t owner,
                           const std::vector<Branch>& branches) const {
    const ModelInfo& hp = inv_.info;
    const LayerHolders& h = holders_[layer];
    const std::vector<double>& p = choice_[layer];
    const int64_t n_expert = int64_t(hp.n_expert);
    const int64_t k = std::min<int64_t>(hp.n_expert_used, n_expert);
    if (k <= 0 || batch <= 0) return 0;
    const int64_t n_slots = batch * k;
    const std::vector<int32_t>& routings = sampled_routings(p, batch, k);
    const int64_t draws = int64_t(routings.size()) / n_slots;
    if (draws == 0) return 0;
    // Each branch's time by how many experts it gets (at most one per slot, or all).
    const int64_t most = std::min(n_slots, n_expert) + 1;
    std::vector<std::vector<double>> time_s;
    for (const Branch& b : branches) {
      std::vector<double>& by_count = time_s.emplace_back(size_t(b.random ? most : 1), b.fixed_s);
      if (b.random)
        for (int64_t c = 0; c < most; ++c)
          by_count[size_t(c)] = b.start_s + part_seconds(b.dev, b.part, double(c));
    }
    Fnv1a key;  // over everything the answer depends on
    key.mix(h.table.data(), h.table.size() * sizeof(int32_t));
    key.mix(p.data(), p.size() * sizeof(double));
    key.mix(&batch, sizeof batch), key.mix(&owner, sizeof owner);
    for (size_t i = 0; i < branches.size(); ++i) {
      key.mix(&branches[i].dev, sizeof(int32_t));
      key.mix(time_s[i].data(), time_s[i].size() * sizeof(double));
    }
    if (const auto it = sampled_.find(key.value); it != sampled_.end()) return it->second;
    std::vector<int32_t> chosen(size_t(n_expert), -1);
    int32_t load[kMaxReplicaShards];
    const int32_t busy = int32_t(hp.n_expert_shared);
    double total_s = 0;
    for (int64_t d = 0; d < draws; ++d) {
      const int32_t* ids = &routings[size_t(d * n_slots)];
      choose_replicas(ids, n_slots, h.table.data(), h.max_holders, n_expert, owner, busy,
                      chosen.data(), load);
      for (int64_t s = 0; s < n_slots; ++s) chosen[size_t(ids[s])] = -1;
      double slowest_s = 0;
      for (size_t i = 0; i < branches.size(); ++i) {
        const Branch& b = branches[i];
        const int32_t mine = load[b.dev] - (b.dev == owner ? busy : 0);
        slowest_s = std::max(slowest_s, time_s[i][b.random ? size_t(mine) : 0]);
      }
      total_s += slowest_s;
    }
    return sampled_[key.value] = total_s / double(draws);
  }

  // Routings of steps of `batch` tokens drawn from the choice probabilities `p`, k distinct
  // experts a token, as many draws as sampled_slowest_s takes (4096 slots' worth, at most 512
  // draws), one after another; the same seed for all, drawn once per StepModel.
  const std::vector<int32_t>& sampled_routings(const std::vector<double>& p, int64_t batch,
                                               int64_t k) const {
    Fnv1a key;
    key.mix(p.data(), p.size() * sizeof(double));
    key.mix(&batch, sizeof batch);
    std::vector<int32_t>& ids = routings_[key.value];
    if (!ids.empty()) return ids;
    const int64_t n_expert = int64_t(p.size()), n_slots = batch * k;
    std::vector<double> cumulative(p.size());
    double sum = 0;
    for (size_t e = 0; e < p.size(); ++e) cumulative[e] = sum += std::max(p[e], 0.0);
    if (sum <= 0 || k > n_expert) return ids;
    uint64_t state = 0x2545f4914f6cdd1dull;
    auto uniform = [&] {  // splitmix64
      uint64_t z = (state += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      return double((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
    };
    const int64_t draws = std::clamp<int64_t>(4096 / n_slots, 2, 512);
    ids.resize(size_t(draws * n_slots));
    for (int64_t t = 0; t < draws * batch; ++t) {  // k distinct experts, each by its probability
      int32_t* token = &ids[size_t(t * k)];
      for (int64_t j = 0; j < k; ++j) {
        int32_t e = -1;
        for (int tries = 0; tries < 64 && e < 0; ++tries) {
          e = int32_t(std::upper_bound(cumulative.begin(), cumulative.end(), uniform() * sum) -
                      cumulative.begin());
          e = std::min<int32_t>(e, int32_t(n_expert) - 1);
          if (std::find(token, token + j, e) != token + j) e = -1;
        }
        for (int32_t c = 0; e < 0; ++c)  // a profile with few likely experts: the next unused
          if (std::find(token, token + j, c) == token + j) e = c;
        token[j] = e;
      }
    }
    return ids;
  }

  // The divided part of a head-split attention: each share's device gets the q_a and kv_a rows
  // from the owner (one broadcast that shares the owner's link), computes its heads, and sends
  // its partial output back (all at once, sharing the owner's link); the owner adds them in with
  // one op. The layer waits for the slowest share.
  Prediction heads_seconds(int32_t owner, const std::vector<HeadShare>& shares,
                           const Part& all_heads, const InventoryGroup& weights,
                           int64_t batch) const {
    const ModelInfo& hp = inv_.info;
    const double in_bytes =
        double(batch) * 4 * double(hp.head_split.query_input_dims + hp.head_split.latent_dims);
    const double partial_bytes = double(batch) * hp.n_embd * 4;
    int remote = 0;
    for (const HeadShare& share : shares) remote += share.device != owner;
    Prediction out;
    double slowest = -1;
    for (const HeadShare& share : shares) {
      const int32_t dev = share.device;
      const double f = double(share.n_heads) / std::max<double>(hp.n_head, 1);
      InventoryGroup divided = weights;
      divided.bytes = uint64_t(double(weights.bytes) * f);
      divided.interleaved_bytes = uint64_t(double(weights.interleaved_bytes) * f);
      divided.host_kernel_extra_bytes = uint64_t(double(weights.host_kernel_extra_bytes) * f);
      Part part{.bytes = all_heads.bytes + kernel_bytes(divided, dev),
                .flops = all_heads.flops * f,
                .ops = params_.head_ops};
      Prediction p;
      add_to(p, dev, seconds(dev, part));
      if (dev != owner) {
        const LinkCost link = link_between(owner, dev);
        p.decode_seconds_transfer += link.latency_s + remote * in_bytes / link.bandwidth_bytes_per_s;
      }
      if (total(p) > slowest) slowest = total(p), out = p;
    }
    if (remote > 0) {
      const LinkCost link = link_between(shares.back().device, owner);
      out.decode_seconds_transfer += link.latency_s + remote * partial_bytes / link.bandwidth_bytes_per_s;
      add_to(out, owner, small_op_s(owner));
    }
    return out;
  }

  // Weight bytes per second the device's kernels read: measured on the host where known (our
  // decode kernel, not the memory bus, is the limit on a few cores), else a share of the spec.
  double bandwidth(int32_t dev) const {
    const DeviceKindCost& k = params_.of(spec(dev).kind);
    if (spec(dev).decode_kernel_bytes_per_s > 0)
      return spec(dev).decode_kernel_bytes_per_s * k.kernel_efficiency;
    const double bw = spec(dev).bandwidth_bytes_per_s > 0 ? spec(dev).bandwidth_bytes_per_s
                                                          : k.fallback_bandwidth_bytes_per_s;
    return bw * k.bandwidth_efficiency;
  }
  // A group's bytes as the device's measured decode kernels see them (hardware.h).
  double kernel_bytes(const InventoryGroup& g, int32_t dev) const {
    return kernel_equivalent_bytes(spec(dev), double(g.bytes), double(g.interleaved_bytes),
                                   double(g.host_kernel_extra_bytes));
  }
  double flops(int32_t dev) const {
    const DeviceKindCost& k = params_.of(spec(dev).kind);
    const double f = spec(dev).flops_per_s > 0 ? spec(dev).flops_per_s : k.fallback_flops_per_s;
    return f * k.flops_efficiency;
  }
  double disk_s(const Part& part) const {
    return part.disk_bytes / (std::max(hw_.disk_bytes_per_s, 1e6) * params_.disk_efficiency);
  }
  // Roofline: a part is bound by bytes or by FLOPs, whichever is slower; disk reads come first.
  double seconds(int32_t dev, const Part& part) const {
    return std::max((part.bytes + part.disk_bytes) / bandwidth(dev), part.flops / flops(dev)) +
           part.ops * params_.of(spec(dev).kind).op_overhead_s + part.extra_s + disk_s(part);
  }
  double small_op_s(int32_t dev) const {
    return is_gpu(dev) ? params_.gpu_small_op_s : params_.of(spec(dev).kind).op_overhead_s;
  }
  // The link a copy between two devices takes: GPU to GPU by the machine's kind, host to GPU over
  // PCIe; between host-memory devices (cpu, sim) a memcpy at the host's speed.
  // Between machines, the network's cost on top of the machine's own hop (GPUDirect: the NIC
  // reads the GPU over PCIe): latencies add, the slower bandwidth sets the rate.
  LinkCost link_between(int32_t from, int32_t to) const {
    LinkCost link;
    if (is_gpu(from) && is_gpu(to))
      link = params_.gpu_link(hw_.gpu_link);
    else if (is_gpu(from) || is_gpu(to)) {
      link = params_.host_link(hw_.gpu_link);
      // Measured on the machine where known (cuda::GpuRates).
      if (const DeviceSpec& gpu = spec(is_gpu(from) ? from : to); gpu.host_link_bytes_per_s > 0)
        link.bandwidth_bytes_per_s = gpu.host_link_bytes_per_s;
    } else
      link = {.bandwidth_bytes_per_s = bandwidth(0), .latency_s = params_.host_copy_latency_s};
    if (spec(from).node != spec(to).node) {
      if (is_gpu(from) && is_gpu(to)) link = params_.host_link(hw_.gpu_link);
      link.latency_s += hw_.node_link_latency_s;
      link.bandwidth_bytes_per_s =
          std::min(link.bandwidth_bytes_per_s, std::max(hw_.node_link_bytes_per_s, 1e6));
    }
    return link;
  }
  // A MoE layer's share on host-memory device `host` away from its layer's device `owner`: the
  // input and routing there, the outputs back, and the wait between (an event and a host task).
  // Where the owner is a GPU whose hand-off was measured (cuda::GpuRates: 8 KiB each way), that
  // figure and the bytes beyond it at the link's rate; else the links' latencies and sync_s.
  double host_round_trip_s(int32_t owner, int32_t host, double in_bytes, double out_bytes) const {
    if (is_gpu(owner) && spec(owner).host_handoff_s > 0) {
      const double measured_bytes = 16.0 * 1024;
      return spec(owner).host_handoff_s + std::max(in_bytes + out_bytes - measured_bytes, 0.0) /
                                              link_between(host, owner).bandwidth_bytes_per_s;
    }
    return transfer_s(owner, host, in_bytes) + transfer_s(host, owner, out_bytes) + params_.sync_s;
  }
  double transfer_s(int32_t from, int32_t to, double bytes) const {
    return from == to ? 0 : link_seconds(link_between(from, to), 1, bytes);
  }
  void add_to(Prediction& t, int32_t dev, double s) const {
    (is_gpu(dev) ? t.decode_seconds_gpu : t.decode_seconds_cpu) += s;
  }

  const ModelInventory& inv_;
  const Hardware& hw_;
  const Placement& placement_;
  const CostParams& params_;
  std::vector<std::vector<size_t>> layers_;  // group indices per layer
  std::vector<std::vector<double>> choice_;  // per layer, per expert: P(token chooses it)
  std::vector<bool> used_;                   // devices the step runs anything on
  std::vector<LayerHolders> holders_;        // per layer
  mutable std::unordered_map<uint64_t, double> sampled_;  // sampled_slowest_s by its inputs
  mutable std::unordered_map<uint64_t, std::vector<int32_t>> routings_;  // sampled_routings
  int64_t output_ = -1, embedding_ = -1;
};

// One prompt chunk of `batch` tokens (one sequence; its tokens share the KV rows they read,
// and only the last token's logits are needed).
double prefill_step_seconds(const StepModel& model, const Workload& workload, double context,
                            int64_t batch, bool stream_host_experts) {
  return total(model.step_seconds({.batch = batch,
                                   .context = context,
                                   .kv_tokens_read = context + double(batch),
                                   .kv_sequences = 1,
                                   .logit_rows = 1,
                                   .cache_type = workload.cache_type,
                                   .stream_host_experts = stream_host_experts}));
}

}  // namespace

int64_t stream_experts_min_tokens(const ModelInventory& inventory, const Hardware& hardware,
                                  const Workload& workload, const Placement& placement,
                                  const RoutingProfile* profile, const CostParams& params) {
  const StepModel model(inventory, hardware, placement, profile, params);
  if (!model.can_stream()) return 0;
  const double context = params.context_fill * double(std::max<int64_t>(workload.n_ctx, 1));
  // The host's time grows with the chunk's tokens, the link's does not (so once streaming wins
  // it keeps winning): the smallest chunk up to the workload's for which it wins, by doubling,
  // then halving the gap down to a sixteenth (a prediction is not finer than that, and each try
  // is two prompt steps of the whole model).
  const auto streaming_wins = [&](int64_t n) {
    return prefill_step_seconds(model, workload, context, n, true) <
           prefill_step_seconds(model, workload, context, n, false);
  };
  const int64_t largest = std::max<int64_t>(workload.prefill_batch, 1);
  if (!streaming_wins(largest)) return 0;
  int64_t wins = 1;
  while (wins < largest && !streaming_wins(wins)) wins *= 2;
  wins = std::min(wins, largest);
  int64_t loses = wins / 2;  // 0: it wins from one token
  while (wins - loses > std::max<int64_t>(1, loses / 16)) {
    const int64_t mid = (wins + loses) / 2;
    (streaming_wins(mid) ? wins : loses) = mid;
  }
  return wins;
}

Prediction predict_speed(const ModelInventory& inventory, const Hardware& hardware,
                         const Workload& workload, const Placement& placement,
                         const RoutingProfile* profile, const CostParams& params) {
  const StepModel model(inventory, hardware, placement, profile, params);
  const double context = params.context_fill * double(std::max<int64_t>(workload.n_ctx, 1));
  const int64_t n_seq = std::max<int64_t>(workload.n_parallel, 1);
  // Decode: every sequence adds one token and reads its own KV rows.
  Prediction decode = model.step_seconds({.batch = n_seq,
                                          .context = context,
                                          .kv_tokens_read = context * double(n_seq),
                                          .kv_sequences = double(n_seq),
                                          .logit_rows = n_seq,
                                          .cache_type = workload.cache_type});
  // Prefill: one sequence's batch; its tokens share the KV rows they read, and only the last
  // token's logits are needed.
  const auto prefill_s = [&](int64_t batch, bool stream) {
    return prefill_step_seconds(model, workload, context, batch, stream);
  };
  // Experts in RAM beside a GPU: streamed at the prefill chunk when that is faster
  // (stream_experts_min_tokens finds the smallest chunk for which it is).
  const int64_t batch = std::max<int64_t>(workload.prefill_batch, 1);
  decode.experts_streamable = model.can_stream();
  double prefill_seconds = prefill_s(batch, false);
  if (decode.experts_streamable) {
    if (const double streamed_s = prefill_s(batch, true); streamed_s < prefill_seconds) {
      decode.prefill_tokens_per_s_host_experts = double(batch) / std::max(prefill_seconds, 1e-12);
      prefill_seconds = streamed_s;
    }
  }
  decode.decode_tokens_per_s = double(n_seq) / std::max(total(decode), 1e-12);
  // Over machines in a pipeline, the server splits the sequences into a group per stage, each
  // with a step in flight: a cycle gives every sequence a token and lasts a group's step through
  // every machine, or the busiest machine's share of every group's step, whichever is longer.
  const int64_t groups = std::min<int64_t>(model.overlapping_stages(), n_seq);
  if (groups > 1) {
    const int64_t b = (n_seq + groups - 1) / groups;
    std::vector<double> node_s;
    const Prediction group = model.step_seconds({.batch = b,
                                                 .context = context,
                                                 .kv_tokens_read = context * double(b),
                                                 .kv_sequences = double(b),
                                                 .logit_rows = b,
                                                 .cache_type = workload.cache_type},
                                                &node_s);
    const double cycle =
        std::max(total(group), double(groups) * *std::max_element(node_s.begin(), node_s.end()));
    if (double(n_seq) / cycle > decode.decode_tokens_per_s) {
      decode.decode_tokens_per_s = double(n_seq) / cycle;
      decode.overlapping_steps = int32_t(groups);
    }
  }
  decode.prefill_tokens_per_s = double(batch) / std::max(prefill_seconds, 1e-12);
  return decode;
}

double predict_prefill_tokens_per_s(const ModelInventory& inventory, const Hardware& hardware,
                                    const Workload& workload, const Placement& placement,
                                    const RoutingProfile* profile, bool stream_host_experts,
                                    const CostParams& params) {
  const StepModel model(inventory, hardware, placement, profile, params);
  const double context = params.context_fill * double(std::max<int64_t>(workload.n_ctx, 1));
  const int64_t batch = std::max<int64_t>(workload.prefill_batch, 1);
  return double(batch) /
         std::max(prefill_step_seconds(model, workload, context, batch, stream_host_experts),
                  1e-12);
}

std::string expert_streaming_summary(const Prediction& predicted, int64_t min_tokens, bool asked,
                                     int64_t prefill_batch) {
  if (!predicted.experts_streamable) return "";
  const std::string chosen = asked ? "as --stream-experts asks" : "the cost model's choice";
  if (min_tokens <= 0)
    return fmt::format(
        "prompts: the CPU computes the experts it holds at every chunk size ({}{})", chosen,
        predicted.stream_experts_min_tokens > 0
            ? fmt::format("; the cost model would stream them from {} tokens",
                          predicted.stream_experts_min_tokens)
            : fmt::format("; streaming them to the GPU is not predicted faster at up to {} tokens",
                          prefill_batch));
  std::string line = fmt::format(
      "prompts: chunks of {} tokens or more stream the experts in RAM to their layer's GPU and "
      "compute them there ({})",
      min_tokens, chosen);
  if (predicted.prefill_tokens_per_s_host_experts > 0)
    line += fmt::format("; predicted prefill {:.1f} tokens/s at {} against {:.1f} on the CPU",
                        predicted.prefill_tokens_per_s, prefill_batch,
                        predicted.prefill_tokens_per_s_host_experts);
  return line;
}

}  // namespace tandem::plan
