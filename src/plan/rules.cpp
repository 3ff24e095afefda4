#include "plan/rules.h"

#include <algorithm>

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "core/error.h"

namespace tandem::plan {
namespace {

// "12" or "0-29" (inclusive); a YAML integer works too.
std::pair<int32_t, int32_t> parse_range(const YAML::Node& node, std::string_view source,
                                        std::string_view field) {
  const int line = node.Mark().line + 1;
  std::string text;
  if (node.IsScalar()) text = node.Scalar();
  auto number = [&](std::string_view s, int32_t& out) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && end == s.data() + s.size() && out >= 0;
  };
  int32_t first = 0, last = 0;
  const size_t dash = text.find('-');
  const bool ok = dash == std::string::npos
                      ? number(text, first) && (last = first, true)
                      : number(std::string_view(text).substr(0, dash), first) &&
                            number(std::string_view(text).substr(dash + 1), last);
  if (!ok || first > last)
    fail("{}:{}: {}: expected a number or an inclusive range like 0-29, found '{}'", source, line,
         field, text);
  return {first, last};
}

bool is_device_name(const std::string& name) {
  // nodeM:cuda:N is a GPU of another machine in a plan over several (plan --nodes, --cluster),
  // nodeM:cpu its CPU and RAM.
  static const std::regex device(R"(cpu|disk|node[0-9]+:cpu|(node[0-9]+:)?(cuda|sim):[0-9]+)");
  return std::regex_match(name, device);
}

}  // namespace

Rules parse_rules(std::string_view yaml_text, std::string_view source) {
  YAML::Node doc;
  try {
    doc = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    fail("{}:{}: not valid YAML: {}", source, e.mark.line + 1, e.msg);
  }
  if (!doc.IsMap() || !doc["rules"] || !doc["rules"].IsSequence())
    fail(
        "{}: expected a top-level 'rules:' list (each item: match, device, optional layers and "
        "experts)",
        source);
  Rules rules;
  for (const YAML::Node& item : doc["rules"]) {
    const int line = item.Mark().line + 1;
    if (!item.IsMap())
      fail("{}:{}: each rule must be a map with 'match' and 'device'", source, line);
    Pin pin;
    for (const auto& kv : item) {
      const std::string key = kv.first.as<std::string>();
      const YAML::Node& value = kv.second;
      const int value_line = value.Mark().line + 1;
      if (key == "match" || key == "device") {
        if (!value.IsScalar()) fail("{}:{}: {}: expected a string", source, value_line, key);
        (key == "match" ? pin.pattern : pin.device) = value.Scalar();
      } else if (key == "layers") {
        pin.layers = parse_range(value, source, key);
      } else if (key == "experts") {
        pin.experts = parse_range(value, source, key);
      } else {
        fail("{}:{}: unknown field '{}' (fields: match, layers, experts, device)", source,
             kv.first.Mark().line + 1, key);
      }
    }
    if (pin.pattern.empty())
      fail("{}:{}: the rule has no 'match' (a regex on group labels)", source, line);
    if (pin.device.empty()) fail("{}:{}: the rule has no 'device'", source, line);
    try {
      (void)std::regex(pin.pattern);
    } catch (const std::regex_error& e) {
      fail("{}:{}: match: '{}' is not a valid regex ({})", source, line, pin.pattern, e.what());
    }
    if (!is_device_name(pin.device))
      fail(
          "{}:{}: device: '{}' is not a device name (cpu, cuda:N, sim:N, disk; nodeM:cpu, "
          "nodeM:cuda:N or nodeM:sim:N on another machine)",
          source, line, pin.device);
    rules.pins.push_back(std::move(pin));
  }
  return rules;
}

Rules load_rules(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("rule file {}: cannot open the file", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_rules(text.str(), path);
}

namespace {

std::string range_text(int32_t first, int32_t last) {
  return first == last ? std::to_string(first) : fmt::format("{}-{}", first, last);
}

std::string escape_regex(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::string_view(R"(\^$.|?*+()[]{})").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// One rule line-group; ranges are inclusive.
struct RuleOut {
  std::string pattern;
  std::optional<std::pair<int32_t, int32_t>> layers, experts;
  std::string device;
};

}  // namespace

std::string rules_to_yaml(const Placement& placement, const ModelInventory& inventory) {
  TANDEM_CHECK(placement.group_device.size() == inventory.groups.size());
  auto device_name = [&](int32_t d) {
    return d == kOnDisk ? std::string("disk") : placement.devices[size_t(d)].spec.name;
  };
  std::vector<RuleOut> out;
  // Per layer: what each non-expert group is ("attention", ...) and where it lives, and the
  // runs of consecutive experts on one device.
  using Hot = std::map<std::string, int32_t>;                       // suffix -> device
  using Runs = std::vector<std::tuple<int32_t, int32_t, int32_t>>;  // first, last, device
  std::vector<Hot> hot(inventory.n_layers);
  std::vector<Runs> runs(inventory.n_layers);
  for (size_t i = 0; i < inventory.groups.size(); ++i) {
    const InventoryGroup& g = inventory.groups[i];
    const int32_t d = placement.group_device[i];
    if (g.layer < 0 || uint32_t(g.layer) >= inventory.n_layers) {
      out.push_back({.pattern = escape_regex(g.label()), .device = device_name(d)});
    } else if (g.kind == WeightGroup::RoutedExperts) {
      Runs& r = runs[size_t(g.layer)];
      if (!r.empty() && std::get<2>(r.back()) == d && std::get<1>(r.back()) + 1 == g.expert)
        std::get<1>(r.back()) = g.expert;
      else
        r.emplace_back(g.expert, g.expert, d);
    } else {
      const std::string label = g.label();
      const std::string prefix = fmt::format("blk.{}.", g.layer);
      hot[size_t(g.layer)][label.substr(prefix.size())] = d;
    }
  }
  // Consecutive layers with the same groups on the same devices become one range.
  for (uint32_t first = 0; first < inventory.n_layers;) {
    uint32_t last = first;
    while (last + 1 < inventory.n_layers && hot[last + 1] == hot[first]) ++last;
    std::map<int32_t, std::string> by_device;  // device -> "attention|router"
    for (const auto& [suffix, d] : hot[first]) {
      std::string& alternatives = by_device[d];
      if (!alternatives.empty()) alternatives += '|';
      alternatives += escape_regex(suffix);
    }
    for (const auto& [d, suffixes] : by_device)
      out.push_back({.pattern = fmt::format(R"(blk\.\d+\.({}))", suffixes),
                     .layers = std::pair{int32_t(first), int32_t(last)},
                     .device = device_name(d)});
    first = last + 1;
  }
  for (uint32_t first = 0; first < inventory.n_layers;) {
    uint32_t last = first;
    while (last + 1 < inventory.n_layers && runs[last + 1] == runs[first]) ++last;
    for (const auto& [e0, e1, d] : runs[first])
      out.push_back({.pattern = R"(blk\.\d+\.expert\.\d+)",
                     .layers = std::pair{int32_t(first), int32_t(last)},
                     .experts = std::pair{e0, e1},
                     .device = device_name(d)});
    first = last + 1;
  }

  std::string yaml = fmt::format(
      "# Placement of {} {} written by `tandem plan --rules-out`: {} rules pin every weight "
      "group.\n"
      "# Load it with `tandem plan --rules FILE` (or run); edit a device to move a range.\n"
      "rules:\n",
      inventory.name, inventory.quant_mix, out.size());
  const size_t split = size_t(std::count_if(placement.layer_heads.begin(), placement.layer_heads.end(),
                                            [](const auto& shares) { return shares.size() > 1; }));
  if (split)
    yaml += fmt::format(
        "# The plan also splits the attention heads of {} layers over GPUs; rules do not pin "
        "heads:\n# the planner splits them again where it predicts that faster.\n",
        split);
  size_t copies = 0;
  for (const std::vector<int32_t>& of : placement.group_copies) copies += of.size();
  if (copies)
    yaml += fmt::format(
        "# It also copies {} experts to a second GPU; rules pin each expert's home only:\n# the "
        "planner copies again where VRAM is left and it predicts that faster.\n",
        copies);
  for (const RuleOut& r : out) {
    yaml += fmt::format("  - match: '{}'\n", r.pattern);
    if (r.layers)
      yaml += fmt::format("    layers: {}\n", range_text(r.layers->first, r.layers->second));
    if (r.experts)
      yaml += fmt::format("    experts: {}\n", range_text(r.experts->first, r.experts->second));
    yaml += fmt::format("    device: {}\n", r.device);
  }
  return yaml;
}

}  // namespace tandem::plan
