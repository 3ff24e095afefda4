// The tokenizer against the MoE-architecture fixtures (../shared/fixtures/README-archs.md section
// 10): 240 strings with the full Qwen3 (qwen2 pre-tokenizer) and gpt-oss (o200k) vocabularies and
// with the reduced vocabularies inside the qwen3moe, gpt-oss and glm4moe models, in all four
// modes; the model references' prompts. A case the fixtures mark as disputed (the model's own
// tokenizer disagrees with the reference implementation) may match either answer.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "test_support.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

using Ids = std::vector<int32_t>;

struct Case {
  int id = 0;
  std::string text;
  Ids bos_special, bos_nospecial, nobos_special, nobos_nospecial;
  std::optional<Ids> disputed;  // the model's own tokenizer's answer where the two disagree
};

std::vector<Case> read_cases(const std::string& name) {
  const nlohmann::json doc = nlohmann::json::parse(test::read_text_file(test::fixture(name)));
  std::map<int, Ids> other;
  if (doc.contains("disagreements"))
    for (const auto& d : doc.at("disagreements"))
      other[d.at("id").get<int>()] = d.at("transformers_js").get<Ids>();
  std::vector<Case> cases;
  for (const auto& item : doc.at("items")) {
    Case c{item.at("id").get<int>(),
           item.at("text").get<std::string>(),
           item.at("bos_special").get<Ids>(),
           item.at("bos_nospecial").get<Ids>(),
           item.at("nobos_special").get<Ids>(),
           item.at("nobos_nospecial").get<Ids>()};
    if (item.value("transformers_js_agrees", true) == false && other.count(c.id))
      c.disputed = other[c.id];
    cases.push_back(std::move(c));
  }
  return cases;
}

// Every case in every mode: "bos" modes ask for the vocabulary's own default (none of these adds
// a BOS, so both lists are equal). Reports each difference; returns how many there were.
int count_mismatches(const Tokenizer& tok, const std::vector<Case>& cases) {
  int mismatches = 0;
  const bool bos = tok.add_bos_by_default();
  for (const Case& c : cases) {
    const struct {
      const char* mode;
      EncodeOptions options;
      const Ids& expected;
    } modes[] = {
        {"bos_special", {.add_bos = bos, .parse_special = true}, c.bos_special},
        {"bos_nospecial", {.add_bos = bos, .parse_special = false}, c.bos_nospecial},
        {"nobos_special", {.add_bos = false, .parse_special = true}, c.nobos_special},
        {"nobos_nospecial", {.add_bos = false, .parse_special = false}, c.nobos_nospecial},
    };
    for (const auto& m : modes) {
      const Ids got = tok.encode(c.text, m.options);
      if (got == m.expected || (c.disputed && got == *c.disputed)) continue;
      ++mismatches;
      ADD_FAILURE() << "case " << c.id << " (" << m.mode << ") text '" << c.text << "'\n"
                    << "  expected " << ::testing::PrintToString(m.expected) << "\n"
                    << "  got      " << ::testing::PrintToString(got);
    }
  }
  return mismatches;
}

Tokenizer load(const std::string& gguf) {
  return Tokenizer::from_gguf(gguf::GgufFile::open(test::fixture(gguf).string()));
}

TEST(TokenizerArchFixtures, FullQwen3VocabularyMatchesAllCases) {
  const Tokenizer tok = load("tokenizer-qwen3.gguf");
  EXPECT_EQ(tok.n_vocab(), 151936);
  EXPECT_EQ(tok.pre_tokenizer().name(), "qwen2");
  EXPECT_FALSE(tok.add_bos_by_default());
  const std::vector<Case> cases = read_cases("tokenizer-cases-qwen3.json");
  ASSERT_EQ(cases.size(), 240u);
  EXPECT_EQ(count_mismatches(tok, cases), 0);
}

TEST(TokenizerArchFixtures, FullGptOssVocabularyMatchesAllCases) {
  const Tokenizer tok = load("tokenizer-gpt-oss.gguf");
  EXPECT_EQ(tok.n_vocab(), 201088);
  EXPECT_EQ(tok.pre_tokenizer().name(), "gpt-4o");
  const std::vector<Case> cases = read_cases("tokenizer-cases-gpt-oss.json");
  ASSERT_EQ(cases.size(), 240u);
  EXPECT_EQ(count_mismatches(tok, cases), 0);
}

TEST(TokenizerArchFixtures, ReducedVocabulariesMatchAllCases) {
  for (const auto& [gguf, cases] :
       {std::pair{"qwen3moe-micro-F32.gguf", "tokenizer-cases-qwen3moe-small-vocab.json"},
        std::pair{"gpt-oss-micro-F32.gguf", "tokenizer-cases-gpt-oss-small-vocab.json"},
        std::pair{"glm4moe-micro-F32.gguf", "tokenizer-cases-glm4moe-small-vocab.json"}}) {
    SCOPED_TRACE(gguf);
    const Tokenizer tok = load(gguf);
    const std::vector<Case> list = read_cases(cases);
    ASSERT_EQ(list.size(), 240u);
    EXPECT_EQ(count_mismatches(tok, list), 0);
  }
}

TEST(TokenizerArchFixtures, ModelReferencePromptsReproduce) {
  for (const std::string arch : {"qwen3moe", "gpt-oss", "glm4moe"}) {
    const Tokenizer tok = load(arch + "-micro-F32.gguf");
    for (const std::string prompt : {"p1", "p2", "chat"}) {
      const std::string name = arch + "-micro-F32." + prompt + ".json";
      const nlohmann::json ref = nlohmann::json::parse(test::read_text_file(test::fixture(name)));
      // p1 and p2 without special tokens, the chat prompt with (fixtures README section 6).
      const EncodeOptions options{.add_bos = false, .parse_special = prompt == "chat"};
      EXPECT_EQ(tok.encode(ref.at("prompt").get<std::string>(), options),
                ref.at("prompt_tokens").get<Ids>())
          << name;
    }
  }
}

}  // namespace
}  // namespace tandem
