#include "plan/routing_profile.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace tandem::plan {

using nlohmann::ordered_json;

RoutingProfile parse_routing_profile(std::string_view json_text, std::string_view source) {
  ordered_json doc;
  try {
    doc = ordered_json::parse(json_text);
  } catch (const ordered_json::parse_error& e) {
    fail("routing profile {}: not valid JSON ({})", source, e.what());
  }
  if (!doc.is_object() || !doc.contains("format") || doc["format"] != kRoutingProfileFormat)
    fail("routing profile {}: expected \"format\": \"{}\" (written by `tandem profile`)", source,
         kRoutingProfileFormat);
  RoutingProfile profile;
  if (doc.contains("model")) {
    if (!doc["model"].is_string()) fail("routing profile {}: \"model\" must be a string", source);
    profile.model = doc["model"].get<std::string>();
  }
  if (!doc.contains("layers") || !doc["layers"].is_array())
    fail("routing profile {}: expected \"layers\": a list of {{\"layer\": N, \"counts\": [...]}}",
         source);
  size_t index = 0;
  for (const ordered_json& entry : doc["layers"]) {
    if (!entry.is_object() || !entry.contains("layer") || !entry["layer"].is_number_unsigned() ||
        !entry.contains("counts") || !entry["counts"].is_array())
      fail("routing profile {}: layers[{}] must be {{\"layer\": N, \"counts\": [...]}} with N >= 0",
           source, index);
    const uint64_t layer = entry["layer"].get<uint64_t>();
    if (layer > 100000)
      fail("routing profile {}: layers[{}]: layer {} is not plausible", source, index, layer);
    if (profile.counts.size() <= layer) profile.counts.resize(layer + 1);
    if (!profile.counts[layer].empty())
      fail("routing profile {}: layer {} is listed twice", source, layer);
    for (const ordered_json& c : entry["counts"]) {
      if (!c.is_number_unsigned())
        fail("routing profile {}: layer {}: counts must be non-negative integers, found {}", source,
             layer, c.dump());
      profile.counts[layer].push_back(c.get<uint64_t>());
    }
    ++index;
  }
  return profile;
}

RoutingProfile load_routing_profile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("routing profile {}: cannot open the file", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_routing_profile(text.str(), path);
}

std::string routing_profile_to_json(const RoutingProfile& profile) {
  ordered_json doc;
  doc["format"] = kRoutingProfileFormat;
  doc["model"] = profile.model;
  ordered_json layers = ordered_json::array();
  for (size_t l = 0; l < profile.counts.size(); ++l)
    if (!profile.counts[l].empty()) layers.push_back({{"layer", l}, {"counts", profile.counts[l]}});
  doc["layers"] = layers;
  return doc.dump() + "\n";
}

void save_routing_profile(const RoutingProfile& profile, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("routing profile {}: cannot create the file", path);
  out << routing_profile_to_json(profile);
  if (!out.flush()) fail("routing profile {}: write failed", path);
}

void check_routing_profile(const RoutingProfile& profile, const ModelInventory& inventory) {
  const std::string recorded =
      profile.model.empty() ? "the profile" : "profile of " + profile.model;
  for (size_t l = 0; l < profile.counts.size(); ++l) {
    if (profile.counts[l].empty()) continue;
    if (l >= inventory.n_layers || !inventory.info.is_moe_layer(uint32_t(l)))
      fail(
          "routing profile ({}) has counts for layer {}, which is not a MoE layer of {} ({} "
          "layers, "
          "the first {} dense)",
          recorded, l, inventory.name, inventory.n_layers, inventory.info.n_leading_dense);
    if (profile.counts[l].size() != inventory.info.n_expert)
      fail(
          "routing profile ({}) has {} experts in layer {}, but {} has {} routed experts per "
          "layer: "
          "it was recorded with another model",
          recorded, profile.counts[l].size(), l, inventory.name, inventory.info.n_expert);
  }
}

}  // namespace tandem::plan
