// `tandem inspect MODEL`: what a GGUF file holds — architecture, hyperparameters, tokenizer,
// every tensor, and bytes per weight group and per format. `--json` for scripts.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "core/progress.h"
#include "gguf/gguf_file.h"
#include "model/model_shapes.h"
#include "model/weight_groups.h"
#include "text/chat_template.h"

namespace tandem::cli {
namespace {

using nlohmann::ordered_json;

// Arrays this long (token lists, merges) are summarized, never dumped.
constexpr size_t kMaxListedItems = 16;

ordered_json value_to_json(const gguf::Value& value) {
  if (const std::string* s = value.as_string()) return *s;
  if (const gguf::Array* array = value.as_array()) {
    if (array->items.size() > kMaxListedItems)
      return {{"array_of", gguf::value_type_name(array->elem_type)}, {"length", array->items.size()}};
    ordered_json items = ordered_json::array();
    for (const gguf::Value& item : array->items) items.push_back(value_to_json(item));
    return items;
  }
  if (auto b = value.as_bool()) return *b;
  if (value.type() == gguf::ValueType::F32 || value.type() == gguf::ValueType::F64) return *value.as_number();
  if (auto i = value.as_int()) return *i;
  if (auto u = value.as_uint()) return *u;
  return nullptr;
}

bool is_tokenizer_key(const std::string& key) { return key.rfind("tokenizer.", 0) == 0; }

struct TokenizerSummary {
  std::string model, pre;
  uint64_t n_tokens = 0, n_merges = 0;
  std::map<std::string, uint64_t> type_counts;  // "normal" -> count
  std::optional<int64_t> bos, eos;
  std::string bos_text, eos_text;
  bool add_bos = false;
  uint64_t chat_template_chars = 0;
  std::string chat_template_style;
};

std::string token_type_name(int64_t type) {
  switch (type) {
    case 1: return "normal";
    case 2: return "unknown";
    case 3: return "control";
    case 4: return "user-defined";
    case 5: return "unused";
    case 6: return "byte";
    default: return "undefined";
  }
}

TokenizerSummary summarize_tokenizer(const gguf::GgufFile& file) {
  TokenizerSummary t;
  t.model = file.get_string_or("tokenizer.ggml.model", "");
  t.pre = file.get_string_or("tokenizer.ggml.pre", "");
  const gguf::Value* tokens = file.find("tokenizer.ggml.tokens");
  const gguf::Array* token_list = tokens ? tokens->as_array() : nullptr;
  if (token_list) t.n_tokens = token_list->items.size();
  if (const gguf::Value* merges = file.find("tokenizer.ggml.merges"); merges && merges->as_array())
    t.n_merges = merges->as_array()->items.size();
  if (const gguf::Value* types = file.find("tokenizer.ggml.token_type"); types && types->as_array())
    for (const gguf::Value& type : types->as_array()->items) ++t.type_counts[token_type_name(type.as_int().value_or(0))];
  auto token_text = [&](int64_t id) -> std::string {
    if (!token_list || id < 0 || uint64_t(id) >= token_list->items.size()) return "(out of range)";
    const std::string* s = token_list->items[size_t(id)].as_string();
    return s ? *s : "";
  };
  if (file.find("tokenizer.ggml.bos_token_id")) {
    t.bos = file.get_int("tokenizer.ggml.bos_token_id");
    t.bos_text = token_text(*t.bos);
  }
  if (file.find("tokenizer.ggml.eos_token_id")) {
    t.eos = file.get_int("tokenizer.ggml.eos_token_id");
    t.eos_text = token_text(*t.eos);
  }
  t.add_bos = file.get_bool_or("tokenizer.ggml.add_bos_token", false);
  const std::string chat_template = file.get_string_or("tokenizer.chat_template", "");
  t.chat_template_chars = chat_template.size();
  if (const std::optional<ChatTemplateKind> kind = detect_chat_template(chat_template))
    t.chat_template_style = std::string(chat_template_name(*kind));
  else if (!chat_template.empty())
    t.chat_template_style = "not recognised";
  return t;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string text;
  for (uint64_t d : shape) text += (text.empty() ? "" : " x ") + std::to_string(d);
  return text;
}

void print_text(const gguf::GgufFile& file, const std::string& arch,
                const std::optional<ModelShape>& shape, const std::string& hparams_error,
                const TokenizerSummary& tok, const WeightBytes& bytes, bool show_tensors) {
  fmt::print("file:         {}{}\n", file.name(),
             file.paths().size() > 1 ? fmt::format(" ({} parts)", file.paths().size()) : "");
  fmt::print("format:       GGUF v{}, alignment {}, {} on disk, {} of tensors\n", file.version(),
             file.alignment(), format_bytes(file.total_file_bytes()), format_bytes(bytes.total_bytes));
  fmt::print("architecture: {}\n", arch);
  fmt::print("\nmetadata:\n");
  for (const auto& [key, value] : file.metadata())
    if (!is_tokenizer_key(key)) fmt::print("  {:<48} {}\n", key, value.to_display());
  if (shape) {
    fmt::print("\nderived:\n");
    for (const std::string& line : shape->describe()) fmt::print("  {}\n", line);
  } else if (!hparams_error.empty()) {
    fmt::print("\nhyperparameters: {}\n", hparams_error);
  }
  fmt::print("\ntokenizer:    {} (pre-tokenizer {}), {} tokens", tok.model.empty() ? "none" : tok.model,
             tok.pre.empty() ? "default" : tok.pre, tok.n_tokens);
  std::string types;
  for (const auto& [name, count] : tok.type_counts) types += (types.empty() ? "" : ", ") + fmt::format("{} {}", count, name);
  fmt::print("{}, {} merges\n", types.empty() ? "" : " (" + types + ")", tok.n_merges);
  if (tok.bos) fmt::print("  BOS {} {}{}\n", *tok.bos, tok.bos_text, tok.add_bos ? " (added)" : "");
  if (tok.eos) fmt::print("  EOS {} {}\n", *tok.eos, tok.eos_text);
  if (tok.chat_template_chars)
    fmt::print("  chat template: {} characters, {}\n", tok.chat_template_chars, tok.chat_template_style);

  if (show_tensors) {
    fmt::print("\ntensors ({}):\n", file.tensors().size());
    fmt::print("  {:<36} {:<22} {:<6} {:>14}\n", "name", "shape", "format", "bytes");
    for (const gguf::TensorInfo& t : file.tensors())
      fmt::print("  {:<36} {:<22} {:<6} {:>14}\n", t.name, shape_text(t.shape), dtype_name(t.type), t.n_bytes);
  }
  fmt::print("\nbytes per weight group:\n");
  for (int g = 0; g < kWeightGroupCount; ++g) {
    if (bytes.group_tensors[size_t(g)] == 0) continue;
    fmt::print("  {:<16} {:>5} tensors {:>12} {:>6.2f}%\n", weight_group_name(WeightGroup(g)),
               bytes.group_tensors[size_t(g)], format_bytes(bytes.group_bytes[size_t(g)]),
               100.0 * double(bytes.group_bytes[size_t(g)]) / double(std::max<uint64_t>(1, bytes.total_bytes)));
  }
  fmt::print("\nbytes per format:\n");
  for (const auto& [format, n] : bytes.format_bytes)
    fmt::print("  {:<16} {:>5} tensors {:>12} {:>6.2f}%\n", format, bytes.format_tensors.at(format),
               format_bytes(n), 100.0 * double(n) / double(std::max<uint64_t>(1, bytes.total_bytes)));
}

ordered_json hparams_json(const ModelShape& shape) {
  ordered_json out = ordered_json::object();
  for (const HparamField& f : shape.fields())
    out[f.name] = f.word.empty() ? ordered_json(f.number) : ordered_json(f.word);
  const ModelInfo info = shape.info();
  out["kv_cache_values_per_token_per_layer"] = info.kv.empty() ? 0 : info.kv.front().row_floats();
  return out;
}

void print_json(const gguf::GgufFile& file, const std::string& arch,
                const std::optional<ModelShape>& shape, const std::string& hparams_error,
                const TokenizerSummary& tok, const WeightBytes& bytes) {
  ordered_json out;
  out["paths"] = file.paths();
  out["gguf_version"] = file.version();
  out["alignment"] = file.alignment();
  out["file_bytes"] = file.total_file_bytes();
  out["tensor_bytes"] = bytes.total_bytes;
  out["architecture"] = arch;
  ordered_json metadata = ordered_json::object();
  for (const auto& [key, value] : file.metadata()) metadata[key] = value_to_json(value);
  out["metadata"] = metadata;
  if (shape)
    out["hparams"] = hparams_json(*shape);
  else if (!hparams_error.empty()) out["hparams_error"] = hparams_error;
  out["tokenizer"] = {{"model", tok.model}, {"pre", tok.pre}, {"n_tokens", tok.n_tokens},
                      {"n_merges", tok.n_merges}, {"token_types", tok.type_counts},
                      {"bos_token_id", tok.bos ? ordered_json(*tok.bos) : ordered_json(nullptr)},
                      {"eos_token_id", tok.eos ? ordered_json(*tok.eos) : ordered_json(nullptr)},
                      {"add_bos_token", tok.add_bos},
                      {"chat_template_chars", tok.chat_template_chars},
                      {"chat_template_style", tok.chat_template_style}};
  ordered_json tensors = ordered_json::array();
  for (const gguf::TensorInfo& t : file.tensors())
    tensors.push_back(
        {{"name", t.name},
         {"shape", t.shape},
         {"type", dtype_name(t.type)},
         {"bytes", t.n_bytes},
         {"file", t.file_index},
         {"offset", t.file_offset},
         {"group",
          weight_group_name(
              classify_tensor(t.name, shape ? shape->info().n_layer : UINT32_MAX).group)}});
  out["tensors"] = tensors;
  ordered_json groups = ordered_json::object();
  for (int g = 0; g < kWeightGroupCount; ++g)
    if (bytes.group_tensors[size_t(g)])
      groups[std::string(weight_group_name(WeightGroup(g)))] = {{"tensors", bytes.group_tensors[size_t(g)]},
                                                               {"bytes", bytes.group_bytes[size_t(g)]}};
  out["weight_groups"] = groups;
  ordered_json formats = ordered_json::object();
  for (const auto& [format, n] : bytes.format_bytes)
    formats[format] = {{"tensors", bytes.format_tensors.at(format)}, {"bytes", n}};
  out["formats"] = formats;
  fmt::print("{}\n", out.dump(2));
}

}  // namespace

void register_inspect(CLI::App& app) {
  struct Options {
    std::string model;
    bool json = false;
    bool no_tensors = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Show what a GGUF model holds: architecture, hyperparameters, tokenizer, tensors, "
                 "and bytes per weight group and format. Split models: pass the first part.");
  cmd->add_option("model", options->model, "GGUF file (first part of a split model)")->required();
  cmd->add_flag("--json", options->json, "print one JSON object instead of tables");
  cmd->add_flag("--no-tensors", options->no_tensors, "omit the per-tensor table");
  cmd->callback([options] {
    const gguf::GgufFile file = gguf::GgufFile::open(options->model);
    const std::string arch = file.get_string_or("general.architecture", "(none)");
    std::optional<ModelShape> shape;
    std::string hparams_error;
    try {
      shape = model_shape_of(file);
    } catch (const Error& e) {
      hparams_error = e.what();  // still show the rest: inspect is how people debug files
    }
    const uint32_t n_main_layers = shape ? shape->info().n_layer : UINT32_MAX;
    const WeightBytes bytes = count_weight_bytes(file, n_main_layers);
    const TokenizerSummary tok = summarize_tokenizer(file);
    if (options->json)
      print_json(file, arch, shape, hparams_error, tok, bytes);
    else
      print_text(file, arch, shape, hparams_error, tok, bytes, !options->no_tensors);
  });
}

}  // namespace tandem::cli
