// `tandem eval MODEL --ref REF.json --out OUT.json`: runs the reference's input tokens and writes
// the same "ref_dump/1" JSON, so that ../shared/fixtures/check.py can compare the two.
// Greedy references are continued greedily; teacher-forced (.exact) references are fed their
// own generated tokens. Logits come from one batched prefill, then one token at a time.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "runtime/engine.h"

namespace tandem::cli {
namespace {

using nlohmann::json;

json position_entry(int64_t pos, int32_t input, const float* logits, int64_t n_vocab, int64_t top_n,
                    std::vector<int32_t>& order) {
  order.resize(size_t(n_vocab));
  std::iota(order.begin(), order.end(), 0);
  const int64_t n = std::min(top_n, n_vocab);
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  double sum = 0;
  const float max_logit = logits[order[0]];
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - max_logit);
  json top = json::array();
  for (int64_t i = 0; i < n; ++i) top.push_back({order[size_t(i)], logits[order[size_t(i)]]});
  return {{"pos", pos}, {"input_token", input}, {"argmax", order[0]},
          {"logsumexp", double(max_logit) + std::log(sum)}, {"top", top}};
}

std::vector<int32_t> int_list(const json& value, const char* key, const std::string& path) {
  if (!value.contains(key) || !value[key].is_array()) fail("{}: '{}' is missing or not a list", path, key);
  std::vector<int32_t> ids;
  for (const json& id : value[key]) {
    if (!id.is_number_integer()) fail("{}: '{}' holds a non-integer", path, key);
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

}  // namespace

void register_eval(CLI::App& app) {
  struct Options {
    EngineOptions engine;
    std::string ref, out;
    int64_t top = 40;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "eval", "Run a reference dump's input tokens and write our logits in the same ref_dump/1 "
              "format (compare with ../shared/fixtures/check.py REF OUT)");
  cmd->add_option("model", o->engine.model_path, "GGUF model")->required();
  cmd->add_option("--ref", o->ref, "reference JSON (ref_dump/1)")->required();
  cmd->add_option("--out", o->out, "where to write our dump")->required();
  cmd->add_option("-t,--threads", o->engine.n_threads, "threads (default: physical cores)");
  cmd->add_option("--top", o->top, "logits listed per position")->capture_default_str();
  add_device_options(cmd, o->engine);
  add_precision_option(cmd, o->engine);
  add_cache_type_options(cmd, o->engine);
  add_spread_option(cmd, o->engine);
  cmd->callback([o] {
    std::ifstream in(o->ref);
    if (!in) fail("{}: cannot read the reference", o->ref);
    json ref;
    try {
      ref = json::parse(in);
    } catch (const json::exception& e) {
      fail("{}: not valid JSON: {}", o->ref, e.what());
    }
    if (ref.value("format", "") != "ref_dump/1") fail("{}: not a ref_dump/1 file", o->ref);
    const std::vector<int32_t> prompt = int_list(ref, "prompt_tokens", o->ref);
    const std::vector<int32_t> reference_generated = int_list(ref, "generated_tokens", o->ref);
    const bool teacher_forced = ref.value("teacher_forced", false);
    if (prompt.empty()) fail("{}: the prompt is empty", o->ref);

    const int64_t n_generate = int64_t(reference_generated.size());
    o->engine.n_ctx = int64_t(prompt.size()) + n_generate + 1;
    Engine engine(o->engine);
    if (engine.follows()) return engine.follow();  // rank 0 evaluates and writes
    const int64_t n_vocab = engine.n_vocab();
    std::vector<float> logits;
    std::vector<int32_t> order;
    json positions = json::array();

    engine.evaluate(prompt, 0, 0, /*all_logits=*/true, logits);
    for (size_t i = 0; i < prompt.size(); ++i)
      positions.push_back(position_entry(int64_t(i), prompt[i], logits.data() + i * size_t(n_vocab), n_vocab, o->top, order));

    std::vector<int32_t> generated;
    int32_t next = positions.back()["argmax"].get<int32_t>();
    for (int64_t k = 0; k < n_generate; ++k) {
      const int32_t input = teacher_forced ? reference_generated[size_t(k)] : next;
      generated.push_back(input);
      if (k + 1 == n_generate) break;  // the last generated token is never fed back
      const int32_t pos = int32_t(prompt.size()) + int32_t(k);
      engine.evaluate(std::span<const int32_t>(&generated.back(), 1), pos, 0, false, logits);
      positions.push_back(position_entry(pos, input, logits.data(), n_vocab, o->top, order));
      next = positions.back()["argmax"].get<int32_t>();
    }

    json out = {{"format", "ref_dump/1"},
                {"model", std::filesystem::path(o->engine.model_path).filename().string()},
                {"n_vocab", n_vocab},
                {"teacher_forced", teacher_forced},
                {"prompt_tokens", prompt},
                {"generated_tokens", generated},
                {"positions", positions}};
    std::ofstream file(o->out);
    if (!file) fail("{}: cannot write", o->out);
    file << out.dump() << "\n";
    if (!file) fail("{}: write failed", o->out);
  });
}

}  // namespace tandem::cli
