#include "model/synthetic_vocabulary.h"

#include <fmt/format.h>

#include <unordered_set>

#include "core/error.h"
#include "gguf/gguf_writer.h"
#include "model/synthetic_corpus.h"
#include "text/bpe_trainer.h"
#include "text/byte_unicode.h"

namespace tandem {
namespace {

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

// Each family's special tokens, the first ones before the learned tokens (as their vocabularies
// number them: DeepSeek's BOS is 0), the rest after; and the ids the GGUF names.
struct Family {
  std::string_view pre;
  std::vector<std::pair<std::string_view, int32_t>> first, last;
  std::vector<std::pair<std::string_view, std::string_view>> ids;  // key suffix -> token text
  bool add_bos;
  std::string_view chat_template;
};

// Chat templates written for tandem's synthetic models: they carry each family's markers, so
// tandem recognises the family and renders its real template (text/chat_template.h).
constexpr std::string_view kDeepseekTemplate =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ message['content'] }}{% elif message['role'] == 'user' %}{{ '<｜User｜>' + "
    "message['content'] }}{% elif message['role'] == 'assistant' %}{{ '<｜Assistant｜>' + "
    "message['content'] + '<｜end▁of▁sentence｜>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}";
constexpr std::string_view kQwen3Template =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- "
    "'<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false "
    "%}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";
constexpr std::string_view kHarmonyTemplate =
    "{%- for message in messages %}{{- '<|start|>' + message.role + '<|channel|>final<|message|>' "
    "+ message.content + '<|end|>' }}{%- endfor %}{%- if add_generation_prompt %}<|start|>assistant"
    "{%- endif %}";
constexpr std::string_view kGlmTemplate =
    "[gMASK]<sop>{%- for m in messages %}{{ '<|' + m.role + '|>\\n' + m.content }}{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{%- endif %}";

const Family& family(std::string_view arch) {
  static const Family deepseek{"deepseek-v3",
                               {{"<｜begin▁of▁sentence｜>", kControl},
                                {"<｜end▁of▁sentence｜>", kControl},
                                {"<｜▁pad▁｜>", kControl}},
                               {{"<｜fim▁hole｜>", kControl},
                                {"<｜fim▁begin｜>", kControl},
                                {"<｜fim▁end｜>", kControl},
                                {"<｜User｜>", kControl},
                                {"<｜Assistant｜>", kControl},
                                {"<|EOT|>", kControl}},
                               {{"bos", "<｜begin▁of▁sentence｜>"},
                                {"eos", "<｜end▁of▁sentence｜>"},
                                {"padding", "<｜▁pad▁｜>"}},
                               true,
                               kDeepseekTemplate};
  static const Family qwen{
      "qwen2",
      {},
      {{"<|endoftext|>", kControl},
       {"<|im_start|>", kControl},
       {"<|im_end|>", kControl},
       {"<tool_call>", kUserDefined},
       {"</tool_call>", kUserDefined},
       {"<think>", kUserDefined},
       {"</think>", kUserDefined}},
      {{"bos", "<|endoftext|>"}, {"eos", "<|im_end|>"}, {"padding", "<|endoftext|>"}},
      false,
      kQwen3Template};
  static const Family harmony{
      "gpt-4o",
      {},
      {{"<|startoftext|>", kControl},
       {"<|endoftext|>", kControl},
       {"<|return|>", kControl},
       {"<|constrain|>", kControl},
       {"<|channel|>", kControl},
       {"<|start|>", kControl},
       {"<|end|>", kControl},
       {"<|message|>", kControl},
       {"<|call|>", kControl}},
      {{"bos", "<|startoftext|>"}, {"eos", "<|return|>"}, {"padding", "<|endoftext|>"}},
      false,
      kHarmonyTemplate};
  static const Family glm{"glm4",
                          {},
                          {{"<|endoftext|>", kControl},
                           {"[gMASK]", kControl},
                           {"<sop>", kControl},
                           {"<|system|>", kControl},
                           {"<|user|>", kControl},
                           {"<|assistant|>", kControl},
                           {"<|observation|>", kControl},
                           {"<think>", kUserDefined},
                           {"</think>", kUserDefined}},
                          {{"bos", "[gMASK]"},
                           {"eos", "<|endoftext|>"},
                           {"eot", "<|user|>"},
                           {"eom", "<|observation|>"},
                           {"padding", "<|endoftext|>"}},
                          false,
                          kGlmTemplate};
  if (arch == "qwen3moe") return qwen;
  if (arch == "gpt-oss") return harmony;
  if (arch == "glm4moe") return glm;
  return deepseek;
}

}  // namespace

SyntheticVocabulary synthetic_vocabulary(std::string_view arch, uint32_t n_vocab) {
  const Family& f = family(arch);
  SyntheticVocabulary v;
  v.pre = f.pre;
  v.add_bos = f.add_bos;
  v.chat_template = f.chat_template;
  auto add = [&](std::string text, int32_t type) {
    v.tokens.push_back(std::move(text));
    v.types.push_back(type);
  };
  for (const auto& [text, type] : f.first) add(std::string(text), type);
  for (uint8_t byte : byte_alphabet_order()) add(utf8_encode(byte_to_codepoint(byte)), kNormal);
  const BpeVocabulary learned = train_byte_level_bpe(synthetic_tokenizer_corpus(), 4000);
  std::unordered_set<std::string> seen(v.tokens.begin(), v.tokens.end());
  for (const std::string& text : learned.merged_tokens)
    if (seen.insert(text).second) add(text, kNormal);
  v.merges = learned.merges;
  for (const auto& [text, type] : f.last) add(std::string(text), type);
  for (const auto& [key, text] : f.ids)
    for (size_t i = 0; i < v.tokens.size(); ++i)
      if (v.tokens[i] == text)
        v.special_ids.push_back({fmt::format("tokenizer.ggml.{}_token_id", key), int32_t(i)});
  if (n_vocab != 0) {
    if (n_vocab < v.tokens.size())
      fail("synthetic tokenizer has {} tokens, more than the preset's vocabulary of {}",
           v.tokens.size(), n_vocab);
    for (uint32_t i = 0; v.tokens.size() < n_vocab; ++i) add(fmt::format("[PAD{}]", i), kUnused);
  }
  return v;
}

void write_vocabulary(const SyntheticVocabulary& v, gguf::GgufWriter& writer) {
  writer.add_metadata("tokenizer.ggml.model", gguf::Value::string("gpt2"));
  writer.add_metadata("tokenizer.ggml.pre", gguf::Value::string(v.pre));
  writer.add_metadata("tokenizer.ggml.tokens", gguf::Value::string_array(v.tokens));
  writer.add_metadata("tokenizer.ggml.token_type", gguf::Value::i32_array(v.types));
  writer.add_metadata("tokenizer.ggml.merges", gguf::Value::string_array(v.merges));
  for (const SyntheticVocabulary::SpecialId& id : v.special_ids)
    writer.add_metadata(id.key, gguf::Value::u32(uint32_t(id.id)));
  writer.add_metadata("tokenizer.ggml.add_bos_token", gguf::Value::boolean(v.add_bos));
  writer.add_metadata("tokenizer.ggml.add_eos_token", gguf::Value::boolean(false));
  writer.add_metadata("tokenizer.chat_template", gguf::Value::string(v.chat_template));
}

}  // namespace tandem
