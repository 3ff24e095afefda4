// Rule files: the YAML format, its errors (file, line, field), and writing a plan back out.
#include "plan/rules.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "plan/planner.h"
#include "plan_test_support.h"

namespace tandem::plan {
namespace {

std::string error_of(std::string_view yaml) {
  try {
    parse_rules(yaml, "rules.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Rules, parses_match_layers_experts_and_device) {
  const Rules rules = parse_rules(R"(
rules:
  - match: "blk\\..*\\.expert\\..*"   # regex on the group label
    layers: 0-29
    experts: 0-31
    device: cuda:1
  - match: 'output'
    device: cpu
  - match: 'blk\.\d+\.attention'
    layers: 7
    device: disk
)",
                                  "rules.yaml");
  ASSERT_EQ(rules.pins.size(), 3u);
  EXPECT_EQ(rules.pins[0].pattern, R"(blk\..*\.expert\..*)");
  EXPECT_EQ(rules.pins[0].layers, (std::pair<int32_t, int32_t>{0, 29}));
  EXPECT_EQ(rules.pins[0].experts, (std::pair<int32_t, int32_t>{0, 31}));
  EXPECT_EQ(rules.pins[0].device, "cuda:1");
  EXPECT_FALSE(rules.pins[1].layers);
  EXPECT_EQ(rules.pins[1].device, "cpu");
  EXPECT_EQ(rules.pins[2].layers, (std::pair<int32_t, int32_t>{7, 7}));
}

TEST(Rules, errors_name_the_file_line_and_field) {
  EXPECT_EQ(error_of("rules:\n  - match: x\n    device: cuda:0\n    layer: 3\n"),
            "rules.yaml:4: unknown field 'layer' (fields: match, layers, experts, device)");
  EXPECT_EQ(error_of("rules:\n  - match: x\n    layers: 9-3\n    device: cpu\n"),
            "rules.yaml:3: layers: expected a number or an inclusive range like 0-29, found '9-3'");
  EXPECT_EQ(
      error_of("rules:\n  - match: x\n    device: gpu0\n"),
      "rules.yaml:2: device: 'gpu0' is not a device name (cpu, cuda:N, sim:N, disk; nodeM:cpu, "
      "nodeM:cuda:N or nodeM:sim:N on another machine)");
  EXPECT_NE(error_of("rules:\n  - match: '('\n    device: cpu\n")
                .find("rules.yaml:2: match: '(' is not a valid regex"),
            std::string::npos);
  EXPECT_EQ(error_of("rules:\n  - device: cpu\n"),
            "rules.yaml:2: the rule has no 'match' (a regex on group labels)");
  EXPECT_NE(error_of("rules: [\n").find("rules.yaml:"), std::string::npos);
  EXPECT_NE(error_of("pins: []\n").find("top-level 'rules:' list"), std::string::npos);
}

TEST(Rules, load_rules_reads_a_file_and_names_a_missing_one) {
  const auto path = std::filesystem::temp_directory_path() / "tandem_rules_test.yaml";
  std::ofstream(path) << "rules:\n  - match: output\n    device: cpu\n";
  EXPECT_EQ(load_rules(path.string()).pins.size(), 1u);
  std::filesystem::remove(path);
  try {
    load_rules(path.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos);
  }
}

TEST(Rules, a_written_plan_is_compact_and_loads_back_to_the_same_placement) {
  const ModelInventory inv = test::tiny_inventory();
  const Hardware hw = test::machine({0.6, 0.4}, 16);
  const Placement p = plan_placement(inv, hw, Workload{}, Rules{}, nullptr);
  const std::string yaml = rules_to_yaml(p, inv);
  EXPECT_NE(yaml.find("match: 'token_embd'"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("experts: 0-15"), std::string::npos) << yaml;
  const Rules rules = parse_rules(yaml, "<plan>");
  EXPECT_LE(rules.pins.size(), 16u) << yaml;
  const Placement q = plan_placement(inv, hw, Workload{}, rules, nullptr);
  EXPECT_EQ(q.group_device, p.group_device) << yaml;
  EXPECT_EQ(q.layer_device, p.layer_device) << yaml;
}

}  // namespace
}  // namespace tandem::plan
