// A gpt-oss reply through everything the server does with it but the model's choice of tokens:
// the fixture's vocabulary (Harmony's headers are tokens of their own), OutputText one token at a
// time (the headers rendered as text, <|end|> closing a message but not the reply, <|return|>
// ending it) and the ReasoningSplitter on its pieces, as http_server.cpp calls them. The fixture
// models have random weights and never write a Harmony reply themselves
// (tests/server/model_families.test.mjs checks the server's wiring with what they do write).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "runtime/output_text.h"
#include "test_support.h"
#include "text/reasoning.h"
#include "text/tokenizer.h"

namespace tandem {
namespace {

struct Reply {
  std::string reasoning, content;
  bool ended = false;  // an end-of-generation token stopped it
};

Reply run_reply(const Tokenizer& tok, const std::string& text) {
  const std::vector<int32_t> ids = tok.encode(text, {.add_bos = false, .parse_special = true});
  OutputText output(tok, {});
  ReasoningSplitter splitter(ReasoningFormat::Harmony, /*in_reasoning=*/false);
  Reply r;
  auto add = [&](const ReasoningSplitter::Delta& d) {
    r.reasoning += d.reasoning;
    r.content += d.content;
  };
  for (int32_t id : ids) {
    add(splitter.push(output.push(id)));
    if (output.finished()) break;
  }
  if (!output.finished()) add(splitter.push(output.finish()));
  add(splitter.finish());
  r.ended = output.finished();
  return r;
}

class HarmonyReply : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = std::make_unique<gguf::GgufFile>(
        gguf::GgufFile::open(test::fixture("gpt-oss-micro-F32.gguf").string()));
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file_));
  }
  std::unique_ptr<gguf::GgufFile> file_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(HarmonyReply, AnalysisIsReasoningFinalIsTheAnswerAndReturnEndsIt) {
  const Reply r = run_reply(*tok_,
                            "<|channel|>analysis<|message|>The user greets us. Answer briefly."
                            "<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I "
                            "help?<|return|>ignored after the end");
  EXPECT_TRUE(r.ended);
  EXPECT_EQ(r.reasoning, "The user greets us. Answer briefly.");
  EXPECT_EQ(r.content, "Hello! How can I help?");
}

TEST_F(HarmonyReply, EndClosesAMessageWithoutEndingTheReply) {
  const std::vector<int32_t> end =
      tok_->encode("<|end|>", {.add_bos = false, .parse_special = true});
  ASSERT_EQ(end.size(), 1u);
  EXPECT_FALSE(tok_->is_end_of_generation(end[0]));
  const std::vector<int32_t> ret =
      tok_->encode("<|return|>", {.add_bos = false, .parse_special = true});
  ASSERT_EQ(ret.size(), 1u);
  EXPECT_TRUE(tok_->is_end_of_generation(ret[0]));
}

TEST_F(HarmonyReply, AReplyWithoutHeadersIsAllAnswer) {
  const Reply r = run_reply(*tok_, "Just text, no channel.<|return|>");
  EXPECT_TRUE(r.ended);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Just text, no channel.");
}

}  // namespace
}  // namespace tandem
