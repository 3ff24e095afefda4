// `tandem apply-template MODEL`: the prompt a conversation becomes with the model's chat template
// (llama.cpp's server has the same as POST /apply-template). Only the file's metadata is read.
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "gguf/gguf_file.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "text/tool_calls.h"

namespace tandem::cli {
namespace {

// Ordered: a tools list keeps its keys in the file's order, as templates render them.
using json = nlohmann::ordered_json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot read", path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
}

std::vector<ChatMessage> messages_of(const json& list, const std::string& where) {
  if (!list.is_array()) fail("{}: expected a list of messages", where);
  std::vector<ChatMessage> messages;
  for (const json& m : list) {
    // content may be null only beside tool_calls (an assistant turn that only calls tools).
    const bool calls = m.is_object() && m.contains("tool_calls") && m["tool_calls"].is_array();
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !(m["content"].is_string() || (calls && m["content"].is_null())))
      fail("{}: every message needs a string 'role' and 'content'", where);
    ChatMessage message{m["role"].get<std::string>(),
                        m["content"].is_string() ? m["content"].get<std::string>() : std::string()};
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
      message.reasoning_content = m["reasoning_content"].get<std::string>();
    if (calls) {
      message.content_is_null = m["content"].is_null();
      for (const json& c : m["tool_calls"]) {
        // Arguments as OpenAI's JSON text, or as an object (how GLM's template takes them).
        const json args =
            c.contains("function") ? c["function"].value("arguments", json()) : json();
        if (!c.contains("function") || !c["function"].value("name", json()).is_string() ||
            !(args.is_string() || args.is_object()))
          fail("{}: a tool call needs function.name and function.arguments (text or object)",
               where);
        message.tool_calls.push_back(
            {.id = c.value("id", std::string()),
             .name = c["function"]["name"].get<std::string>(),
             .arguments = args.is_string() ? args.get<std::string>() : python_json(args)});
      }
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

}  // namespace

void register_apply_template(CLI::App& app) {
  struct Options {
    std::string model, messages, cases, chat_template, thinking, date;
    std::string reasoning_effort = "medium";
    bool no_generation_prompt = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "apply-template", "Print the prompt a conversation becomes with the model's chat template");
  cmd->add_option("model", o->model, "GGUF model (only its metadata is read)")->required();
  cmd->add_option("--messages", o->messages,
                  "JSON file with the messages: [{\"role\": \"user\", \"content\": \"...\"}, ...]");
  cmd->add_option("--cases", o->cases,
                  "JSON file with conversations [{\"messages\": [...], \"add_generation_prompt\": "
                  "bool, \"kwargs\": {\"enable_thinking\": bool, \"reasoning_effort\": \"low\"}}]: "
                  "prints a JSON list of prompts");
  cmd->add_option("--chat-template", o->chat_template, kChatTemplateHelp);
  cmd->add_option("--thinking", o->thinking,
                  "on or off, for templates with a thinking switch "
                  "(default: the template's own)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--reasoning-effort", o->reasoning_effort, "gpt-oss: low, medium or high")
      ->check(CLI::IsMember({"low", "medium", "high"}))
      ->capture_default_str();
  cmd->add_option("--date", o->date, "gpt-oss's current date, YYYY-MM-DD (default: today, UTC)");
  cmd->add_flag("--no-generation-prompt", o->no_generation_prompt,
                "end with the last message instead of opening the assistant's reply");
  cmd->callback([o] {
    if (o->messages.empty() == o->cases.empty()) fail("give --messages FILE or --cases FILE");
    const gguf::GgufFile file = gguf::GgufFile::open(o->model);
    const ChatTemplateKind kind = choose_chat_template(file, o->chat_template);
    const Tokenizer tokenizer = Tokenizer::from_gguf(file);
    const std::string bos =
        tokenizer.bos_id() ? std::string(tokenizer.token_text(*tokenizer.bos_id())) : "";
    ChatOptions options{.add_generation_prompt = !o->no_generation_prompt,
                        .reasoning_effort = o->reasoning_effort,
                        .date = o->date};
    if (!o->thinking.empty()) options.enable_thinking = o->thinking == "on";
    if (!o->messages.empty()) {
      std::cout << apply_chat_template(kind, messages_of(read_json(o->messages), o->messages),
                                       options, bos);
      return;
    }
    const json cases = read_json(o->cases);
    if (!cases.is_array()) fail("{}: expected a list of conversations", o->cases);
    json out = json::array();
    for (const json& c : cases) {
      ChatOptions each = options;
      each.add_generation_prompt = c.value("add_generation_prompt", true);
      const json kwargs = c.value("kwargs", json::object());
      if (kwargs.contains("enable_thinking"))
        each.enable_thinking = kwargs["enable_thinking"].get<bool>();
      if (kwargs.contains("reasoning_effort"))
        each.reasoning_effort = kwargs["reasoning_effort"].get<std::string>();
      if (kwargs.contains("tools"))
        for (const json& tool : kwargs["tools"]) each.tools.push_back(python_json(tool));
      out.push_back(apply_chat_template(kind, messages_of(c.at("messages"), o->cases), each, bos));
    }
    std::cout << out.dump() << "\n";
  });
}

}  // namespace tandem::cli
