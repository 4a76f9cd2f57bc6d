// Chat templates: the model's own, and the built-in renderers.
#include "engine/chat_template.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace hr::engine {

Result<ChatFormat> detect_chat_format(const std::string& t, const std::string& override_name) {
  if (!override_name.empty()) {
    if (override_name == "headroom") return ChatFormat::kHeadroom;
    if (override_name == "llama3") return ChatFormat::kLlama3;
    if (override_name == "chatml") return ChatFormat::kChatMl;
    if (override_name == "mistral") return ChatFormat::kMistral;
    return invalid_argument(
        "unknown chat template '" + override_name + "' (headroom, llama3, chatml, mistral)",
        "chat-template");
  }
  if (t.find("<|start_header_id|>") != std::string::npos) return ChatFormat::kLlama3;
  if (t.find("<|im_start|>") != std::string::npos) return ChatFormat::kChatMl;
  if (t.find("[INST]") != std::string::npos) return ChatFormat::kMistral;
  if (t.find("<|user|>") != std::string::npos && t.find("<|assistant|>") != std::string::npos) {
    return ChatFormat::kHeadroom;
  }
  return invalid_argument(
      "the model's chat_template is not one of the built-in formats; choose one with "
      "--chat-template (headroom, llama3, chatml, mistral)",
      "chat-template");
}

Result<ChatFormat> load_chat_format(const std::string& dir, const std::string& override_name) {
  std::string tmpl;
  std::ifstream in(dir + "/tokenizer_config.json");
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    auto j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (!j.is_discarded() && j.contains("chat_template") && j["chat_template"].is_string()) {
      tmpl = j["chat_template"];
    }
  }
  return detect_chat_format(tmpl, override_name);
}

Result<std::string> render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                                const std::string& bos, const std::string& eos) {
  if (messages.empty()) return invalid_argument("no messages", "messages");
  std::string out;
  switch (format) {
    case ChatFormat::kHeadroom:
      out = bos;
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "user") {
          out += "<|user|>" + m.content;
        } else if (m.role == "assistant") {
          out += "<|assistant|>" + m.content + eos;
        } else {
          return invalid_argument("this model's chat format has no '" + m.role + "' role",
                                  "messages[" + std::to_string(i) + "].role");
        }
      }
      out += "<|assistant|>";
      return out;
    case ChatFormat::kLlama3:
      out = "<|begin_of_text|>";
      for (const ChatMessage& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      }
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case ChatFormat::kChatMl:
      for (const ChatMessage& m : messages) {
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      }
      out += "<|im_start|>assistant\n";
      return out;
    case ChatFormat::kMistral: {
      out = bos;
      std::string system;
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "system") {
          system += m.content + "\n\n";
        } else if (m.role == "user") {
          out += "[INST] " + system + m.content + " [/INST]";
          system.clear();
        } else if (m.role == "assistant") {
          out += m.content + eos;
        } else {
          return invalid_argument("Mistral's chat format has no '" + m.role + "' role",
                                  "messages[" + std::to_string(i) + "].role");
        }
      }
      return out;
    }
  }
  return internal_error("unknown chat format");
}

namespace {

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The model's own template text, if its folder has one.
std::optional<std::string> own_template(const std::string& dir) {
  if (auto t = read_text(dir + "/chat_template.jinja")) return t;
  auto config = read_text(dir + "/tokenizer_config.json");
  if (!config) return std::nullopt;
  auto j = nlohmann::json::parse(*config, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  auto it = j.find("chat_template");
  if (it == j.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& named : *it) {
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string()) {
        return named["template"].get<std::string>();
      }
    }
  }
  return std::nullopt;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::load(const std::string& dir, const std::string& override_name) {
  if (!override_name.empty()) {
    HR_ASSIGN_OR_RETURN(ChatFormat f, detect_chat_format("", override_name));
    return builtin(f);
  }
  std::optional<std::string> text = own_template(dir);
  if (!text) {
    return invalid_argument(
        "the model folder has no chat template; choose a built-in one with --chat-template "
        "(headroom, llama3, chatml, mistral)",
        "chat-template");
  }
  Result<jinja::Template> t = jinja::Template::parse(*text);
  if (!t.is_ok()) return invalid_argument(t.status().message(), "chat-template");
  ChatTemplate out;
  out.jinja_ = std::move(t).value();
  out.tool_calls_ = detect_tool_call_format(*text);
  return out;
}

ChatTemplate ChatTemplate::builtin(ChatFormat format) {
  ChatTemplate out;
  out.format_ = format;
  return out;
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         const std::string& bos, const std::string& eos) const {
  if (!jinja_) return render_chat(format_, messages, bos, eos);
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  return render(list, nullptr, bos, eos);
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                         const nlohmann::ordered_json& tools,
                                         const std::string& bos, const std::string& eos) const {
  if (!messages.is_array() || messages.empty()) return invalid_argument("no messages", "messages");
  if (!jinja_) {
    if (!tools.is_null()) {
      return invalid_argument("this model's chat template does not take tools", "tools");
    }
    std::vector<ChatMessage> plain;
    for (size_t i = 0; i < messages.size(); ++i) {
      const auto& m = messages[i];
      if (m.contains("tool_calls") || m.contains("tool_call_id")) {
        return invalid_argument("this model's chat template does not take tool calls or results",
                                "messages[" + std::to_string(i) + "]");
      }
      plain.push_back({m.value("role", ""), m.value("content", "")});
    }
    return render_chat(format_, plain, bos, eos);
  }
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = messages;
  if (!tools.is_null()) context["tools"] = tools;
  context["add_generation_prompt"] = true;
  context["bos_token"] = bos;
  context["eos_token"] = eos;
  return jinja_->render(context);
}

}  // namespace hr::engine
