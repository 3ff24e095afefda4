#pragma once
// Rule files: YAML that pins weight groups to devices; the planner places everything else around
// the pins. A rule matches a group when its regex matches the whole label
// (InventoryGroup::label: "token_embd", "output", "blk.3.attention", "blk.3.router",
// "blk.3.shared_experts", "blk.0.dense_ffn", "blk.3.expert.17"), the group's layer is in
// `layers` and its expert in `experts` (when given). The first matching rule wins.
//
//   rules:
//     - match: 'blk\..*\.expert\..*'
//       layers: 0-29        # or a single layer: 7
//       experts: 0-31
//       device: cuda:1      # cpu, cuda:N, sim:N, or disk (routed experts streamed from the file)
#include <string>
#include <string_view>

#include "plan/placement.h"

namespace tandem::plan {

// Throws tandem::Error naming `source`, the line and the field.
Rules parse_rules(std::string_view yaml_text, std::string_view source);
Rules load_rules(const std::string& path);

// The plan as a rule file that pins every group where the plan put it (ranges of layers and
// experts merged), so that loading it back reproduces the placement (`tandem plan --rules-out`).
std::string rules_to_yaml(const Placement& placement, const ModelInventory& inventory);

}  // namespace tandem::plan
