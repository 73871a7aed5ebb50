#include "model/chat_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/json_util.h"

namespace crescent::model {
namespace {

// transformers' SPECIAL_TOKENS_ATTRIBUTES: what apply_chat_template passes the template besides messages
// (its special_tokens_map: each attribute that is set, as a string; additional_special_tokens as a list).
constexpr const char* kSpecialTokenAttributes[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                                   "pad_token", "cls_token", "mask_token"};

// A token as tokenizer_config.json writes it: a string, or an AddedToken object {"content": ...}.
std::optional<std::string> token_text(const nlohmann::json& token) {
  if (token.is_string()) return token.get<std::string>();
  if (token.is_object() && token.contains("content") && token["content"].is_string()) {
    return token["content"].get<std::string>();
  }
  return std::nullopt;
}

nlohmann::ordered_json special_tokens_of(const nlohmann::json& config) {
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  if (!config.is_object()) return tokens;
  for (const char* name : kSpecialTokenAttributes) {
    if (!config.contains(name)) continue;
    const std::optional<std::string> text = token_text(config[name]);
    if (text && !text->empty()) tokens[name] = *text;
  }
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& t : config["additional_special_tokens"]) {
      if (const auto text = token_text(t)) list.push_back(*text);
    }
    if (!list.empty()) tokens["additional_special_tokens"] = std::move(list);
  }
  return tokens;
}

std::vector<std::string> special_strings_of(const nlohmann::json& config,
                                            const nlohmann::ordered_json& named) {
  std::vector<std::string> out;
  if (config.is_object() && config.contains("added_tokens_decoder") &&
      config["added_tokens_decoder"].is_object()) {
    for (const auto& [id, token] : config["added_tokens_decoder"].items()) {
      if (token.is_object() && token.value("special", false)) {
        if (const auto text = token_text(token)) out.push_back(*text);
      }
    }
  }
  for (const auto& [name, value] : named.items()) {
    if (value.is_string()) out.push_back(value.get<std::string>());
    if (value.is_array()) {
      for (const auto& t : value) out.push_back(t.get<std::string>());
    }
  }
  std::sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() > b.size() : a < b;
  });
  out.erase(std::unique(out.begin(), out.end()), out.end());
  out.erase(std::remove(out.begin(), out.end(), std::string()), out.end());
  return out;
}

// tokenizer_config.json's chat_template: a string, or a list of {name, template} whose "default" is used.
Result<std::string> template_source(const nlohmann::json& config, const std::string& path) {
  const nlohmann::json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    std::vector<std::string> names;
    for (const auto& entry : t) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
          !entry.contains("template") || !entry["template"].is_string()) {
        return Status::invalid_argument(fmt::format(
            "{}: chat_template: a list entry is not {{\"name\": string, \"template\": string}}", path));
      }
      if (entry["name"] == "default") return entry["template"].get<std::string>();
      names.push_back(entry["name"].get<std::string>());
    }
    return Status::invalid_argument(
        fmt::format("{}: chat_template: several named templates ({}) and none named 'default'", path,
                    fmt::join(names, ", ")));
  }
  return Status::invalid_argument(
      fmt::format("{}: chat_template must be a string or a list of named templates", path));
}

Result<nlohmann::json> read_config(const std::string& path) {
  auto config = read_json_file(path);
  if (!config.ok()) return Status::invalid_argument(config.status().message());
  if (!config->is_object()) return Status::invalid_argument(fmt::format("{}: not a JSON object", path));
  return config;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::from_source(const std::string& source,
                                               const nlohmann::json& tokenizer_config,
                                               const std::string& where) {
  auto parsed = jinja::Template::parse(source);
  if (!parsed.ok()) {
    return Status::invalid_argument(fmt::format("{}: chat_template: {}", where, parsed.status().message()));
  }
  nlohmann::ordered_json named = special_tokens_of(tokenizer_config);
  std::vector<std::string> strings = special_strings_of(tokenizer_config, named);
  return ChatTemplate(std::move(*parsed), std::move(named), std::move(strings), where);
}

Result<ChatTemplate> ChatTemplate::load(const std::string& tokenizer_config_path) {
  auto config = read_config(tokenizer_config_path);
  if (!config.ok()) return config.status();
  if (!config->contains("chat_template") || (*config)["chat_template"].is_null()) {
    return Status::invalid_argument(fmt::format("{}: no chat_template", tokenizer_config_path));
  }
  auto source = template_source(*config, tokenizer_config_path);
  if (!source.ok()) return source.status();
  return from_source(*source, *config, tokenizer_config_path);
}

template <typename Json>
Result<std::string> ChatTemplate::render_json(const Json& messages, bool add_generation_prompt,
                                              const Json& extra) const {
  if (!messages.is_array()) return Status::invalid_argument("messages must be a JSON array");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) {
      return Status::invalid_argument(fmt::format("messages[{}] is not a JSON object", i));
    }
  }
  if (!extra.is_object())
    return Status::invalid_argument("the extra template variables must be a JSON object");
  for (const char* reserved : {"messages", "add_generation_prompt"}) {
    if (extra.contains(reserved)) {
      return Status::invalid_argument(fmt::format("the extra template variables cannot set '{}'", reserved));
    }
  }
  // apply_chat_template: render(messages=..., tools=..., documents=..., add_generation_prompt=...,
  // **{**special_tokens_map, **kwargs}).
  Json variables = Json::object();
  for (const auto& [name, value] : special_tokens_.items()) variables[name] = value;
  variables["tools"] = nullptr;
  variables["documents"] = nullptr;
  for (const auto& [name, value] : extra.items()) variables[name] = value;
  variables["messages"] = messages;
  variables["add_generation_prompt"] = add_generation_prompt;
  auto text = template_.render(variables);
  if (!text.ok())
    return Status::invalid_argument(fmt::format("{}: chat_template: {}", where_, text.status().message()));
  return text;
}

Result<std::string> ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                         const nlohmann::json& extra) const {
  return render_json(messages, add_generation_prompt, extra);
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                         const nlohmann::ordered_json& extra) const {
  return render_json(messages, add_generation_prompt, extra);
}

Result<std::optional<ChatTemplate>> load_model_chat_template(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "tokenizer_config.json").string();
  const std::string jinja_path = (fs::path(dir) / "chat_template.jinja").string();
  nlohmann::json config = nlohmann::json::object();
  const bool has_config = fs::exists(config_path);
  if (has_config) {
    auto read = read_config(config_path);
    if (!read.ok()) return read.status();
    config = std::move(*read);
  }
  if (fs::exists(jinja_path)) {
    std::ifstream in(jinja_path, std::ios::binary);
    if (!in) return Status::invalid_argument(fmt::format("{}: cannot open file", jinja_path));
    std::stringstream source;
    source << in.rdbuf();
    auto t = ChatTemplate::from_source(source.str(), config, jinja_path);
    if (!t.ok()) return t.status();
    return std::optional<ChatTemplate>(std::move(*t));
  }
  if (!has_config || !config.contains("chat_template") || config["chat_template"].is_null()) {
    return std::optional<ChatTemplate>();
  }
  auto source = template_source(config, config_path);
  if (!source.ok()) return source.status();
  auto t = ChatTemplate::from_source(*source, config, config_path);
  if (!t.ok()) return t.status();
  return std::optional<ChatTemplate>(std::move(*t));
}

}  // namespace crescent::model
