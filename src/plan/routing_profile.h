#pragma once
// Routing profiles on disk: how often each routed expert of each layer was chosen, as JSON
//   {"format": "tandem_routing_profile/1", "model": "...",
//    "layers": [{"layer": 1, "counts": [12, 0, 7, ...]}, ...]}
// Layers that are not MoE are left out of "layers" (and have empty rows in RoutingProfile).
#include <string>
#include <string_view>

#include "plan/placement.h"

namespace tandem::plan {

inline constexpr std::string_view kRoutingProfileFormat = "tandem_routing_profile/1";

// Throws tandem::Error naming `source` (a path or "<text>") and what is wrong.
RoutingProfile parse_routing_profile(std::string_view json_text, std::string_view source);
RoutingProfile load_routing_profile(const std::string& path);

std::string routing_profile_to_json(const RoutingProfile& profile);
void save_routing_profile(const RoutingProfile& profile, const std::string& path);

// A profile recorded with another model: a layer past the model's last one, or a row whose
// expert count differs from the model's, is an error naming both.
void check_routing_profile(const RoutingProfile& profile, const ModelInventory& inventory);

}  // namespace tandem::plan
