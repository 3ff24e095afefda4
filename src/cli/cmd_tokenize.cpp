// `tandem tokenize MODEL TEXT`: token ids and pieces of a text, with the model's tokenizer only
// (no weights are loaded).
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "gguf/gguf_file.h"
#include "text/tokenizer.h"

namespace tandem::cli {

void register_tokenize(CLI::App& app) {
  struct Options {
    std::string model, text;
    bool no_bos = false, special = false, json = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids and pieces of a text");
  cmd->add_option("model", o->model, "GGUF model (only its tokenizer is read)")->required();
  cmd->add_option("text", o->text, "text to tokenize")->required();
  cmd->add_flag("--no-bos", o->no_bos, "do not add the BOS token the metadata asks for");
  cmd->add_flag("--special", o->special, "parse special tokens such as <｜User｜> in the text");
  cmd->add_flag("--json", o->json, "print {\"tokens\": [...], \"pieces\": [...]}");
  cmd->callback([o] {
    const gguf::GgufFile file = gguf::GgufFile::open(o->model);
    const Tokenizer tokenizer = Tokenizer::from_gguf(file);
    const std::vector<int32_t> ids = tokenizer.encode(
        o->text, {.add_bos = tokenizer.add_bos_by_default() && !o->no_bos, .parse_special = o->special});
    if (o->json) {
      nlohmann::json pieces = nlohmann::json::array();
      for (int32_t id : ids) pieces.push_back(std::string(tokenizer.token_text(id)));
      fmt::print("{}\n", nlohmann::json{{"tokens", ids}, {"pieces", pieces}}.dump());
      return;
    }
    for (int32_t id : ids) {
      // The piece as bytes, with control characters escaped so every token shows on one line.
      std::string shown;
      for (char c : tokenizer.token_to_piece(id, /*render_special=*/true))
        shown += (uint8_t(c) < 0x20 || c == 0x7f) ? fmt::format("\\x{:02x}", uint8_t(c)) : std::string(1, c);
      fmt::print("{:>8} '{}'\n", id, shown);
    }
    fmt::print("{} tokens\n", ids.size());
  });
}

}  // namespace tandem::cli
