// Tool calls in each family's syntax (DeepSeek V3/R1 and V3.1, Qwen3, GLM-4.5): replies split
// into text and calls (a section that does not parse whole stays text), the streamable part of a
// reply held back at a possible marker, and the grammar of a required call: a random writer that
// only takes allowed bytes always writes one call that parses back, names a tool and has
// arguments of its parameters.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "text/tool_calls.h"

namespace tandem {
namespace {

constexpr auto kV3 = ChatTemplateKind::DeepSeekV3;
const std::string kCall = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>";

std::string call_text(const std::string& name, const std::string& args) {
  return kCall + name + "\n```json\n" + args + "\n```<｜tool▁call▁end｜>";
}

TEST(ToolCalls, RepliesSplitIntoTextAndCalls) {
  const std::string reply = "Let me check." + std::string("<｜tool▁calls▁begin｜>") +
                            call_text("get_weather", R"({"city": "Paris"})") + "\n" +
                            call_text("f", "{}") + "<｜tool▁calls▁end｜>";
  const ToolReply r = parse_tool_reply(kV3, reply);
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.calls[1].name, "f");
  // Cut short after a whole call (max_tokens, end of generation): the call counts.
  EXPECT_EQ(parse_tool_reply(kV3, "<｜tool▁calls▁begin｜>" + call_text("f", "{}")).calls.size(),
            1u);
}

TEST(ToolCalls, ASectionThatDoesNotParseWholeStaysText) {
  for (const std::string& bad :
       {"<｜tool▁calls▁begin｜>" + call_text("f", "{not json"),
        "<｜tool▁calls▁begin｜>" + call_text("f", "[1]"),     // arguments are an object
        "<｜tool▁calls▁begin｜>" + kCall + "f\n```json\n{}",  // no end
        std::string("no calls at all")}) {
    const ToolReply r = parse_tool_reply(kV3, "x" + bad);
    EXPECT_TRUE(r.calls.empty()) << bad;
    EXPECT_EQ(r.content, "x" + bad);
  }
}

TEST(ToolCalls, StreamingHoldsBackWhatMayBecomeTheMarker) {
  EXPECT_EQ(tool_section_start(kV3, "Hello"), 5u);
  EXPECT_EQ(tool_section_start(kV3, "Hello <｜tool"), 6u);
  EXPECT_EQ(tool_section_start(kV3, "Hi<｜tool▁calls▁begin｜>more"), 2u);
  EXPECT_EQ(tool_section_start(kV3, "a < b"), 5u);
}

TEST(ToolCalls, Qwen3CallsAreJsonInToolCallTags) {
  const auto kQwen3 = ChatTemplateKind::Qwen3;
  const std::string call =
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [\"x\"]}}\n</tool_call>";
  const ToolReply r = parse_tool_reply(kQwen3, "Sure.\n" + call + "\n" + call);
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "f");
  EXPECT_EQ(r.calls[1].arguments, R"({"a":1,"b":["x"]})");  // compact, keys in their order
  EXPECT_TRUE(
      parse_tool_reply(kQwen3, "<tool_call>\n{\"name\": \"f\"}\n</tool_call>").calls.empty());
  EXPECT_TRUE(
      parse_tool_reply(kQwen3, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}").calls.empty());
  EXPECT_EQ(tool_section_start(kQwen3, "ok <tool_c"), 3u);
}

TEST(ToolCalls, R1TakesV3sSyntaxAndV31ItsOwn) {
  const std::string v3 = "<｜tool▁calls▁begin｜>" + call_text("f", "{}") + "<｜tool▁calls▁end｜>";
  EXPECT_EQ(parse_tool_reply(ChatTemplateKind::DeepSeekR1, v3).calls.size(), 1u);
  const auto kV31 = ChatTemplateKind::DeepSeekV31;
  const std::string v31 =
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": "
      "\"Oslo\"}"
      "<｜tool▁call▁end｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><"
      "｜tool▁calls▁end｜>";
  const ToolReply r = parse_tool_reply(kV31, v31);
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Oslo"})");
  EXPECT_EQ(r.calls[1].name, "f");
  // Each syntax is text to the other.
  EXPECT_TRUE(parse_tool_reply(kV31, v3).calls.empty());
  EXPECT_TRUE(parse_tool_reply(kV3, v31).calls.empty());
  EXPECT_EQ(parse_tool_reply(kV31, v3).content, v3);
  EXPECT_EQ(tool_section_start(kV31, "Sure.<｜tool▁ca"), 5u);
}

// GLM-4.5: key/value tags, strings raw; the tool's parameters say which values are strings.
TEST(ToolCalls, GlmArgumentsAreTypedByTheToolsParameters) {
  const auto kGlm = ChatTemplateKind::Glm45;
  auto schema = std::make_shared<JsonSchema>();
  const int32_t text =
      schema->add({.kind = JsonSchemaNode::Kind::String, .min_length = 0, .max_length = -1});
  schema->add({.kind = JsonSchemaNode::Kind::Object,
               .names = {"code", "n"},
               .properties = {text, JsonSchema::kAnyValue}});
  const std::vector<ToolSpec> tools = {
      {.name = "f", .description = "", .parameters_json = "{}", .parameters = schema}};
  const std::string reply =
      "Let me see.\n<tool_call>f\n<arg_key>code</arg_key>\n<arg_value>12</arg_value>\n"
      "<arg_key>n</arg_key>\n<arg_value>12</arg_value>\n</tool_call>\n<tool_call>g\n"
      "<arg_key>x</arg_key>\n<arg_value>a b</arg_value>\n<arg_key>y</arg_key>\n"
      "<arg_value>[1, {\"z\": null}]</arg_value>\n</tool_call>";
  const ToolReply r = parse_tool_reply(kGlm, reply, tools);
  EXPECT_EQ(r.content, "Let me see.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "f");
  EXPECT_EQ(r.calls[0].arguments, R"({"code":"12","n":12})");
  // A tool not offered: values that parse as JSON are JSON, the rest strings.
  EXPECT_EQ(r.calls[1].arguments, R"({"x":"a b","y":[1,{"z":null}]})");
  EXPECT_EQ(parse_tool_reply(kGlm, "<tool_call>f\n</tool_call>", tools).calls[0].arguments, "{}");
  for (const std::string& bad :
       {std::string("<tool_call>f\n<arg_key>code</arg_key>\n<arg_value>1"),  // no end
        std::string("<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>1</arg_value>\n"
                    "<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"),  // twice
        std::string("<tool_call>\n</tool_call>")}) {                                  // no name
    const ToolReply kept = parse_tool_reply(kGlm, "x" + bad, tools);
    EXPECT_TRUE(kept.calls.empty()) << bad;
    EXPECT_EQ(kept.content, "x" + bad);
  }
  EXPECT_EQ(tool_section_start(kGlm, "ok <tool"), 3u);
}

// An enum's strings are written raw (no JSON escapes) and read back as the same member.
TEST(ToolCalls, GlmEnumStringsAreWrittenRaw) {
  auto schema = std::make_shared<JsonSchema>();
  const int32_t quote = schema->add(
      {.kind = JsonSchemaNode::Kind::Literals, .literals = {"\"say \\\"hi\\\"\"", "\"x\""}});
  schema->add({.kind = JsonSchemaNode::Kind::Object,
               .names = {"k"},
               .properties = {quote},
               .required = 0b1});
  auto tools = std::make_shared<std::vector<ToolSpec>>(std::vector<ToolSpec>{
      {.name = "f", .description = "", .parameters_json = "{}", .parameters = schema}});
  const std::string call =
      "<tool_call>f\n<arg_key>k</arg_key>\n<arg_value>say \"hi\"</arg_value>\n</tool_call>";
  const std::unique_ptr<OutputConstraint> grammar = one_tool_call(ChatTemplateKind::Glm45, tools);
  ASSERT_TRUE(grammar->feed(call));
  EXPECT_TRUE(grammar->complete());
  EXPECT_EQ(parse_tool_reply(ChatTemplateKind::Glm45, call, *tools).calls.at(0).arguments,
            R"({"k":"say \"hi\""})");
}

TEST(ToolCalls, ToolsAreListedAsPythonsJsonDumpsWritesThem) {
  const auto tool = nlohmann::ordered_json::parse(R"({"z": [1, 2.5, "x\"é"], "a": {}, "n": null})");
  EXPECT_EQ(python_json(tool), R"({"z": [1, 2.5, "x\"é"], "a": {}, "n": null})");
}

TEST(ToolCalls, OtherTemplatesRefuseTools) {
  EXPECT_FALSE(supports_tool_calls(ChatTemplateKind::Harmony));
  EXPECT_FALSE(supports_tool_calls(ChatTemplateKind::KimiK2));
  EXPECT_THROW(parse_tool_reply(ChatTemplateKind::Harmony, "x"), std::exception);
}

std::shared_ptr<const std::vector<ToolSpec>> weather_tools() {
  auto tools = std::make_shared<std::vector<ToolSpec>>();
  auto weather = std::make_shared<JsonSchema>();
  const int32_t city =
      weather->add({.kind = JsonSchemaNode::Kind::String, .min_length = 1, .max_length = 12});
  const int32_t unit =
      weather->add({.kind = JsonSchemaNode::Kind::Literals, .literals = {"\"c\"", "\"f\""}});
  weather->add({.kind = JsonSchemaNode::Kind::Object,
                .names = {"city", "unit"},
                .properties = {city, unit},
                .required = 0b1});
  tools->push_back({.name = "get_weather",
                    .description = "Weather now",
                    .parameters_json = "{}",
                    .parameters = weather});
  tools->push_back({.name = "get_time",
                    .description = "",
                    .parameters_json = "{}",
                    .parameters = std::make_shared<JsonSchema>(JsonSchema::any_object())});
  return tools;
}

TEST(ToolCalls, ARequiredCallAlwaysParsesBackWithArgumentsOfItsTool) {
  for (const ChatTemplateKind kind :
       {kV3, ChatTemplateKind::DeepSeekR1, ChatTemplateKind::DeepSeekV31, ChatTemplateKind::Qwen3,
        ChatTemplateKind::Glm45}) {
    SCOPED_TRACE(chat_template_name(kind));
    const auto tools = weather_tools();
    std::mt19937 rng(3);
    std::string alphabet;
    for (int c = 0x20; c < 0x100; ++c) alphabet += char(c);  // every byte is a token of its own
    alphabet += '\n';
    int weather_calls = 0;
    for (int round = 0; round < 60; ++round) {
      const std::unique_ptr<OutputConstraint> call = one_tool_call(kind, tools);
      const int64_t budget = call->min_remaining() + round;
      std::string out;
      int64_t tokens = 0;  // a byte or a whole marker each
      const std::unique_ptr<OutputConstraint> trial = call->clone();
      while (!call->complete()) {
        // Any byte the grammar takes within the budget; the markers come whole, as their tokens do.
        std::vector<std::string> allowed;
        std::vector<std::string> candidates;
        for (char c : alphabet) candidates.push_back(std::string(1, c));
        for (const char* marker : {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",
                                   "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"})
          if (call->takes_control_tokens()) candidates.push_back(marker);
        for (const std::string& bytes : candidates) {
          trial->copy_from(*call);
          if (trial->feed(bytes) &&
              (trial->complete() || trial->min_remaining() <= budget - tokens - 1))
            allowed.push_back(bytes);
        }
        ASSERT_FALSE(allowed.empty()) << out;
        const std::string& bytes =
            allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
        ASSERT_TRUE(call->feed(bytes));
        out += bytes;
        ++tokens;
      }
      EXPECT_LE(tokens, budget) << out;
      const ToolReply reply = parse_tool_reply(kind, out, *tools);
      ASSERT_EQ(reply.calls.size(), 1u) << out;
      EXPECT_EQ(reply.content, "");
      const nlohmann::json args = nlohmann::json::parse(reply.calls[0].arguments);
      if (reply.calls[0].name == "get_weather") {
        ++weather_calls;
        EXPECT_TRUE(args.contains("city") && args["city"].is_string()) << out;
        for (const auto& [key, value] : args.items())
          EXPECT_TRUE(key == "city" || key == "unit") << out;
      } else {
        EXPECT_EQ(reply.calls[0].name, "get_time");
        EXPECT_TRUE(args.is_object());
      }
    }
    EXPECT_GT(weather_calls, 0);
  }
}

// DeepSeek's markers are one token each in the budget: the shortest V3 call is
// <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜> (3 markers + 8 bytes),
// "get_time\n```json\n{}" (19), "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>" (4 + 2 markers).
TEST(ToolCalls, MarkersCountAsOneTokenInTheBudget) {
  EXPECT_EQ(one_tool_call(kV3, weather_tools())->min_remaining(), 11 + 19 + 6);
}

TEST(ToolCalls, TheSystemPromptListsEveryToolAndTheSyntax) {
  const auto tools = weather_tools();
  const std::string prompt = tool_system_prompt(kV3, *tools);
  EXPECT_NE(prompt.find("<｜tool▁calls▁begin｜>"), std::string::npos);
  EXPECT_NE(prompt.find(R"({"name":"get_weather","description":"Weather now","parameters":{}})"),
            std::string::npos);
  EXPECT_NE(prompt.find(R"({"name":"get_time","parameters":{}})"), std::string::npos);
  // V3.1's is the description its model card gives, parameters as Python's json.dumps writes them.
  auto v31_tools = *tools;
  v31_tools[0].parameters_json = R"({"type":"object","properties":{"city":{"type":"string"}}})";
  const std::string v31 = tool_system_prompt(ChatTemplateKind::DeepSeekV31, v31_tools);
  EXPECT_TRUE(v31.starts_with(
      "## Tools\nYou have access to the following tools:\n\n### get_weather\nDescription: Weather "
      "now\n\nParameters: {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
      "\"string\"}}}\n\n### get_time\n"))
      << v31;
  EXPECT_NE(v31.find("<｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
