#include "plan/planner.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <regex>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/progress.h"
#include "plan/routing_profile.h"

namespace tandem::plan {
namespace {

constexpr int32_t kUnplaced = -2;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double gib(double bytes) {
  return bytes / kGiB;
}

class Planner {
 public:
  Planner(const ModelInventory& inv, const Hardware& hw, const Workload& wl,
          const RoutingProfile* profile, const CostParams& cost)
      : inv_(inv), hw_(hw), wl_(wl), profile_(profile), cost_(cost) {
    p_.devices.push_back({.spec = hw.host});
    for (const DeviceSpec& gpu : hw.gpus) p_.devices.push_back({.spec = gpu});
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
    kv_per_layer_ = inv.kv_bytes_per_token_per_layer * uint64_t(std::max<int64_t>(wl.n_ctx, 0)) *
                    uint64_t(std::max<int64_t>(wl.n_parallel, 1));
    buffer_ = inv.work_buffer_bytes(std::max(wl.prefill_batch, wl.n_parallel));
    for (uint32_t l = 0; l < inv.n_layers; ++l)
      choice_.push_back(expert_choice_probabilities(inv, profile, l));
  }

  Placement run(const Rules& rules, bool suggest_alternatives) {
    reserve_buffers();
    apply_pins(rules);
    place_hot_path();
    place_experts_on_gpus();
    place_rest_on_host();
    finish(suggest_alternatives, rules);
    return std::move(p_);
  }

 private:
  uint64_t used(int32_t d) const { return p_.devices[size_t(d)].used_bytes(); }
  uint64_t cap(int32_t d) const { return p_.devices[size_t(d)].spec.memory_bytes; }
  uint64_t room(int32_t d) const { return cap(d) > used(d) ? cap(d) - used(d) : 0; }
  int32_t n_devices() const { return int32_t(p_.devices.size()); }
  const std::string& name(int32_t d) const { return p_.devices[size_t(d)].spec.name; }
  double bandwidth(int32_t d) const {
    const DeviceSpec& s = p_.devices[size_t(d)].spec;
    return s.bandwidth_bytes_per_s > 0 ? s.bandwidth_bytes_per_s
                                       : cost_.of(s.kind).fallback_bandwidth_bytes_per_s;
  }
  uint64_t bytes(size_t g) const { return inv_.groups[g].bytes; }

  // Places group `g` on device `d` (or kOnDisk) when it fits; never overfills.
  bool put(size_t g, int32_t d) {
    if (d != kOnDisk && room(d) < bytes(g)) return false;
    p_.group_device[g] = d;
    if (d != kOnDisk) p_.devices[size_t(d)].weight_bytes += bytes(g);
    return true;
  }
  uint64_t unplaced_hot_bytes(uint32_t l) const {
    uint64_t sum = 0;
    for (size_t g : layer_hot_[l]) sum += p_.group_device[g] == kUnplaced ? bytes(g) : 0;
    return sum;
  }
  uint64_t unplaced_expert_bytes(uint32_t l) const {
    uint64_t sum = 0;
    for (size_t g : layer_experts_[l]) sum += p_.group_device[g] == kUnplaced ? bytes(g) : 0;
    return sum;
  }
  // A layer's attention side (its unplaced non-expert groups and its KV cache) onto `d`.
  bool put_layer(uint32_t l, int32_t d) {
    if (room(d) < unplaced_hot_bytes(l) + kv_per_layer_) return false;
    for (size_t g : layer_hot_[l])
      if (p_.group_device[g] == kUnplaced) put(g, d);
    p_.layer_device[l] = d;
    p_.devices[size_t(d)].kv_bytes += kv_per_layer_;
    return true;
  }

  void reserve_buffers() {
    for (int32_t d = 0; d < n_devices(); ++d) {
      if (cap(d) < buffer_) {
        if (d == 0)
          p_.problems.push_back(
              fmt::format("RAM: {} usable is less than the {} of work buffers a step needs",
                          format_bytes(cap(0)), format_bytes(buffer_)));
        else
          p_.reasons.push_back(
              fmt::format("{} is not used: its {} cannot hold the {} of work buffers", name(d),
                          format_bytes(cap(d)), format_bytes(buffer_)));
        continue;
      }
      p_.devices[size_t(d)].buffer_bytes = buffer_;
      if (d > 0) gpus_.push_back(d);
    }
    p_.reasons.push_back(fmt::format(
        "work buffers: {} on each device for steps of {} tokens; KV cache: {} per "
        "layer ({} tokens x "
        "{} sequence{}), on the device of the layer's attention",
        format_bytes(buffer_), std::max(wl_.prefill_batch, wl_.n_parallel),
        format_bytes(kv_per_layer_), wl_.n_ctx, wl_.n_parallel, wl_.n_parallel == 1 ? "" : "s"));
  }

  int32_t device_index(const std::string& device, size_t rule) const {
    if (device == "disk") return kOnDisk;
    for (int32_t d = 0; d < n_devices(); ++d)
      if (name(d) == device) return d;
    std::string known;
    for (int32_t d = 0; d < n_devices(); ++d) known += name(d) + ", ";
    fail("rule {} puts groups on {}, which this machine does not have (devices: {}disk)", rule + 1,
         device, known);
  }

  void apply_pins(const Rules& rules) {
    if (rules.pins.empty()) return;
    std::vector<std::regex> patterns;
    for (size_t r = 0; r < rules.pins.size(); ++r) {
      try {
        patterns.emplace_back(rules.pins[r].pattern);
      } catch (const std::regex_error& e) {
        fail("rule {}: match '{}' is not a valid regex ({})", r + 1, rules.pins[r].pattern,
             e.what());
      }
    }
    std::vector<int32_t> target(rules.pins.size());
    for (size_t r = 0; r < rules.pins.size(); ++r)
      target[r] = device_index(rules.pins[r].device, r);
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
        // Charged without a capacity check; the check below names the whole shortfall.
        p_.group_device[i] = target[r];
        if (target[r] != kOnDisk) p_.devices[size_t(target[r])].weight_bytes += g.bytes;
        if (g.kind == WeightGroup::Attention && g.layer >= 0) {
          const int32_t layer_dev = target[r] == kOnDisk ? 0 : target[r];
          p_.layer_device[size_t(g.layer)] = layer_dev;
          p_.devices[size_t(layer_dev)].kv_bytes += kv_per_layer_;
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
          pin.experts ? fmt::format(", experts {}-{}", pin.experts->first, pin.experts->second)
                      : "");
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

  // Step 2: what every token reads goes to the GPUs, in contiguous layer ranges.
  void place_hot_path() {
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
      hot_total += unplaced_hot_bytes(l) + kv_per_layer_;
      full_total += unplaced_hot_bytes(l) + kv_per_layer_ + unplaced_expert_bytes(l);
    }
    const int64_t output = top_group(WeightGroup::OutputHead);
    const uint64_t output_bytes =
        output >= 0 && p_.group_device[size_t(output)] == kUnplaced ? bytes(size_t(output)) : 0;
    uint64_t gpu_room = 0;
    for (int32_t g : gpus_) gpu_room += room(g);

    std::vector<int32_t> chosen = gpus_;  // GPUs that own layers, in index order
    std::vector<double> weight;
    const bool all_fit = full_total + output_bytes <= gpu_room && !gpus_.empty();
    if (all_fit) {
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

    // The output head: every token reads it, so it outranks any expert.
    if (output >= 0 && p_.group_device[size_t(output)] == kUnplaced) {
      const int32_t last = inv_.n_layers ? p_.layer_device[inv_.n_layers - 1] : 0;
      bool placed = last > 0 && put(size_t(output), last);
      for (int32_t g : gpus_) placed = placed || put(size_t(output), g);
      if (!placed) put_on_host(size_t(output));
      const int32_t d = p_.group_device[size_t(output)];
      p_.reasons.push_back(fmt::format("output head ({}) on {}: every token reads it{}",
                                       format_bytes(bytes(size_t(output))),
                                       d == kOnDisk ? "disk" : name(d),
                                       d == last ? ", beside the last layer (no copy before it)"
                                                 : (d == 0 ? "; no GPU had room" : "")));
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
  void split_layers(const std::vector<uint32_t>& layers, const std::vector<int32_t>& gpus,
                    const std::vector<double>& weight, bool all_fit) {
    std::vector<double> full(layers.size());
    double total = 0;
    for (size_t i = 0; i < layers.size(); ++i)
      total += full[i] =
          double(unplaced_hot_bytes(layers[i]) + kv_per_layer_ + unplaced_expert_bytes(layers[i]));
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
    for (uint32_t l : overflow_) {
      bool placed = false;
      for (int32_t g : gpus_) placed = placed || put_layer(l, g);
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
        "attention, router, shared experts, dense FFN and KV of every layer are read by every "
        "token: on GPUs first";
    if (gpus.size() == 1) {
      p_.reasons.push_back(fmt::format("{}, layers {}{}", what, fmt::join(ranges, ", "), moved));
      return;
    }
    p_.reasons.push_back(fmt::format(
        "{}, layers {} ({} cut{}), split in proportion to {} ({}){}", what, fmt::join(ranges, ", "),
        ranges.size() ? ranges.size() - 1 : 0, ranges.size() == 2 ? "" : "s",
        all_fit ? "free memory (the whole model fits in VRAM, on the fewest GPUs)"
                : "free memory x bandwidth",
        shares, moved));
  }

  void put_on_host(size_t g) {
    if (put(g, 0)) return;
    put(g, kOnDisk);
    p_.problems.push_back(
        fmt::format("{} ({}) does not fit in RAM and is read from disk at every use",
                    inv_.groups[g].label(), format_bytes(bytes(g))));
  }
  void put_layer_on_host_anyway(uint32_t l) {
    for (size_t g : layer_hot_[l])
      if (p_.group_device[g] == kUnplaced) put_on_host(g);
    p_.layer_device[l] = 0;
    if (room(0) >= kv_per_layer_)
      p_.devices[0].kv_bytes += kv_per_layer_;
    else
      p_.problems.push_back(
          fmt::format("the KV cache of layer {} ({}) fits nowhere: lower --ctx or --parallel", l,
                      format_bytes(kv_per_layer_)));
  }

  int64_t top_group(WeightGroup kind) const {
    for (size_t g : top_)
      if (inv_.groups[g].kind == kind) return int64_t(g);
    return -1;
  }
  double choice(size_t g) const {
    const InventoryGroup& e = inv_.groups[g];
    return choice_[size_t(e.layer)][size_t(e.expert)];
  }
  bool have_profile() const {
    if (!profile_) return false;
    for (const auto& row : profile_->counts)
      if (!row.empty()) return true;
    return false;
  }

  // Step 3: routed experts into what the GPUs have left.
  void place_experts_on_gpus() {
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
        if ((owner > 0 && place(g, owner)) || [&] {
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
      if (owner <= 0) continue;
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

  // Step 4: the rest in RAM; what RAM cannot hold is streamed from disk.
  void place_rest_on_host() {
    std::vector<size_t> order;
    for (const auto& experts : layer_experts_)
      for (size_t g : experts)
        if (p_.group_device[g] == kUnplaced) order.push_back(g);
    if (have_profile())
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return choice(a) > choice(b); });
    uint64_t ram_bytes = 0, disk_bytes = 0;
    size_t ram = 0, disk = 0;
    for (size_t g : order) {
      if (put(g, 0))
        ram_bytes += bytes(g), ++ram;
      else
        put(g, kOnDisk), disk_bytes += bytes(g), ++disk;
    }
    if (ram)
      p_.reasons.push_back(
          fmt::format("routed experts in RAM: {} ({}), computed by the CPU at the same time as the "
                      "GPUs run the "
                      "shared experts",
                      ram, format_bytes(ram_bytes)));
    if (disk)
      p_.reasons.push_back(fmt::format("routed experts streamed from disk: {} ({}); RAM is full",
                                       disk, format_bytes(disk_bytes)));
  }

  void finish(bool suggest_alternatives, const Rules& rules);
  std::string holds(int32_t d) const;
  void suggest(const Rules& rules);

  const ModelInventory& inv_;
  const Hardware& hw_;
  const Workload& wl_;
  const RoutingProfile* profile_;
  const CostParams& cost_;
  Placement p_;
  std::vector<std::vector<size_t>> layer_hot_, layer_experts_;  // group indices per layer
  std::vector<size_t> top_;                                     // groups outside the blocks
  std::vector<std::vector<double>> choice_;                     // P(token chooses expert)
  std::vector<int32_t> gpus_;                                   // usable GPU device indices
  std::vector<uint32_t> overflow_;
  uint64_t kv_per_layer_ = 0, buffer_ = 0;
  size_t disk_experts_ = 0;
  uint64_t disk_expert_bytes_ = 0;
};

std::string Planner::holds(int32_t d) const {
  std::vector<int32_t> layers, whole, partial;
  for (uint32_t l = 0; l < inv_.n_layers; ++l) {
    if (p_.layer_device[l] == d) layers.push_back(int32_t(l));
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
  for (size_t g : top_)
    if (p_.group_device[g] == d)
      parts.push_back(std::string(weight_group_name(inv_.groups[g].kind)));
  size_t n_experts = 0;
  for (const auto& experts : layer_experts_)
    for (size_t g : experts) n_experts += p_.group_device[g] == d;
  if (n_experts) {
    std::string where;
    if (!whole.empty()) where += "all of layers " + format_ranges(whole);
    if (!partial.empty())
      where += std::string(where.empty() ? "" : "; ") + "part of layers " + format_ranges(partial);
    parts.push_back(fmt::format("{} experts ({})", n_experts, where));
  }
  return parts.empty() ? "nothing" : fmt::format("{}", fmt::join(parts, "; "));
}

void Planner::finish(bool suggest_alternatives, const Rules& rules) {
  for (int32_t g : gpus_) {
    DeviceUsage& u = p_.devices[size_t(g)];
    if (u.weight_bytes == 0 && u.kv_bytes == 0) {
      u.buffer_bytes = 0;  // a GPU with nothing to run needs no buffers
      p_.reasons.push_back(
          fmt::format("{} holds nothing: the model fits on the other GPUs", name(g)));
    }
  }
  for (int32_t d = 0; d < n_devices(); ++d) {
    TANDEM_CHECK(used(d) <= cap(d));  // the budget invariant every test checks too
    p_.devices[size_t(d)].holds = holds(d);
  }
  for (int32_t& d : p_.layer_device)
    if (d == kUnplaced) d = 0;
  p_.predicted = predict_speed(inv_, hw_, wl_, p_, profile_, cost_);

  // Experts on disk, whether the planner or a rule put them there.
  disk_experts_ = 0, disk_expert_bytes_ = 0;
  for (const auto& experts : layer_experts_)
    for (size_t g : experts)
      if (p_.group_device[g] == kOnDisk) ++disk_experts_, disk_expert_bytes_ += bytes(g);
  if (disk_experts_) {
    uint64_t gpu_total = 0;
    for (int32_t g : gpus_) gpu_total += cap(g);
    p_.problems.push_back(
        fmt::format("DOES NOT FIT: {:.1f} GiB of routed experts ({} of {}) are not in memory ({} "
                    "of GPU memory, "
                    "{} of RAM); as planned they are read from disk at every use ({:.1f} GB/s): "
                    "predicted decode "
                    "{:.2f} tokens/s, prefill {:.1f} tokens/s (cost model)",
                    gib(double(disk_expert_bytes_)), disk_experts_,
                    std::accumulate(layer_experts_.begin(), layer_experts_.end(), size_t(0),
                                    [](size_t n, const auto& v) { return n + v.size(); }),
                    format_bytes(gpu_total), format_bytes(cap(0)), hw_.disk_bytes_per_s / 1e9,
                    p_.predicted.decode_tokens_per_s, p_.predicted.prefill_tokens_per_s));
    p_.problems.push_back(fmt::format(
        "would fit: {:.1f} GiB more RAM ({:.0f} GiB in all) keeps every expert in memory",
        gib(double(disk_expert_bytes_)), std::ceil(gib(double(cap(0) + disk_expert_bytes_)))));
    if (suggest_alternatives) suggest(rules);
  }
  p_.fits = p_.problems.empty();
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
    if (mix == inv_.quant_mix) continue;
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

}  // namespace

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
  return Planner(inventory, hardware, workload, profile, cost).run(rules, true);
}

}  // namespace tandem::plan
