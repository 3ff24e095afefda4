// Reading OpenAI request bodies: what is accepted and how it maps to a CompletionRequest, and
// the 400s with the parameter named. The HTTP level is tested from Node (hostile_requests).
#include <gtest/gtest.h>

#include <memory>

#include "gguf/gguf_file.h"
#include "server/api_error.h"
#include "server/openai_request.h"
#include "test_support.h"
#include "text/tokenizer.h"

namespace tandem::server {
namespace {

class OpenAiRequest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ = new Tokenizer(
        Tokenizer::from_gguf(gguf::GgufFile::open(test::fixture("small-v2-Q4_K_M.gguf").string())));
  }
  static void TearDownTestSuite() { delete tokenizer_; }
  PromptContext context(int32_t default_max_tokens = 0) const {
    return {.tokenizer = *tokenizer_, .chat_template = ChatTemplateKind::DeepSeekV3, .n_ctx = 64,
            .default_max_tokens = default_max_tokens};
  }
  // The parameter an invalid chat body is rejected for.
  std::string rejected_param(const std::string& body) const {
    try {
      parse_chat_request(body, context());
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      return e.param();
    }
    return "(accepted)";
  }
  static Tokenizer* tokenizer_;
};
Tokenizer* OpenAiRequest::tokenizer_ = nullptr;

TEST_F(OpenAiRequest, ChatMessagesBecomeTheTemplatedPrompt) {
  const ParsedRequest r = parse_chat_request(
      R"({"model": "m", "messages": [{"role": "developer", "content": "Be brief."},
          {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}],
          "temperature": 0.5, "top_k": 7, "seed": 42, "stop": "x", "stream": true,
          "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3, "unknown": [1]})",
      context());
  const std::vector<int32_t> expected = tokenizer_->encode(
      "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi!<｜Assistant｜>", {.add_bos = false, .parse_special = true});
  EXPECT_EQ(r.completion.prompt, expected);
  EXPECT_EQ(r.model, "m");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.completion.top_logprobs, 3);
  EXPECT_FLOAT_EQ(r.completion.options.sampling.temperature, 0.5f);
  EXPECT_EQ(r.completion.options.sampling.top_k, 7);
  EXPECT_EQ(r.completion.options.sampling.seed, 42u);
  EXPECT_EQ(r.completion.options.stop, std::vector<std::string>{"x"});
}

TEST_F(OpenAiRequest, MaxTokensIsClampedToTheContextLeftAndDefaultsToIt) {
  const std::string messages = R"("messages": [{"role": "user", "content": "Hi"}])";
  const ParsedRequest none = parse_chat_request("{" + messages + "}", context());
  const int64_t room = 64 - int64_t(none.completion.prompt.size());
  EXPECT_EQ(none.completion.options.max_tokens, room);
  EXPECT_EQ(parse_chat_request("{" + messages + R"(, "max_tokens": 5})", context()).completion.options.max_tokens, 5);
  EXPECT_EQ(parse_chat_request("{" + messages + R"(, "max_tokens": 100000})", context()).completion.options.max_tokens,
            room);
  EXPECT_EQ(parse_chat_request("{" + messages + R"(, "max_completion_tokens": 3, "max_tokens": 9})", context())
                .completion.options.max_tokens,
            3);
  EXPECT_EQ(parse_chat_request("{" + messages + "}", context(10)).completion.options.max_tokens, 10);
}

TEST_F(OpenAiRequest, WrongValuesAreRejectedNamingTheField) {
  const std::string m = R"("messages": [{"role": "user", "content": "Hi"}])";
  EXPECT_EQ(rejected_param("{" + m + R"(, "temperature": 3})"), "temperature");
  EXPECT_EQ(rejected_param("{" + m + R"(, "top_p": 0})"), "top_p");
  EXPECT_EQ(rejected_param("{" + m + R"(, "max_tokens": -2})"), "max_tokens");
  EXPECT_EQ(rejected_param("{" + m + R"(, "max_tokens": 1.5})"), "max_tokens");
  EXPECT_EQ(rejected_param("{" + m + R"(, "n": 0})"), "n");
  const std::string tools = R"(, "tools": [{"type": "function", "function": {"name": "f"}}])";
  EXPECT_EQ(rejected_param("{" + m + R"(, "tools": [{"type": "function", "function": {}}]})"),
            "tools[0].function.name");
  EXPECT_EQ(rejected_param("{" + m + tools + R"(, "tool_choice": "g"})"), "tool_choice");
  EXPECT_NO_THROW(parse_chat_request("{" + m + tools + R"(, "tool_choice": "none"})", context()));
  EXPECT_EQ(rejected_param("{" + m + R"(, "n": 1.5})"), "n");
  EXPECT_EQ(rejected_param("{" + m + R"(, "stop": [1]})"), "stop");
  EXPECT_EQ(rejected_param("{" + m + R"(, "seed": "s"})"), "seed");
  EXPECT_EQ(rejected_param(R"({"messages": [{"role": "robot", "content": "Hi"}]})"), "messages[0].role");
  EXPECT_EQ(rejected_param(R"({"messages": [{"role": "user", "content": {"a": 1}}]})"), "messages[0].content");
  EXPECT_EQ(rejected_param(R"({"messages": []})"), "messages");
  EXPECT_EQ(rejected_param(R"({"messages": [{"role": "user", "content": ")" + std::string(400, 'a') + R"("}]})"),
            "messages");
  EXPECT_EQ(rejected_param("not json"), "");
}

TEST_F(OpenAiRequest, CompletionPromptsAreTextOrTokenIds) {
  const ParsedRequest text = parse_completion_request(R"({"prompt": "Once upon", "logprobs": 2})", context());
  EXPECT_EQ(text.completion.prompt, tokenizer_->encode("Once upon", {.add_bos = tokenizer_->add_bos_by_default()}));
  EXPECT_EQ(text.completion.top_logprobs, 2);
  const ParsedRequest ids = parse_completion_request(R"({"prompt": [5, 6, 7]})", context());
  EXPECT_EQ(ids.completion.prompt, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(ids.completion.top_logprobs, -1);
  EXPECT_THROW(parse_completion_request(R"({"prompt": [5, -1]})", context()), ApiError);
  EXPECT_THROW(parse_completion_request(R"({"prompt": ["a", "b"]})", context()), ApiError);
  EXPECT_THROW(parse_completion_request(R"({"prompt": "x", "logprobs": 6})", context()), ApiError);
}

}  // namespace
}  // namespace tandem::server
