// The placements the planner weighs (planner_internal.h CandidateSpec): the layer split it has
// always made, expert-parallel plans over 2..all GPUs when the model fits in VRAM, and hybrid
// plans that keep different numbers of whole expert layers on the GPUs when it does not. Each is
// built from the same budgets and pins; planner.cpp predicts them and keeps the fastest.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/ranges.h>

#include "core/progress.h"
#include "plan/planner_internal.h"

namespace tandem::plan::detail {
namespace {

// Shares of one in proportion to `weight`, none above its `cap` (water-filling: a share that
// would pass its cap is held at it and the rest shared again among the others).
std::vector<double> capped_shares(const std::vector<double>& weight,
                                  const std::vector<double>& cap) {
  std::vector<double> share(weight.size(), 0.0);
  std::vector<bool> fixed(weight.size(), false);
  double left = 1.0;
  for (size_t round = 0; round < weight.size(); ++round) {
    double sum = 0;
    for (size_t i = 0; i < weight.size(); ++i)
      if (!fixed[i]) sum += weight[i];
    if (sum <= 0) break;
    bool capped = false;
    for (size_t i = 0; i < weight.size(); ++i)
      if (!fixed[i] && left * weight[i] / sum > cap[i]) {
        share[i] = cap[i], fixed[i] = true, left -= cap[i], capped = true;
      }
    if (capped) continue;
    for (size_t i = 0; i < weight.size(); ++i)
      if (!fixed[i]) share[i] = left * weight[i] / sum;
    break;
  }
  return share;
}

// `n` items split by `share` (largest remainders, ties to the lower index).
std::vector<size_t> apportion(size_t n, const std::vector<double>& share) {
  std::vector<size_t> count(share.size(), 0);
  std::vector<std::pair<double, size_t>> remainder;
  size_t given = 0;
  for (size_t i = 0; i < share.size(); ++i) {
    const double exact = double(n) * share[i];
    count[i] = size_t(std::floor(exact + 1e-9));
    given += count[i];
    remainder.emplace_back(exact - double(count[i]), i);
  }
  std::stable_sort(remainder.begin(), remainder.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < n && i < remainder.size(); ++i, ++given) ++count[remainder[i].second];
  return count;
}

}  // namespace

int32_t Planner::machines_of(const std::vector<int32_t>& ds) const {
  std::vector<int32_t> nodes;
  for (int32_t d : ds)
    if (std::ranges::find(nodes, p_.devices[size_t(d)].spec.node) == nodes.end())
      nodes.push_back(p_.devices[size_t(d)].spec.node);
  return int32_t(nodes.size());
}

std::vector<CandidateSpec> Planner::candidate_specs() const {
  std::vector<CandidateSpec> specs;
  // Over several machines: a layer split is a pipeline of them, and expert parallel puts each
  // layer's attention side in stages and spreads its experts over every machine (--spread mixed
  // of the runtime); the names say so.
  auto over_machines = [&](const std::vector<int32_t>& use) {
    const int32_t m = machines_of(use);
    return m > 1 ? fmt::format(" on {} machines", m) : std::string();
  };
  specs.push_back({.kind = CandidateSpec::Kind::LayerSplit,
                   .gpus = gpus_,
                   .name = hw_.n_nodes == 1 ? "layer split"
                           : gpus_.empty()
                               ? "layers on the first machine, experts in every machine's RAM"
                               : "pipeline: layer split" + over_machines(gpus_)});
  // Machines without GPUs: a pipeline over their CPUs, each layer's experts in its machine's RAM.
  if (gpus_.empty() && usable_hosts().size() > 1)
    specs.push_back({.kind = CandidateSpec::Kind::LayerSplit,
                     .over_hosts = true,
                     .name = fmt::format("pipeline: layer split over the CPUs of {} machines",
                                         usable_hosts().size())});
  // Serving several sequences over machines, a pipeline overlaps their steps, one group per
  // machine: it pays to give every machine an equal share of the layers.
  if (machines_of(gpus_) > 1 && wl_.n_parallel > 1)
    specs.push_back({.kind = CandidateSpec::Kind::LayerSplit,
                     .gpus = gpus_,
                     .balanced = true,
                     .name = "pipeline: layer split in equal shares" + over_machines(gpus_)});
  bool any_experts = false;
  uint64_t full_total = 0;
  for (uint32_t l = 0; l < inv_.n_layers; ++l) {
    any_experts = any_experts || unplaced_expert_bytes(l) > 0;
    full_total += unplaced_expert_bytes(l) +
                  (p_.layer_device[l] == kUnplaced ? unplaced_hot_bytes(l) + kv_per_layer_[l] : 0);
  }
  if (gpus_.empty() || !any_experts) return specs;
  const int64_t output = top_group(WeightGroup::OutputHead);
  if (output >= 0 && p_.group_device[size_t(output)] == kUnplaced)
    full_total += bytes(size_t(output));
  uint64_t gpu_room = 0;
  for (int32_t g : gpus_) gpu_room += room(g);

  if (full_total <= gpu_room) {
    // Everything fits in VRAM: expert parallel over the k fastest GPUs, from the fewest that
    // hold the model to all of them. More GPUs read fewer expert bytes each but add a copy in and
    // a gather copy out to every MoE layer: the cost model says where that stops paying.
    const std::vector<int32_t> by_speed = gpus_by_speed();
    auto fewest = [&](double headroom) {
      size_t k = 0;
      for (uint64_t sum = 0; k < by_speed.size() && double(sum) < headroom * double(full_total);)
        sum += room(by_speed[k++]);
      return k;
    };
    // The layer split as the machine without its slowest GPUs would have it, down to the fewest
    // that hold the model: its rules (3% headroom, overflowing layers to any GPU with room) can
    // make it use one GPU more for one cut more. So a GPU added to a machine never makes the
    // plan predict slower than the machine without it.
    for (size_t k = std::max<size_t>(fewest(1.0), 1); k < by_speed.size(); ++k) {
      std::vector<int32_t> use(by_speed.begin(), by_speed.begin() + ptrdiff_t(k));
      std::sort(use.begin(), use.end());
      specs.push_back({.kind = CandidateSpec::Kind::LayerSplit,
                       .gpus = use,
                       .name = fmt::format("{}layer split over {} GPU{}{}",
                                           machines_of(use) > 1 ? "pipeline: " : "", k,
                                           k == 1 ? "" : "s", over_machines(use))});
    }
    for (bool copies : {false, true})
      for (bool heads : {false, true})
        for (size_t k = std::max<size_t>(fewest(1.0), 2); k <= by_speed.size(); ++k) {
          std::vector<int32_t> use(by_speed.begin(), by_speed.begin() + ptrdiff_t(k));
          std::sort(use.begin(), use.end());
          // Split heads and copies of experts share one layer's work within a machine: a run over
          // several ranks does neither.
          if ((heads || copies) && machines_of(use) > 1) continue;
          specs.push_back({.kind = CandidateSpec::Kind::ExpertParallel,
                           .gpus = use,
                           .spread = true,
                           .split_heads = heads,
                           .copy_experts = copies,
                           .name = fmt::format(
                               "{}expert parallel{}{} over {} GPUs{}",
                               machines_of(use) > 1 ? "mixed: " : "", heads ? " + heads split" : "",
                               copies ? " + hot experts copied" : "", k, over_machines(use))});
        }
    // Over several machines, also every layer's attention side on the first machine's GPUs and
    // each MoE layer's experts over every machine's (--spread experts of the runtime): no
    // pipeline stages, but every MoE layer's input and outputs cross the network.
    // Only where the first machine's GPUs hold every layer's hot path (place_hot_path_over
    // would otherwise fall back to all machines', and the name would not say what it is).
    std::vector<int32_t> first_machine;
    uint64_t first_room = 0, hot_total = 0;
    for (int32_t g : gpus_)
      if (p_.devices[size_t(g)].spec.node == 0) first_machine.push_back(g), first_room += room(g);
    for (uint32_t l = 0; l < inv_.n_layers; ++l)
      if (p_.layer_device[l] == kUnplaced) hot_total += unplaced_hot_bytes(l) + kv_per_layer_[l];
    if (output >= 0 && p_.group_device[size_t(output)] == kUnplaced)
      hot_total += bytes(size_t(output));
    if (machines_of(gpus_) > 1 && !first_machine.empty() &&
        double(hot_total) <= 0.95 * double(first_room))
      specs.push_back({.kind = CandidateSpec::Kind::ExpertParallel,
                       .gpus = gpus_,
                       .hot_gpus = first_machine,
                       .spread = true,
                       .name = fmt::format("experts: layers on 1 machine, experts over {} GPUs{}",
                                           gpus_.size(), over_machines(gpus_))});
    return specs;
  }
  // Hybrid: which experts stay on the GPUs. All of some layers (those layers never wait for the
  // CPU) or part of every layer (the CPU works on every layer while the GPUs do their part):
  // the CPU's measured rate against the GPUs' decides, through the cost model.
  for (bool spread : {true, false}) {
    if (spread && gpus_.size() < 2) continue;
    for (int quarter = 4; quarter >= 0; --quarter)
      specs.push_back({.kind = CandidateSpec::Kind::Hybrid,
                       .gpus = gpus_,
                       .whole_layers = quarter,  // quarters of the most that fit; named in build
                       .spread = spread});
  }
  return specs;
}

void Planner::build(CandidateSpec& spec) {
  if (spec.over_hosts) {
    place_layers_on_hosts();
    return;
  }
  if (spec.kind == CandidateSpec::Kind::LayerSplit) {
    // On the GPUs it names, as if the machine had no others.
    const std::vector<int32_t> all = gpus_;
    gpus_ = spec.gpus;
    place_hot_path(spec.balanced);
    place_experts_on_gpus();
    gpus_ = all;
    return;
  }
  place_hot_path_over(spec.hot_gpus.empty() ? spec.gpus : spec.hot_gpus, spec.spread);
  if (spec.split_heads) split_heads(spec.gpus);
  place_experts_spread(spec);
  if (spec.copy_experts) copy_hot_experts(spec.gpus);
}

// Copies of routed experts on a second GPU of `gpus`, with the VRAM the plan leaves: a step
// gives each chosen expert to the less busy of its holders (core/replica_choice.h), so the GPU
// that drew the most experts of a layer waits less (the layer waits for its slowest device).
// The hottest experts first (by the routing profile; without one all are alike), round by round
// over the layers so that each layer gets as many copies as the others; within a layer in turn
// from each home GPU, and each copy onto the GPU that holds the fewest of that layer's experts.
// The cost model weighs the copies' gain against the plan without them (another candidate).
void Planner::copy_hot_experts(const std::vector<int32_t>& gpus) {
  if (gpus.size() < 2) return;
  struct Copy {
    double choice;
    size_t rank;  // place in its layer's turn order
    uint32_t layer;
    size_t group;
  };
  std::vector<Copy> order;
  for (uint32_t l = 0; l < inv_.n_layers; ++l) {
    std::vector<std::vector<size_t>> by_home(gpus.size());
    for (size_t g : layer_experts_[l])
      for (size_t j = 0; j < gpus.size(); ++j)
        if (p_.group_device[g] == gpus[j]) by_home[j].push_back(g);
    for (auto& home : by_home)
      std::stable_sort(home.begin(), home.end(),
                       [&](size_t a, size_t b) { return choice(a) > choice(b); });
    size_t rank = 0;
    for (size_t turn = 0;; ++turn) {
      bool any = false;
      for (const auto& home : by_home) {
        if (turn >= home.size()) continue;
        order.push_back({choice(home[turn]), rank++, l, home[turn]});
        any = true;
      }
      if (!any) break;
    }
  }
  std::stable_sort(order.begin(), order.end(), [](const Copy& a, const Copy& b) {
    return a.choice != b.choice ? a.choice > b.choice
                                : (a.rank != b.rank ? a.rank < b.rank : a.layer < b.layer);
  });
  // Experts of each layer on each GPU, homes and copies: where the next copy goes.
  std::vector<std::vector<size_t>> count(inv_.n_layers, std::vector<size_t>(gpus.size(), 0));
  for (uint32_t l = 0; l < inv_.n_layers; ++l)
    for (size_t g : layer_experts_[l])
      for (size_t j = 0; j < gpus.size(); ++j) count[l][j] += p_.group_device[g] == gpus[j];
  size_t copied = 0;
  uint64_t copied_bytes = 0;
  for (const Copy& c : order) {
    const uint64_t need = bytes(c.group);
    const int32_t home = p_.group_device[c.group];
    int64_t best = -1;
    for (size_t j = 0; j < gpus.size(); ++j)  // a GPU of the home's kind: the same kernels
      if (gpus[j] != home && room(gpus[j]) >= need &&
          p_.devices[size_t(gpus[j])].spec.kind == p_.devices[size_t(home)].spec.kind &&
          (best < 0 || count[c.layer][j] < count[c.layer][size_t(best)]))
        best = int64_t(j);
    if (best < 0) continue;
    if (p_.group_copies.empty()) p_.group_copies.resize(inv_.groups.size());
    p_.group_copies[c.group].push_back(gpus[size_t(best)]);
    p_.devices[size_t(gpus[size_t(best)])].weight_bytes += need;
    ++count[c.layer][size_t(best)];
    ++copied, copied_bytes += need;
  }
  if (copied)
    p_.reasons.push_back(fmt::format(
        "{} of the {} routed experts on GPUs have a copy on a second GPU ({}, the VRAM the plan "
        "leaves; {}): each step gives each chosen expert to the less busy of its holders, so "
        "the GPU that drew the most of a layer's experts waits less",
        copied, order.size(), format_bytes(copied_bytes),
        have_profile() ? "the most used first, by the routing profile"
                       : "without a routing profile every expert is as likely, so as many a "
                         "layer"));
}

// Head-split attention (tensor-parallel MLA) over `gpus`: each layer a GPU of them owns divides
// its heads among all of them in proportion to bandwidth, the owner's share first, each share a
// whole number of `quantum` heads so that its columns of the output projection are whole blocks
// of any format (256 values, the largest block). Every share's GPU keeps a copy of the layer's
// latent KV cache (every head reads all of it) and its part of the divided weights
// (attention_head_fraction); the owner keeps the rest. A GPU without room for its share is left
// out of that layer.
void Planner::split_heads(const std::vector<int32_t>& gpus) {
  // Only MLA splits by heads (ModelInfo::head_split).
  const ModelInfo& hp = inv_.info;
  const uint32_t v_head_dim = hp.head_split.v_head_dim;
  if (gpus.size() < 2 || hp.n_head == 0 || v_head_dim == 0) return;
  int32_t quantum = 1;
  while ((int64_t(quantum) * v_head_dim) % 256 != 0) ++quantum;
  const int32_t units = int32_t(hp.n_head) / quantum;
  if (units < 2 || int32_t(hp.n_head) % quantum != 0) return;
  size_t split = 0;
  for (uint32_t l = 0; l < inv_.n_layers; ++l) {
    const int32_t owner = p_.layer_device[l];
    if (std::find(gpus.begin(), gpus.end(), owner) == gpus.end()) continue;
    uint64_t attention = 0;
    for (size_t g : layer_hot_[l])
      if (inv_.groups[g].kind == WeightGroup::Attention && p_.group_device[g] == owner)
        attention += bytes(g);
    if (attention == 0) continue;
    // The owner first, then the others in index order.
    std::vector<int32_t> order{owner};
    for (int32_t g : gpus)
      if (g != owner) order.push_back(g);
    std::vector<double> bw;
    for (int32_t g : order) bw.push_back(bandwidth(g));
    const double bw_sum = std::accumulate(bw.begin(), bw.end(), 0.0);
    for (double& b : bw) b /= bw_sum;
    std::vector<size_t> count = apportion(size_t(units), bw);
    if (count[0] == 0) {  // the owner computes q_a and kv_a: it keeps some heads too
      --*std::max_element(count.begin(), count.end());
      count[0] = 1;
    }
    std::vector<HeadShare> shares{{.device = owner, .first_head = 0, .n_heads = 0}};
    for (size_t j = 1; j < order.size(); ++j) {
      const int32_t n = int32_t(count[j]) * quantum;
      const uint64_t share_bytes = head_share_bytes(hp, attention, n);
      if (n > 0 && room(order[j]) >= share_bytes + kv_per_layer_[l])  // else its heads stay home
        shares.push_back({.device = order[j], .first_head = 0, .n_heads = n});
    }
    if (shares.size() < 2) continue;
    uint64_t moved = 0;
    for (size_t j = 1; j < shares.size(); ++j) {
      const uint64_t share_bytes = head_share_bytes(hp, attention, shares[j].n_heads);
      p_.devices[size_t(shares[j].device)].weight_bytes += share_bytes;
      p_.devices[size_t(shares[j].device)].kv_bytes += kv_per_layer_[l];
      moved += share_bytes;
    }
    // Heads of shares left out stay with the owner.
    int32_t given = 0, next = 0;
    for (size_t j = 1; j < shares.size(); ++j) given += shares[j].n_heads;
    shares[0].n_heads = int32_t(hp.n_head) - given;
    for (HeadShare& share : shares) share.first_head = next, next += share.n_heads;
    p_.devices[size_t(owner)].weight_bytes -= moved;
    if (p_.layer_heads.size() < inv_.n_layers) p_.layer_heads.resize(inv_.n_layers);
    p_.layer_heads[l] = std::move(shares);
    ++split;
  }
  if (split)
    p_.reasons.push_back(fmt::format(
        "attention of {} layers split by heads over {} GPUs (tensor-parallel MLA): each GPU "
        "computes its heads' queries, attention and share of the output projection from its own "
        "copy of the layer's latent KV cache ({} a layer); the layer's GPU adds the partial "
        "outputs in a fixed order",
        split, gpus.size(), format_bytes(kv_per_layer_.front())));
}

// Layers whose attention a rule pinned keep their hot groups beside it; the others, in order.
std::vector<uint32_t> Planner::free_layers() {
  std::vector<uint32_t> free;
  for (uint32_t l = 0; l < inv_.n_layers; ++l) {
    if (p_.layer_device[l] == kUnplaced) {
      free.push_back(l);
      continue;
    }
    for (size_t g : layer_hot_[l])
      if (p_.group_device[g] == kUnplaced && !put(g, p_.layer_device[l])) put_on_host(g);
  }
  return free;
}

// The hot path over `gpus` in contiguous ranges, in proportion to free memory x bandwidth, by
// the bytes of the hot path alone: every GPU will hold a share of every layer's experts too, so
// the experts do not decide the cuts. When the hot path alone overflows these GPUs, as the
// layer split does it.
void Planner::place_hot_path_over(const std::vector<int32_t>& gpus, bool spread) {
  const int64_t output = top_group(WeightGroup::OutputHead);
  const uint64_t output_bytes =
      output >= 0 && p_.group_device[size_t(output)] == kUnplaced ? bytes(size_t(output)) : 0;
  uint64_t room_sum = 0, hot_total = 0;
  for (int32_t g : gpus) room_sum += room(g);
  for (uint32_t l = 0; l < inv_.n_layers; ++l)
    if (p_.layer_device[l] == kUnplaced) hot_total += unplaced_hot_bytes(l) + kv_per_layer_[l];
  if (gpus.empty() || double(hot_total + output_bytes) > 0.95 * double(room_sum)) {
    place_hot_path();
    return;
  }
  const std::vector<uint32_t> layers = free_layers();
  std::vector<double> hot(layers.size()), weight;
  double total = 0, weight_sum = 0;
  for (size_t i = 0; i < layers.size(); ++i)
    total += hot[i] = double(unplaced_hot_bytes(layers[i]) + kv_per_layer_[layers[i]]);
  for (int32_t g : gpus) weight_sum += weight.emplace_back(double(room(g)) * bandwidth(g));
  std::vector<std::string> ranges;
  size_t begin = 0;
  double cum = 0, cum_weight = 0;
  for (size_t j = 0; j < gpus.size(); ++j) {
    cum_weight += weight[j];
    const double target = total * cum_weight / weight_sum;
    size_t end = begin;
    while (end < layers.size() &&
           (j + 1 == gpus.size() || std::abs(cum + hot[end] - target) < std::abs(cum - target)))
      cum += hot[end++];
    for (size_t i = begin; i < end; ++i)
      if (!put_layer(layers[i], gpus[j])) overflow_.push_back(layers[i]);
    if (end > begin)
      ranges.push_back(fmt::format("{}-{} on {}", layers[begin], layers[end - 1], name(gpus[j])));
    begin = end;
  }
  for (uint32_t l : overflow_) {
    bool placed = false;
    for (int32_t g : gpus) placed = placed || put_layer(l, g);
    if (!placed && !put_layer(l, 0)) put_layer_on_host_anyway(l);
  }
  p_.reasons.push_back(fmt::format(
      "attention, router, shared experts, dense FFN and KV of every layer are read by every "
      "token: on GPUs, layers {}, in proportion to free memory x bandwidth by their own bytes{}{}",
      fmt::join(ranges, ", "),
      spread && gpus.size() > 1 ? " (every GPU also takes a share of every layer's experts)" : "",
      overflow_.empty()
          ? ""
          : fmt::format("; {} layers did not fit their share and moved", overflow_.size())));
  place_output_and_embeddings();
}

// Expert-parallel and hybrid candidates: every MoE layer's experts over `spec.gpus` in the same
// contiguous ranges (or, not spread, on the GPU that owns the layer); where VRAM is short,
// `spec.whole_layers` quarters of the most whole layers that fit keep all their experts there
// and the other layers the same share each; the rest goes to RAM.
void Planner::place_experts_spread(CandidateSpec& spec) {
  const std::vector<int32_t>& gpus = spec.gpus;
  if (gpus.empty()) return;
  // Each layer's experts still to place, the most used first with a profile.
  std::vector<std::vector<size_t>> todo(inv_.n_layers);
  uint64_t expert_total = 0;
  for (uint32_t l = 0; l < inv_.n_layers; ++l) {
    for (size_t g : layer_experts_[l])
      if (p_.group_device[g] == kUnplaced) todo[l].push_back(g), expert_total += bytes(g);
    if (have_profile())
      std::stable_sort(todo[l].begin(), todo[l].end(),
                       [&](size_t a, size_t b) { return choice(a) > choice(b); });
  }
  if (expert_total == 0) return;
  auto owner_of = [&](uint32_t l) {
    const int32_t d = p_.layer_device[l];
    return std::find(gpus.begin(), gpus.end(), d) != gpus.end() ? d : -1;
  };
  auto most_room = [&](uint64_t need) {
    int32_t best = -1;
    for (int32_t g : gpus)
      if (room(g) >= need && (best < 0 || room(g) > room(best))) best = g;
    return best;
  };
  size_t placed = 0;
  uint64_t placed_bytes = 0;
  // On `d`, else on the GPU with the most room; never on disk (kOnDisk is negative too).
  auto place = [&](size_t g, int32_t d) {
    if (d < 0 || !put(g, d)) {
      d = most_room(bytes(g));
      if (d < 0 || !put(g, d)) return false;
    }
    ++placed, placed_bytes += bytes(g);
    return true;
  };
  // Each GPU's share of a spread layer: in proportion to bandwidth (so each finishes its share at
  // about the same time), never more than its room allows.
  uint64_t room_sum = 0;
  std::vector<double> bw, cap;
  for (int32_t g : gpus) room_sum += room(g);
  const double to_place = double(std::min<uint64_t>(expert_total, room_sum));
  for (int32_t g : gpus) {
    bw.push_back(bandwidth(g));
    cap.push_back(to_place > 0 ? double(room(g)) / to_place : 0.0);
  }
  const std::vector<double> share = capped_shares(bw, cap);
  auto spread_layer = [&](uint32_t l, size_t n) {
    const std::vector<size_t> counts = apportion(n, share);
    size_t next = 0;
    for (size_t j = 0; j < gpus.size(); ++j)
      for (size_t c = 0; c < counts[j] && next < n; ++c) place(todo[l][next++], gpus[j]);
  };
  auto on_owner = [&](uint32_t l, size_t n) {
    const int32_t owner = owner_of(l);
    for (size_t i = 0; i < n; ++i) place(todo[l][i], owner >= 0 ? owner : most_room(0));
  };
  auto unplaced_in = [&](uint32_t l) {
    std::erase_if(todo[l], [&](size_t g) { return p_.group_device[g] != kUnplaced; });
  };

  std::string what;
  if (expert_total <= room_sum) {
    for (uint32_t l = 0; l < inv_.n_layers; ++l) spread_layer(l, todo[l].size());
    std::vector<std::string> shares;
    for (size_t j = 0; j < gpus.size(); ++j)
      shares.push_back(fmt::format("{} {:.0f}%", name(gpus[j]), 100 * share[j]));
    what = fmt::format(
        "every MoE layer's routed experts spread over {} GPUs in the same contiguous ranges ({}), "
        "in proportion to bandwidth within each GPU's room: a step's experts are read on all of "
        "them at once, and the layer's device gathers their outputs",
        gpus.size(), fmt::join(shares, ", "));
    if (spec.name.empty())
      spec.name =
          fmt::format("expert parallel over {} GPU{}", gpus.size(), gpus.size() == 1 ? "" : "s");
  } else {
    // The most whole layers that fit (per GPU when not spread), then a quarter of that at a time.
    std::vector<bool> whole(inv_.n_layers, false);
    size_t n_whole = 0;
    if (spec.spread) {
      size_t most = 0;
      for (uint64_t sum = 0; most < inv_.n_layers; ++most) {
        uint64_t layer = 0;
        for (size_t g : todo[most]) layer += bytes(g);
        if (double(sum + layer) > 0.98 * double(room_sum)) break;
        sum += layer;
      }
      const size_t keep = most * size_t(spec.whole_layers) / 4;
      for (uint32_t l = 0; l < inv_.n_layers && n_whole < keep; ++l)
        if (!todo[l].empty()) whole[l] = true, ++n_whole;
    } else {
      for (int32_t d : gpus) {
        std::vector<uint32_t> owned;
        uint64_t sum = 0;
        for (uint32_t l = 0; l < inv_.n_layers; ++l) {
          if (owner_of(l) != d || todo[l].empty()) continue;
          uint64_t layer = 0;
          for (size_t g : todo[l]) layer += bytes(g);
          if (sum + layer > room(d)) break;
          sum += layer, owned.push_back(l);
        }
        const size_t keep = owned.size() * size_t(spec.whole_layers) / 4;
        for (size_t i = 0; i < keep; ++i) whole[owned[i]] = true, ++n_whole;
      }
    }
    for (uint32_t l = 0; l < inv_.n_layers; ++l)
      if (whole[l]) (spec.spread ? spread_layer(l, todo[l].size()) : on_owner(l, todo[l].size()));
    // The other layers: the same number of experts each, what the room left allows (per GPU when
    // not spread: the layers it owns share its room).
    auto part_count = [&](const std::vector<uint32_t>& layers, uint64_t room_left) {
      uint64_t rest = 0;
      size_t experts = 0;
      for (uint32_t l : layers)
        for (size_t g : todo[l]) rest += bytes(g), ++experts;
      if (rest == 0 || layers.empty()) return size_t(0);
      const double fraction = std::min(1.0, double(room_left) / double(rest));
      return size_t(std::floor(fraction * double(experts) / double(layers.size())));
    };
    size_t partial = 0;
    if (spec.spread) {
      std::vector<uint32_t> rest;
      for (uint32_t l = 0; l < inv_.n_layers; ++l)
        if (!whole[l] && !todo[l].empty()) rest.push_back(l);
      uint64_t left = 0;
      for (int32_t g : gpus) left += room(g);
      partial = part_count(rest, left);
      for (uint32_t l : rest) spread_layer(l, std::min(partial, todo[l].size()));
    } else {
      for (int32_t d : gpus) {
        std::vector<uint32_t> rest;
        for (uint32_t l = 0; l < inv_.n_layers; ++l)
          if (!whole[l] && !todo[l].empty() && owner_of(l) == d) rest.push_back(l);
        const size_t n = part_count(rest, room(d));
        partial = std::max(partial, n);
        for (uint32_t l : rest) on_owner(l, std::min(n, todo[l].size()));
      }
    }
    // What room is left (rounding, layers owned by the host) takes more, layer by layer.
    for (uint32_t l = 0; l < inv_.n_layers; ++l) {
      unplaced_in(l);
      const int32_t owner = owner_of(l);
      for (size_t g : todo[l])
        if (!place(g, spec.spread ? most_room(bytes(g)) : (owner >= 0 ? owner : most_room(0))))
          break;
    }
    const std::string where = spec.spread ? fmt::format("spread over {} GPUs", gpus.size())
                                          : "on the GPU that owns the layer";
    what = fmt::format(
        "routed experts on GPUs: {}about {} of each {}MoE layer's, {} (the VRAM holds {:.0f}% of "
        "the experts: whole layers never wait for the CPU, partial ones keep the CPU busy on "
        "every layer while the GPU does its share)",
        n_whole ? fmt::format("all of {} layer{}' and ", n_whole, n_whole == 1 ? "" : "s") : "",
        partial, n_whole ? "other " : "", where,
        100.0 * double(placed_bytes) / double(expert_total));
    spec.name = fmt::format("hybrid: {} whole expert layer{} + {} experts/layer, {}", n_whole,
                            n_whole == 1 ? "" : "s", partial,
                            spec.spread ? fmt::format("over {} GPUs", gpus.size()) : "own GPU");
  }
  p_.reasons.push_back(
      fmt::format("{}; {} experts ({}) on GPUs", what, placed, format_bytes(placed_bytes)));
}

// The layer split, step 2: what every token reads goes to the GPUs, in contiguous layer ranges.
void Planner::place_hot_path(bool balanced) {
  std::vector<uint32_t> free_layers;  // layers whose attention is not pinned
  uint64_t hot_total = 0, full_total = 0;
  for (uint32_t l = 0; l < inv_.n_layers; ++l) {
    if (p_.layer_device[l] != kUnplaced) {
      // Pinned attention: the rest of the layer's hot groups follow it when they fit.
      for (size_t g : layer_hot_[l])
        if (p_.group_device[g] == kUnplaced && !put(g, p_.layer_device[l])) put_on_host(g);
      continue;
    }
    free_layers.push_back(l);
    hot_total += unplaced_hot_bytes(l) + kv_per_layer_[l];
    full_total += unplaced_hot_bytes(l) + kv_per_layer_[l] + unplaced_expert_bytes(l);
  }
  const int64_t output = top_group(WeightGroup::OutputHead);
  const uint64_t output_bytes =
      output >= 0 && p_.group_device[size_t(output)] == kUnplaced ? bytes(size_t(output)) : 0;
  uint64_t gpu_room = 0;
  for (int32_t g : gpus_) gpu_room += room(g);

  std::vector<int32_t> chosen = gpus_;  // GPUs that own layers, in index order
  std::vector<double> weight;
  const bool all_fit = full_total + output_bytes <= gpu_room && !gpus_.empty();
  if (all_fit && balanced) {
    for (int32_t g : chosen) weight.push_back(double(room(g)));
  } else if (all_fit) {
    // Fewest GPUs (fastest first) that hold everything: fewer cuts, same speed.
    std::vector<int32_t> by_speed = gpus_;
    std::stable_sort(by_speed.begin(), by_speed.end(), [&](int32_t a, int32_t b) {
      return bandwidth(a) != bandwidth(b) ? bandwidth(a) > bandwidth(b) : room(a) > room(b);
    });
    chosen.clear();
    uint64_t sum = 0;
    for (int32_t g : by_speed) {
      if (double(sum) >= 1.03 * double(full_total + output_bytes)) break;
      chosen.push_back(g);
      sum += room(g);
    }
    std::sort(chosen.begin(), chosen.end());
    for (int32_t g : chosen) weight.push_back(double(room(g)));
  } else {
    for (int32_t g : chosen) weight.push_back(double(room(g)) * bandwidth(g));
  }

  if (!chosen.empty() && double(hot_total + output_bytes) <= 0.95 * double(gpu_room)) {
    split_layers(free_layers, chosen, weight, all_fit);
  } else if (!gpus_.empty()) {
    // The hot path alone overflows the GPUs: fill them with the first layers, fastest first.
    std::vector<int32_t> by_speed = gpus_;
    std::stable_sort(by_speed.begin(), by_speed.end(),
                     [&](int32_t a, int32_t b) { return bandwidth(a) > bandwidth(b); });
    size_t next = 0;
    for (int32_t g : by_speed)
      while (next < free_layers.size() && put_layer(free_layers[next], g)) ++next;
    p_.reasons.push_back(fmt::format(
        "attention side of all layers ({}) does not fit in the GPUs ({} free): the first {} "
        "layers "
        "go to GPUs, the other {} run on the CPU",
        format_bytes(hot_total), format_bytes(gpu_room), next, free_layers.size() - next));
  }
  for (uint32_t l : free_layers)
    if (p_.layer_device[l] == kUnplaced && !put_layer(l, 0)) put_layer_on_host_anyway(l);

  place_output_and_embeddings();
}

// The output head beside the last layer when there is room (every token reads it, so it
// outranks any expert); the embeddings in RAM.
void Planner::place_output_and_embeddings() {
  const int64_t output = top_group(WeightGroup::OutputHead);
  if (output >= 0 && p_.group_device[size_t(output)] == kUnplaced) {
    const int32_t last = inv_.n_layers ? p_.layer_device[inv_.n_layers - 1] : 0;
    bool placed = (last > 0 && !is_host(last)) && put(size_t(output), last);
    for (int32_t g : gpus_) placed = placed || put(size_t(output), g);
    if (!placed) put_on_host(size_t(output));
    const int32_t d = p_.group_device[size_t(output)];
    p_.reasons.push_back(fmt::format("output head ({}) on {}: every token reads it{}",
                                     format_bytes(bytes(size_t(output))),
                                     d == kOnDisk ? "disk" : name(d),
                                     d == last ? ", beside the last layer (no copy before it)"
                                     : d >= 0 && is_host(d) && !gpus_.empty() ? "; no GPU had room"
                                                                              : ""));
  }
  // Embeddings stay in RAM: a step reads one row per token (a few KiB), so VRAM is better
  // spent on experts; the row goes to the first layer's device with the hidden state.
  for (size_t g : top_)
    if (p_.group_device[g] == kUnplaced) put_on_host(g);
  const int64_t embd = top_group(WeightGroup::Embedding);
  if (embd >= 0)
    p_.reasons.push_back(
        fmt::format("embeddings ({}) stay in RAM: a step reads one row per token, so VRAM is "
                    "spent on experts",
                    format_bytes(bytes(size_t(embd)))));
}

// Contiguous ranges of `layers` over `gpus`, cut where the cumulative layer bytes cross each
// GPU's share of `weight`, never past what the GPUs before the cut can hold.
void Planner::split_layers(const std::vector<uint32_t>& layers, const std::vector<int32_t>& gpus,
                           const std::vector<double>& weight, bool all_fit) {
  std::vector<double> full(layers.size());
  double total = 0;
  for (size_t i = 0; i < layers.size(); ++i)
    total += full[i] = double(unplaced_hot_bytes(layers[i]) + kv_per_layer_[layers[i]] +
                              unplaced_expert_bytes(layers[i]));
  const double weight_sum = std::accumulate(weight.begin(), weight.end(), 0.0);
  std::vector<size_t> end(gpus.size(), layers.size());  // layers [begin, end) per GPU
  size_t begin = 0;
  double cum = 0, cum_weight = 0, cum_room = 0;
  for (size_t j = 0; j + 1 < gpus.size(); ++j) {
    cum_weight += weight[j];
    cum_room += double(room(gpus[j]));
    const double target = total * cum_weight / weight_sum;
    size_t cut = begin;
    double at = cum;
    // Advance while the next layer brings the cumulative bytes closer to the target.
    while (cut < layers.size() && std::abs(at + full[cut] - target) < std::abs(at - target) &&
           (!all_fit || at + full[cut] <= cum_room))
      at += full[cut++];
    end[j] = cut;
    begin = cut;
    cum = at;
  }
  begin = 0;
  std::vector<std::string> ranges;
  for (size_t j = 0; j < gpus.size(); ++j) {
    for (size_t i = begin; i < end[j]; ++i)
      if (!put_layer(layers[i], gpus[j])) overflow_.push_back(layers[i]);
    if (end[j] > begin)
      ranges.push_back(
          fmt::format("{}-{} on {}", layers[begin], layers[end[j] - 1], name(gpus[j])));
    begin = end[j];
  }
  const bool on_hosts = is_host(gpus[0]);
  for (uint32_t l : overflow_) {
    bool placed = false;
    for (int32_t g : on_hosts ? usable_hosts() : gpus_) placed = placed || put_layer(l, g);
    if (!placed && !put_layer(l, 0)) put_layer_on_host_anyway(l);
  }
  std::string shares;
  for (size_t j = 0; j < gpus.size(); ++j)
    shares +=
        fmt::format("{}{} {:.0f}%", j ? ", " : "", name(gpus[j]), 100.0 * weight[j] / weight_sum);
  const std::string moved =
      overflow_.empty()
          ? ""
          : fmt::format("; {} layers did not fit their share and moved", overflow_.size());
  const std::string what =
      on_hosts ? "each machine's CPU runs a range of layers, their experts in its RAM"
               : "attention, router, shared experts, dense FFN and KV of every layer are read by "
                 "every token: on GPUs first";
  if (gpus.size() == 1) {
    p_.reasons.push_back(fmt::format("{}, layers {}{}", what, fmt::join(ranges, ", "), moved));
    return;
  }
  p_.reasons.push_back(fmt::format(
      "{}, layers {} ({} cut{}), split in proportion to {} ({}){}", what, fmt::join(ranges, ", "),
      ranges.size() ? ranges.size() - 1 : 0, ranges.size() == 2 ? "" : "s",
      on_hosts  ? "free RAM"
      : all_fit ? "free memory (the whole model fits in VRAM, on the fewest GPUs)"
                : "free memory x bandwidth",
      shares, moved));
}

// The layer split, step 3: routed experts into what the GPUs have left.
void Planner::place_experts_on_gpus() {
  if (gpus_.empty()) return;
  auto most_room = [&](uint64_t need) {
    int32_t best = -1;
    for (int32_t g : gpus_)
      if (room(g) >= need && (best < 0 || room(g) > room(best))) best = g;
    return best;
  };
  size_t placed = 0;
  uint64_t placed_bytes = 0;
  auto place = [&](size_t g, int32_t d) {
    if (!put(g, d)) return false;
    ++placed, placed_bytes += bytes(g);
    return true;
  };
  if (have_profile()) {
    std::vector<size_t> order;
    for (const auto& experts : layer_experts_)
      for (size_t g : experts)
        if (p_.group_device[g] == kUnplaced) order.push_back(g);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return choice(a) > choice(b); });
    double covered = 0, all = 0;
    for (size_t g : order) {
      all += choice(g);
      const int32_t owner = p_.layer_device[size_t(inv_.groups[g].layer)];
      if ((owner > 0 && !is_host(owner) && place(g, owner)) || [&] {
            const int32_t d = most_room(bytes(g));
            return d > 0 && place(g, d);
          }())
        covered += choice(g);
    }
    p_.reasons.push_back(fmt::format(
        "routed experts on GPUs: {} ({}), the most used first from the routing profile: they "
        "take "
        "{:.0f}% of the expert choices the profile recorded; each on the GPU that owns its layer "
        "when that GPU has room",
        placed, format_bytes(placed_bytes), all > 0 ? 100.0 * covered / all : 0.0));
    return;
  }
  // Whole layers first, on the GPU that owns the layer: a layer whose experts all live beside
  // its attention needs no round trip to the CPU.
  for (uint32_t l = 0; l < inv_.n_layers; ++l) {
    const int32_t owner = p_.layer_device[l];
    if (owner < 0 || is_host(owner)) continue;
    for (size_t g : layer_experts_[l])
      if (p_.group_device[g] == kUnplaced) place(g, owner);
  }
  // Then any GPU with room, keeping a layer's experts on one GPU while it lasts.
  for (uint32_t l = 0; l < inv_.n_layers; ++l) {
    int32_t current = -1;
    for (size_t g : layer_experts_[l]) {
      if (p_.group_device[g] != kUnplaced) continue;
      if (current < 0 || room(current) < bytes(g)) current = most_room(bytes(g));
      if (current < 0) break;
      place(g, current);
    }
  }
  if (placed)
    p_.reasons.push_back(
        fmt::format("routed experts on GPUs: {} ({}) filling what the attention side left, by "
                    "whole layers on "
                    "the GPU that owns the layer (no CPU round trip for those layers); no "
                    "routing profile, so "
                    "all experts count as equally used",
                    placed, format_bytes(placed_bytes)));
}

void Planner::place_layers_on_hosts() {
  const std::vector<uint32_t> layers = free_layers();  // pinned layers' groups placed
  uint64_t total = 0, ram = 0;
  for (uint32_t l : layers)
    total += unplaced_hot_bytes(l) + kv_per_layer_[l] + unplaced_expert_bytes(l);
  const std::vector<int32_t> hosts = usable_hosts();
  std::vector<double> weight;
  for (int32_t h : hosts) weight.push_back(double(room(h))), ram += room(h);
  split_layers(layers, hosts, weight, total <= ram);
  place_output_and_embeddings();
}

// Every candidate, last step: the rest in RAM; what RAM cannot hold is streamed from disk.
void Planner::place_rest_on_host() {
  std::vector<size_t> order;
  for (const auto& experts : layer_experts_)
    for (size_t g : experts)
      if (p_.group_device[g] == kUnplaced) order.push_back(g);
  if (have_profile())
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return choice(a) > choice(b); });
  uint64_t ram_bytes = 0, disk_bytes = 0;
  size_t ram = 0, disk = 0;
  std::vector<size_t> per_host(hosts_.size(), 0);  // experts in each machine's RAM
  for (size_t g : order) {
    const int32_t h = host_for(g);
    if (h != kOnDisk && put(g, h)) {
      ram_bytes += bytes(g), ++ram;
      ++per_host[size_t(std::ranges::find(hosts_, h) - hosts_.begin())];
    } else {
      put(g, kOnDisk), disk_bytes += bytes(g), ++disk;
    }
  }
  std::vector<std::string> where;
  for (size_t i = 0; i < hosts_.size(); ++i)
    if (per_host[i]) where.push_back(fmt::format("{} on {}", per_host[i], name(hosts_[i])));
  if (ram)
    p_.reasons.push_back(fmt::format(
        "routed experts in RAM: {} ({}{}){}", ram, format_bytes(ram_bytes),
        hosts_.size() > 1 ? fmt::format(": {}, each in the RAM of its layer's machine first",
                                        fmt::join(where, ", "))
                          : "",
        gpus_.empty() ? ""
                      : fmt::format(", computed by the CPU at the same time as the GPUs run {}",
                                    inv_.info.n_expert_shared > 0 ? "the shared experts"
                                                                  : "their own experts")));
  if (disk)
    p_.reasons.push_back(fmt::format("routed experts streamed from disk: {} ({}); RAM is full",
                                     disk, format_bytes(disk_bytes)));
}

}  // namespace tandem::plan::detail
