// The planner (planner.h): budgets, pins, the choice among the candidates that candidates.cpp
// builds, and the explanation of the choice.
#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <regex>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/progress.h"
#include "model/tensor_layout.h"
#include "plan/planner_internal.h"
#include "plan/routing_profile.h"

namespace tandem::plan {
namespace detail {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double gib(double bytes) {
  return bytes / kGiB;
}

double step_seconds(const Prediction& p) {
  return p.decode_seconds_gpu + p.decode_seconds_cpu + p.decode_seconds_transfer +
         p.decode_seconds_disk;
}

// Whether a plan keeps everything in memory: nothing streamed from disk, no other problem.
bool in_memory(const Placement& p) {
  return p.problems.empty() &&
         std::find(p.group_device.begin(), p.group_device.end(), kOnDisk) == p.group_device.end();
}

// The cost model's order: faster decode (the workload's aggregate over its sequences), then
// faster prefill; a plan that streams weights from disk loses to one that does not. Ties keep
// the earlier candidate, so the layer split stays when nothing beats it.
bool better(const Placement& a, const Placement& b) {
  const bool a_fits = in_memory(a), b_fits = in_memory(b);
  if (a_fits != b_fits) return a_fits;
  const double da = a.predicted.decode_tokens_per_s, db = b.predicted.decode_tokens_per_s;
  if (std::abs(da - db) > 1e-9 * std::max(da, db)) return da > db;
  const double pa = a.predicted.prefill_tokens_per_s, pb = b.predicted.prefill_tokens_per_s;
  if (std::abs(pa - pb) > 1e-9 * std::max(pa, pb)) return pa > pb;
  return false;
}

}  // namespace

Planner::Planner(const ModelInventory& inv, const Hardware& hw, const Workload& wl,
                 const RoutingProfile* profile, const CostParams& cost)
    : inv_(inv), hw_(hw), wl_(wl), profile_(profile), cost_(cost) {
  p_.devices.push_back({.spec = hw.host});
  for (const DeviceSpec& gpu : hw.gpus) p_.devices.push_back({.spec = gpu});
  hosts_.push_back(0);
  for (const DeviceSpec& host : hw.other_hosts) {
    hosts_.push_back(n_devices());
    p_.devices.push_back({.spec = host});
  }
  p_.group_device.assign(inv.groups.size(), kUnplaced);
  p_.layer_device.assign(inv.n_layers, kUnplaced);
  layer_hot_.resize(inv.n_layers);
  layer_experts_.resize(inv.n_layers);
  for (size_t i = 0; i < inv.groups.size(); ++i) {
    const InventoryGroup& g = inv.groups[i];
    if (g.layer >= 0 && uint32_t(g.layer) < inv.n_layers)
      (g.kind == WeightGroup::RoutedExperts ? layer_experts_ : layer_hot_)[size_t(g.layer)]
          .push_back(i);
    else
      top_.push_back(i);
  }
  for (uint32_t l = 0; l < inv.n_layers; ++l)
    kv_per_layer_.push_back(inv.kv_layer_bytes(l, wl.n_ctx, wl.cache_type) *
                            uint64_t(std::max<int64_t>(wl.n_parallel, 1)));
  buffer_ = inv.work_buffer_bytes(std::max(wl.prefill_batch, wl.n_parallel));
  for (uint32_t l = 0; l < inv.n_layers; ++l)
    choice_.push_back(expert_choice_probabilities(inv, profile, l));
}

Placement Planner::run(const Rules& rules, bool suggest_alternatives) {
  reserve_buffers();
  apply_pins(rules);
  // Every candidate starts from the same budgets and pins and places everything else its way.
  const Placement base = p_;
  std::vector<uint64_t> seen;  // a hash of each distinct placement built
  for (CandidateSpec spec : candidate_specs()) {
    p_ = base;
    overflow_.clear();
    build(spec);
    place_rest_on_host();
    settle();
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over where every group and layer went
    for (const auto* v : {&p_.group_device, &p_.layer_device})
      for (int32_t d : *v) hash = (hash ^ uint64_t(uint32_t(d))) * 1099511628211ull;
    for (const std::vector<int32_t>& copies : p_.group_copies)
      hash = (hash ^ copies.size()) * 1099511628211ull;
    for (const std::vector<HeadShare>& shares : p_.layer_heads)
      for (const HeadShare& h : shares)
        hash = (hash ^ (uint64_t(uint32_t(h.device)) << 32 | uint32_t(h.n_heads))) * 1099511628211ull;
    if (std::find(seen.begin(), seen.end(), hash) != seen.end()) continue;  // same as before
    seen.push_back(hash);
    p_.predicted = predict_speed(inv_, hw_, wl_, p_, profile_, cost_);
    specs_.push_back(spec);
    built_.push_back(std::move(p_));
  }
  chosen_ = 0;
  for (size_t i = 1; i < built_.size(); ++i)
    if (better(built_[i], built_[chosen_])) chosen_ = i;
  p_ = built_[chosen_];
  p_.predicted.stream_experts_min_tokens =
      stream_experts_min_tokens(inv_, hw_, wl_, p_, profile_, cost_);
  finish(suggest_alternatives, rules);
  return std::move(p_);
}

double Planner::bandwidth(int32_t d) const {
  const DeviceSpec& s = p_.devices[size_t(d)].spec;
  return s.bandwidth_bytes_per_s > 0 ? s.bandwidth_bytes_per_s
                                     : cost_.of(s.kind).fallback_bandwidth_bytes_per_s;
}

// Places group `g` on device `d` (or kOnDisk) when it fits; never overfills.
bool Planner::put(size_t g, int32_t d) {
  if (d != kOnDisk && (room(d) < bytes(g) || !can_hold(g, d))) return false;
  p_.group_device[g] = d;
  if (d != kOnDisk) p_.devices[size_t(d)].weight_bytes += bytes(g);
  return true;
}

uint64_t Planner::unplaced_hot_bytes(uint32_t l) const {
  uint64_t sum = 0;
  for (size_t g : layer_hot_[l]) sum += p_.group_device[g] == kUnplaced ? bytes(g) : 0;
  return sum;
}

uint64_t Planner::unplaced_expert_bytes(uint32_t l) const {
  uint64_t sum = 0;
  for (size_t g : layer_experts_[l]) sum += p_.group_device[g] == kUnplaced ? bytes(g) : 0;
  return sum;
}

bool Planner::can_hold(size_t g, int32_t d) const {
  return !(inv_.groups[g].not_on_cuda && p_.devices[size_t(d)].spec.kind == DeviceKind::Cuda);
}

// A layer's attention side (its unplaced non-expert groups and its KV cache) onto `d`.
bool Planner::put_layer(uint32_t l, int32_t d) {
  if (room(d) < unplaced_hot_bytes(l) + kv_per_layer_[l]) return false;
  for (size_t g : layer_hot_[l])
    if (p_.group_device[g] == kUnplaced && !can_hold(g, d)) return false;
  for (size_t g : layer_hot_[l])
    if (p_.group_device[g] == kUnplaced) put(g, d);
  p_.layer_device[l] = d;
  p_.devices[size_t(d)].kv_bytes += kv_per_layer_[l];
  return true;
}

int32_t Planner::host_for(size_t g) const {
  // A layer's routed experts take its input from the layer's device and give their outputs
  // back: in that machine's RAM these copies stay off the network.
  const int32_t layer = inv_.groups[g].kind == WeightGroup::OutputHead
                            ? int32_t(inv_.n_layers) - 1  // the head follows the last layer
                            : inv_.groups[g].layer;
  int32_t home = 0;
  if (layer >= 0 && uint32_t(layer) < inv_.n_layers && p_.layer_device[size_t(layer)] >= 0) {
    const int32_t node = p_.devices[size_t(p_.layer_device[size_t(layer)])].spec.node;
    if (size_t(node) < hosts_.size()) home = hosts_[size_t(node)];
  }
  if (usable_host(home) && room(home) >= bytes(g)) return home;
  // A layer's other groups (attention, norms, router, shared experts, dense FFN) run on its
  // machine: the runtime has no other place for them.
  const WeightGroup kind = inv_.groups[g].kind;
  if (kind != WeightGroup::RoutedExperts && kind != WeightGroup::Embedding &&
      kind != WeightGroup::OutputHead)
    return kOnDisk;
  for (int32_t h : usable_hosts())
    if (h != home && room(h) >= bytes(g)) return h;
  return kOnDisk;
}

std::vector<int32_t> Planner::usable_hosts() const {
  std::vector<int32_t> usable;
  for (int32_t h : hosts_)
    if (usable_host(h)) usable.push_back(h);
  return usable;
}

void Planner::put_on_host(size_t g) {
  if (const int32_t h = host_for(g); h != kOnDisk && put(g, h)) return;
  put(g, kOnDisk);
  p_.problems.push_back(
      fmt::format("{} ({}) does not fit in RAM and is read from disk at every use",
                  inv_.groups[g].label(), format_bytes(bytes(g))));
}

void Planner::put_layer_on_host_anyway(uint32_t l) {
  p_.layer_device[l] = 0;  // first: its groups' RAM is the first machine's (host_for)
  for (size_t g : layer_hot_[l])
    if (p_.group_device[g] == kUnplaced) put_on_host(g);
  if (room(0) >= kv_per_layer_[l])
    p_.devices[0].kv_bytes += kv_per_layer_[l];
  else
    p_.problems.push_back(
        fmt::format("the KV cache of layer {} ({}) fits nowhere: lower --ctx or --parallel", l,
                    format_bytes(kv_per_layer_[l])));
}

int64_t Planner::top_group(WeightGroup kind) const {
  for (size_t g : top_)
    if (inv_.groups[g].kind == kind) return int64_t(g);
  return -1;
}

double Planner::choice(size_t g) const {
  const InventoryGroup& e = inv_.groups[g];
  return choice_[size_t(e.layer)][size_t(e.expert)];
}

bool Planner::have_profile() const {
  if (!profile_) return false;
  for (const auto& row : profile_->counts)
    if (!row.empty()) return true;
  return false;
}

// Usable GPUs, fastest first (then the most room, then the lowest index).
std::vector<int32_t> Planner::gpus_by_speed() const {
  std::vector<int32_t> by_speed = gpus_;
  std::stable_sort(by_speed.begin(), by_speed.end(), [&](int32_t a, int32_t b) {
    return bandwidth(a) != bandwidth(b) ? bandwidth(a) > bandwidth(b) : room(a) > room(b);
  });
  return by_speed;
}

void Planner::reserve_buffers() {
  for (int32_t d = 0; d < n_devices(); ++d) {
    if (cap(d) < buffer_) {
      if (d == 0)
        p_.problems.push_back(
            fmt::format("RAM: {} usable is less than the {} of work buffers a step needs",
                        format_bytes(cap(0)), format_bytes(buffer_)));
      else if (is_host(d))  // another machine's RAM: left out, as a GPU too small
        p_.reasons.push_back(fmt::format(
            "{} holds nothing: its {} of RAM for the plan cannot hold the {} of work buffers",
            name(d), format_bytes(cap(d)), format_bytes(buffer_)));
      else
        p_.reasons.push_back(
            fmt::format("{} is not used: its {} cannot hold the {} of work buffers", name(d),
                        format_bytes(cap(d)), format_bytes(buffer_)));
      continue;
    }
    p_.devices[size_t(d)].buffer_bytes = buffer_;
    if (!is_host(d)) gpus_.push_back(d);
  }
  p_.reasons.push_back(fmt::format(
      "work buffers: {} on each device for steps of {} tokens; KV cache: {} per "
      "layer{} ({} tokens x "
      "{} sequence{}), on the device of the layer's attention",
      format_bytes(buffer_), std::max(wl_.prefill_batch, wl_.n_parallel),
      format_bytes(*std::max_element(kv_per_layer_.begin(), kv_per_layer_.end())),
      std::adjacent_find(kv_per_layer_.begin(), kv_per_layer_.end(), std::not_equal_to<>()) ==
              kv_per_layer_.end()
          ? ""
          : " at most (sliding-window layers keep less)",
      wl_.n_ctx, wl_.n_parallel, wl_.n_parallel == 1 ? "" : "s"));
  // RAM is a budget like VRAM: a share stays free, as the CUDA context's share of each GPU does.
  if (hw_.ram_reserve_bytes > 0)
    p_.reasons.push_back(fmt::format(
        "RAM: {} of {} kept free for the system and the page cache ({}), as a share of each "
        "GPU is kept for the CUDA runtime; {} for the plan",
        format_bytes(hw_.ram_reserve_bytes), format_bytes(hw_.ram_bytes), hw_.ram_reserve_source,
        format_bytes(cap(0))));
  // Formats the CUDA backend does not multiply yet keep their groups in RAM.
  const bool any_cuda = std::any_of(gpus_.begin(), gpus_.end(), [&](int32_t d) {
    return p_.devices[size_t(d)].spec.kind == DeviceKind::Cuda;
  });
  std::map<std::string_view, std::pair<size_t, uint64_t>> off_cuda;  // format -> groups, bytes
  for (const InventoryGroup& g : inv_.groups)
    if (any_cuda && g.not_on_cuda) {
      auto& [count, total] = off_cuda[dtype_name(*g.not_on_cuda)];
      ++count, total += g.bytes;
    }
  for (const auto& [format, what] : off_cuda)
    p_.reasons.push_back(fmt::format(
        "{} groups ({}) hold {} weights, which the CUDA backend does not multiply yet: they stay "
        "in RAM, computed by the CPU",
        what.first, format_bytes(what.second), format));
  if (gpus_.size() >= 2 || (!gpus_.empty() && hw_.link_source.starts_with("assumed")))
    p_.reasons.push_back(
        fmt::format("links: {}{} ({})",
                    gpus_.size() >= 2 ? fmt::format("GPU to GPU over {}, ", link_name(hw_.gpu_link))
                                      : std::string(),
                    fmt::format("host to GPU over pcie{}", hw_.gpu_link == LinkKind::Pcie5 ? 5 : 4),
                    hw_.link_source));
}

int32_t Planner::device_index(const std::string& device, size_t rule) const {
  if (device == "disk") return kOnDisk;
  for (int32_t d = 0; d < n_devices(); ++d)
    if (name(d) == device) return d;
  std::string known;
  for (int32_t d = 0; d < n_devices(); ++d) known += name(d) + ", ";
  fail("rule {} puts groups on {}, which this machine does not have (devices: {}disk)", rule + 1,
       device, known);
}

void Planner::apply_pins(const Rules& rules) {
  if (rules.pins.empty()) return;
  std::vector<std::regex> patterns;
  for (size_t r = 0; r < rules.pins.size(); ++r) {
    try {
      patterns.emplace_back(rules.pins[r].pattern);
    } catch (const std::regex_error& e) {
      fail("rule {}: match '{}' is not a valid regex ({})", r + 1, rules.pins[r].pattern, e.what());
    }
  }
  std::vector<int32_t> target(rules.pins.size());
  for (size_t r = 0; r < rules.pins.size(); ++r) target[r] = device_index(rules.pins[r].device, r);
  std::vector<uint64_t> pinned_groups(rules.pins.size()), pinned_bytes(rules.pins.size());
  for (size_t i = 0; i < inv_.groups.size(); ++i) {
    const InventoryGroup& g = inv_.groups[i];
    std::string label;
    for (size_t r = 0; r < rules.pins.size(); ++r) {
      const Pin& pin = rules.pins[r];
      if (pin.layers && (g.layer < pin.layers->first || g.layer > pin.layers->second)) continue;
      if (pin.experts &&
          (g.expert < 0 || g.expert < pin.experts->first || g.expert > pin.experts->second))
        continue;
      if (label.empty()) label = g.label();
      if (!std::regex_match(label, patterns[r])) continue;
      if (target[r] == kOnDisk && g.kind != WeightGroup::RoutedExperts &&
          g.kind != WeightGroup::Embedding)
        fail(
            "rule {} puts {} on disk: only routed experts and token_embd can be streamed from "
            "the file",
            r + 1, label);
      if (target[r] >= 0 && !can_hold(i, target[r]))
        fail("rule {} puts {} on {}, but the CUDA backend cannot multiply {} yet; pin it to cpu",
             r + 1, label, name(target[r]), dtype_name(*g.not_on_cuda));
      // Charged without a capacity check; the check below names the whole shortfall.
      p_.group_device[i] = target[r];
      if (target[r] != kOnDisk) p_.devices[size_t(target[r])].weight_bytes += g.bytes;
      if (g.kind == WeightGroup::Attention && g.layer >= 0) {
        const int32_t layer_dev = target[r] == kOnDisk ? 0 : target[r];
        p_.layer_device[size_t(g.layer)] = layer_dev;
        p_.devices[size_t(layer_dev)].kv_bytes += kv_per_layer_[size_t(g.layer)];
      }
      ++pinned_groups[r];
      pinned_bytes[r] += g.bytes;
      break;
    }
  }
  for (size_t r = 0; r < rules.pins.size(); ++r) {
    const Pin& pin = rules.pins[r];
    const std::string what = fmt::format(
        "rule {} (match '{}'{}{})", r + 1, pin.pattern,
        pin.layers ? fmt::format(", layers {}-{}", pin.layers->first, pin.layers->second) : "",
        pin.experts ? fmt::format(", experts {}-{}", pin.experts->first, pin.experts->second) : "");
    if (pinned_groups[r] == 0)
      fail(
          "{} matches no weight group of {} (labels look like token_embd, output, "
          "blk.3.attention, "
          "blk.3.router, blk.3.shared_experts, blk.0.dense_ffn, blk.3.expert.17)",
          what, inv_.name);
    p_.reasons.push_back(fmt::format("{} pins {} groups ({}) to {}", what, pinned_groups[r],
                                     format_bytes(pinned_bytes[r]), rules.pins[r].device));
  }
  for (int32_t d = 0; d < n_devices(); ++d) {
    if (used(d) <= cap(d)) continue;
    const DeviceUsage& u = p_.devices[size_t(d)];
    fail(
        "the rules put {:.2f} GiB of weights and {:.2f} GiB of KV cache on {}, which has {:.2f} "
        "GiB "
        "usable after {:.2f} GiB of work buffers: {:.2f} GiB short. Pin fewer groups there or "
        "lower --ctx/--parallel",
        gib(double(u.weight_bytes)), gib(double(u.kv_bytes)), name(d),
        gib(double(cap(d) - std::min(cap(d), u.buffer_bytes))), gib(double(u.buffer_bytes)),
        gib(double(used(d) - cap(d))));
  }
}

// A candidate built: GPUs left without work give their buffers back, layers nobody took run on
// the host, and the cost model predicts it.
void Planner::settle() {
  for (int32_t g : gpus_) {
    DeviceUsage& u = p_.devices[size_t(g)];
    if (u.weight_bytes == 0 && u.kv_bytes == 0) u.buffer_bytes = 0;  // nothing to run
  }
  for (size_t i = 1; i < hosts_.size(); ++i) {  // other machines' hosts likewise
    DeviceUsage& u = p_.devices[size_t(hosts_[i])];
    if (u.weight_bytes == 0 && u.kv_bytes == 0) u.buffer_bytes = 0;
  }
  for (int32_t& d : p_.layer_device)
    if (d == kUnplaced) d = 0;
  for (int32_t d = 0; d < n_devices(); ++d)
    TANDEM_CHECK(used(d) <= cap(d));  // the budget invariant every test checks too
}

std::string Planner::holds(int32_t d) const {
  std::vector<int32_t> layers, whole, partial, heads;
  for (uint32_t l = 0; l < inv_.n_layers; ++l) {
    if (p_.layer_device[l] == d) layers.push_back(int32_t(l));
    if (l < p_.layer_heads.size() && p_.layer_device[l] != d)
      for (const HeadShare& share : p_.layer_heads[l])
        if (share.device == d) heads.push_back(int32_t(l));
    size_t here = 0;
    for (size_t g : layer_experts_[l]) here += p_.group_device[g] == d;
    if (here && here == layer_experts_[l].size())
      whole.push_back(int32_t(l));
    else if (here)
      partial.push_back(int32_t(l));
  }
  std::vector<std::string> parts;
  if (!layers.empty())
    parts.push_back(fmt::format("layers {} (attention side, KV)", format_ranges(layers)));
  if (!heads.empty())
    parts.push_back(fmt::format("heads of layers {} (with a copy of their KV)", format_ranges(heads)));
  for (size_t g : top_)
    if (p_.group_device[g] == d)
      parts.push_back(std::string(weight_group_name(inv_.groups[g].kind)));
  size_t n_experts = 0, n_copies = 0;
  for (const auto& experts : layer_experts_)
    for (size_t g : experts) {
      n_experts += p_.group_device[g] == d;
      if (g < p_.group_copies.size()) n_copies += std::ranges::count(p_.group_copies[g], d);
    }
  if (n_experts) {
    std::string where;
    if (!whole.empty()) where += "all of layers " + format_ranges(whole);
    if (!partial.empty())
      where += std::string(where.empty() ? "" : "; ") + "part of layers " + format_ranges(partial);
    parts.push_back(fmt::format("{} experts ({})", n_experts, where));
  }
  if (n_copies) parts.push_back(fmt::format("copies of {} experts homed on other GPUs", n_copies));
  return parts.empty() ? "nothing" : fmt::format("{}", fmt::join(parts, "; "));
}

void Planner::finish(bool suggest_alternatives, const Rules& rules) {
  for (int32_t g : gpus_) {
    const DeviceUsage& u = p_.devices[size_t(g)];
    if (u.weight_bytes == 0 && u.kv_bytes == 0)
      p_.reasons.push_back(fmt::format(
          "{} holds nothing: the model fits on the other GPUs, and no plan that gives it work "
          "predicts faster (--explain)",
          name(g)));
  }
  for (int32_t d = 0; d < n_devices(); ++d) p_.devices[size_t(d)].holds = holds(d);
  explain();

  // Experts on disk, whether the planner or a rule put them there.
  disk_experts_ = 0, disk_expert_bytes_ = 0;
  for (const auto& experts : layer_experts_)
    for (size_t g : experts)
      if (p_.group_device[g] == kOnDisk) ++disk_experts_, disk_expert_bytes_ += bytes(g);
  if (disk_experts_) {
    uint64_t gpu_total = 0, ram_total = 0;
    for (int32_t g : gpus_) gpu_total += cap(g);
    for (int32_t h : hosts_) ram_total += cap(h);
    p_.problems.push_back(fmt::format(
        "DOES NOT FIT: {:.1f} GiB of routed experts ({} of {}) are not in memory ({} of GPU "
        "memory, {} of RAM); as planned they are read from disk at every use ({:.1f} GB/s): "
        "predicted decode {:.2f} tokens/s, prefill {:.1f} tokens/s (cost model)",
        gib(double(disk_expert_bytes_)), disk_experts_,
        std::accumulate(layer_experts_.begin(), layer_experts_.end(), size_t(0),
                        [](size_t n, const auto& v) { return n + v.size(); }),
        format_bytes(gpu_total), format_bytes(ram_total), hw_.disk_bytes_per_s / 1e9,
        p_.predicted.decode_tokens_per_s, p_.predicted.prefill_tokens_per_s));
    // The RAM that holds it with the reserve kept free (the default reserve grows with RAM);
    // over machines, the first machine's RAM (the others' is described for the plan to use).
    const uint64_t budget = cap(0) + disk_expert_bytes_;
    uint64_t ram = budget + hw_.ram_reserve_bytes;
    if (hw_.ram_reserve_source.starts_with("default"))
      while (ram - default_ram_reserve(ram) < budget) ram += uint64_t(kGiB) / 4;
    p_.problems.push_back(fmt::format(
        "would fit: {:.1f} GiB more RAM ({:.0f} GiB in all{}){} keeps every expert in memory",
        gib(double(ram - std::min(ram, hw_.ram_bytes ? hw_.ram_bytes : cap(0)))),
        std::ceil(gib(double(ram))), hw_.ram_reserve_bytes ? ", with the reserve kept free" : "",
        hosts_.size() > 1 ? " on the first machine" : ""));
    if (suggest_alternatives) suggest(rules);
  }
  p_.fits = p_.problems.empty();
}

// The candidates weighed, and in words why the chosen one and why an idle GPU stays idle.
void Planner::explain() {
  const Placement& layer_split = built_[0];
  const double base_decode = layer_split.predicted.decode_tokens_per_s;
  std::vector<std::string>& out = p_.explanation;
  for (size_t i = 0; i < built_.size(); ++i) {
    const Placement& c = built_[i];
    Candidate candidate{.name = specs_[i].name,
                        .predicted = c.predicted,
                        .fits = in_memory(c),
                        .chosen = i == chosen_};
    std::vector<std::string> parts;
    for (int32_t g : gpus_) {
      const DeviceUsage& u = c.devices[size_t(g)];
      if (u.weight_bytes == 0 && u.kv_bytes == 0) {
        candidate.idle_gpus.push_back(name(g));
        continue;
      }
      parts.push_back(fmt::format("{} {:.0f} GiB", name(g), gib(double(u.used_bytes()))));
    }
    for (int32_t h : hosts_)  // the first machine's "RAM", the others' by name
      if (h == 0 || c.devices[size_t(h)].weight_bytes || c.devices[size_t(h)].kv_bytes)
        parts.push_back(fmt::format("{}RAM {:.0f} GiB", h == 0 ? "" : name(h) + " ",
                                    gib(double(c.devices[size_t(h)].used_bytes()))));
    candidate.layout = fmt::format("{}", fmt::join(parts, ", "));
    p_.candidates.push_back(std::move(candidate));
  }
  const Placement& chosen = built_[chosen_];
  const int32_t n_gpus = int32_t(gpus_.size());
  const std::string objective =
      wl_.n_parallel == 1 ? "one stream's decode tokens/s"
                          : fmt::format("decode tokens/s of {} streams together", wl_.n_parallel);
  out.push_back(
      chosen_ == 0
          ? fmt::format("weighed {} placement{} built around the same budgets and pins; the layer "
                        "split predicts the most {}",
                        built_.size(), built_.size() == 1 ? "" : "s", objective)
          : fmt::format("weighed {} placements built around the same budgets and pins and kept "
                        "the one that predicts the most {}: {}, {:.2f} against {:.2f} for the "
                        "layer split ({:+.1f}%)",
                        built_.size(), objective, specs_[chosen_].name,
                        chosen.predicted.decode_tokens_per_s, base_decode,
                        100.0 * (chosen.predicted.decode_tokens_per_s / base_decode - 1)));
  if (n_gpus >= 1) {
    const LinkCost gpu_link = cost_.gpu_link(hw_.gpu_link), host = cost_.host_link(hw_.gpu_link);
    out.push_back(fmt::format(
        "links ({}): host to GPU over PCIe {} ({:.0f} GB/s, {:.1f} us a copy){}", hw_.link_source,
        hw_.gpu_link == LinkKind::Pcie5 ? 5 : 4, host.bandwidth_bytes_per_s / 1e9,
        host.latency_s * 1e6,
        n_gpus < 2 ? std::string()
                   : fmt::format("; GPU to GPU over {} ({:.0f} GB/s, {:.1f} us a copy)",
                                 hw_.gpu_link == LinkKind::Nvlink ? "NVLink" : "PCIe",
                                 gpu_link.bandwidth_bytes_per_s / 1e9, gpu_link.latency_s * 1e6)));
  }
  // What the links cost this plan, and what NVLink would change where the GPUs talk over PCIe.
  const double step_s = step_seconds(chosen.predicted);
  if (n_gpus >= 2 && step_s > 0) {
    std::string line = fmt::format(
        "copies between devices (layer cuts, experts' inputs sent out and outputs gathered back, "
        "logits) take {:.2f} ms of a {:.2f} ms decode step",
        chosen.predicted.decode_seconds_transfer * 1e3, step_s * 1e3);
    if (hw_.gpu_link != LinkKind::Nvlink) {
      Hardware nvlink = hw_;
      nvlink.gpu_link = LinkKind::Nvlink;
      double best = 0;
      std::string best_name;
      for (size_t i = 0; i < built_.size(); ++i) {
        const double d =
            predict_speed(inv_, nvlink, wl_, built_[i], profile_, cost_).decode_tokens_per_s;
        if (d > best) best = d, best_name = specs_[i].name;
      }
      line += fmt::format(
          "; over {}, each copy between GPUs costs {:.0f} us before its bytes and moves {:.0f} "
          "GB/s, against {:.1f} us and {:.0f} GB/s over NVLink, which would predict {:.2f} "
          "tokens/s ({})",
          link_name(hw_.gpu_link), cost_.gpu_link(hw_.gpu_link).latency_s * 1e6,
          cost_.gpu_link(hw_.gpu_link).bandwidth_bytes_per_s / 1e9, cost_.nvlink.latency_s * 1e6,
          cost_.nvlink.bandwidth_bytes_per_s / 1e9, best, best_name);
    }
    out.push_back(line);
  }
  // Why each idle GPU stays idle: the best candidate that gives it work, and its prediction.
  for (int32_t g : gpus_) {
    const DeviceUsage& u = p_.devices[size_t(g)];
    if (u.weight_bytes != 0 || u.kv_bytes != 0) continue;
    int64_t best = -1;
    for (size_t i = 0; i < built_.size(); ++i) {
      const DeviceUsage& v = built_[i].devices[size_t(g)];
      if ((v.weight_bytes || v.kv_bytes) && (best < 0 || better(built_[i], built_[size_t(best)])))
        best = int64_t(i);
    }
    if (best < 0) {
      out.push_back(fmt::format("{} stays idle: no candidate gives it work", name(g)));
      continue;
    }
    const Placement& b = built_[size_t(best)];
    out.push_back(fmt::format(
        "{} stays idle: the model fits on the other GPUs, and the best candidate that gives it "
        "work ({}) predicts decode {:.2f} tokens/s against {:.2f}: each GPU more in a layer's "
        "experts reads fewer bytes there but adds its inputs and outputs to the copies of every "
        "parallel layer "
        "(copies: {:.2f} ms of its step against {:.2f} ms)",
        name(g), specs_[size_t(best)].name, b.predicted.decode_tokens_per_s,
        chosen.predicted.decode_tokens_per_s, b.predicted.decode_seconds_transfer * 1e3,
        chosen.predicted.decode_seconds_transfer * 1e3));
  }
}

// What a smaller quant mix would give on the same machine: planned for real when the model is a
// built-in preset, estimated from a preset's size ratios otherwise.
void Planner::suggest(const Rules& rules) {
  const auto& presets = inventory_preset_names();
  const auto& mixes = inventory_quant_mixes();
  const bool is_preset = std::find(presets.begin(), presets.end(), inv_.name) != presets.end();
  struct Option {
    std::string mix;
    uint64_t bytes;
  };
  std::vector<Option> options;
  for (const std::string& mix : mixes) {
    if (mix == inv_.quant_mix || is_bench_only_mix(mix)) continue;
    try {
      if (is_preset) {
        options.push_back({mix, inventory_from_preset(inv_.name, mix).total_weight_bytes()});
      } else if (std::find(mixes.begin(), mixes.end(), inv_.quant_mix) != mixes.end()) {
        const double ratio =
            double(inventory_from_preset("deepseek-v2-lite", mix).total_weight_bytes()) /
            double(inventory_from_preset("deepseek-v2-lite", inv_.quant_mix).total_weight_bytes());
        options.push_back({mix, uint64_t(ratio * double(inv_.total_weight_bytes()))});
      }
    } catch (const Error&) {
      // A mix the presets do not offer for this model: nothing to suggest from it.
    }
  }
  std::sort(options.begin(), options.end(),
            [](const Option& a, const Option& b) { return a.bytes > b.bytes; });
  for (const Option& o : options) {
    if (o.bytes >= inv_.total_weight_bytes()) continue;
    if (!is_preset) {
      p_.problems.push_back(fmt::format(
          "would fit: a {} quantization of this model (about {:.0f} GiB of weights, estimated from "
          "the "
          "built-in presets' ratios) needs {:.0f} GiB less; re-run `tandem plan` on that file to "
          "check",
          o.mix, gib(double(o.bytes)), gib(double(inv_.total_weight_bytes() - o.bytes))));
      return;
    }
    const ModelInventory alt = inventory_from_preset(inv_.name, o.mix);
    Placement alt_plan;
    try {
      alt_plan = Planner(alt, hw_, wl_, nullptr, cost_).run(rules, false);
    } catch (const Error&) {
      continue;  // the rules do not apply to that mix
    }
    if (!alt_plan.fits) continue;
    p_.problems.push_back(
        fmt::format("would fit: the {} quant mix ({:.0f} GiB of weights) fits in memory: predicted "
                    "decode {:.2f} "
                    "tokens/s, prefill {:.1f} tokens/s (cost model; `--quant {}`)",
                    o.mix, gib(double(o.bytes)), alt_plan.predicted.decode_tokens_per_s,
                    alt_plan.predicted.prefill_tokens_per_s, o.mix));
    return;
  }
  p_.problems.push_back("no built-in quant mix of this model fits this machine's memory either");
}

}  // namespace detail

std::string format_ranges(const std::vector<int32_t>& sorted_values) {
  std::string out;
  for (size_t i = 0; i < sorted_values.size();) {
    size_t j = i;
    while (j + 1 < sorted_values.size() && sorted_values[j + 1] == sorted_values[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") +
           (i == j ? std::to_string(sorted_values[i])
                   : fmt::format("{}-{}", sorted_values[i], sorted_values[j]));
    i = j + 1;
  }
  return out;
}

Placement plan_placement(const ModelInventory& inventory, const Hardware& hardware,
                         const Workload& workload, const Rules& rules,
                         const RoutingProfile* profile, const CostParams& cost) {
  if (profile) check_routing_profile(*profile, inventory);
  return detail::Planner(inventory, hardware, workload, profile, cost).run(rules, true);
}

}  // namespace tandem::plan
