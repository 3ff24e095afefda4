#pragma once
// The tokenizer of synthetic models: byte-level BPE trained on built-in text, with the special
// tokens, pre-tokenizer, special ids and a chat template of the model family it stands for, so
// that tandem treats a synthetic qwen3moe, gpt-oss or glm4moe file as it treats the real ones
// (template detection, end of generation, reasoning markers).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {
namespace gguf {
class GgufWriter;
}

struct SyntheticVocabulary {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;  // tokenizer.ggml.token_type values
  std::vector<std::string> merges;
  std::string pre;            // tokenizer.ggml.pre
  std::string chat_template;  // a template with the family's markers, written for tandem
  struct SpecialId {
    std::string key;  // "tokenizer.ggml.bos_token_id"
    int32_t id;
  };
  std::vector<SpecialId> special_ids;
  bool add_bos = false;
};

// `arch` names the family (deepseek2, qwen3moe, gpt-oss, glm4moe); `n_vocab` 0 keeps the natural
// size, more pads with unused tokens as real vocabularies are padded. Throws when `n_vocab` is
// smaller than the tokens it needs.
SyntheticVocabulary synthetic_vocabulary(std::string_view arch, uint32_t n_vocab);

void write_vocabulary(const SyntheticVocabulary& vocabulary, gguf::GgufWriter& writer);

}  // namespace tandem
