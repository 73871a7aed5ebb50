// A model's chat template (issue 23 §2): tokenizer_config.json's `chat_template` with the special tokens it
// is rendered with, rendered as Hugging Face's apply_chat_template(messages, tokenize=False) renders it,
// through crescent's Jinja renderer (jinja/template.h; checked against python3-jinja2 on the real Llama 3
// and Qwen 3 templates in tests/model/chat_template_test.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "jinja/template.h"

namespace crescent::model {

/// A model's chat template (tokenizer_config.json's chat_template) with its special tokens.
class ChatTemplate {
 public:
  /// Loads tokenizer_config.json at `path`. Errors (kInvalidArgument) start with the path: not JSON, no
  /// chat_template, a template that does not parse (named construct, line). A chat_template given as a list
  /// of {name, template} uses the one named "default" (an error when there is none, as in Hugging Face).
  static Result<ChatTemplate> load(const std::string& tokenizer_config_path);

  /// A template from its source and the tokenizer_config.json object whose special tokens it renders with;
  /// `where` starts error messages (a path). Errors as load().
  static Result<ChatTemplate> from_source(const std::string& source, const nlohmann::json& tokenizer_config,
                                          const std::string& where);

  /// Renders OpenAI `messages` (a JSON array of {role, content, ...}) as HF's
  /// apply_chat_template(tokenize=False) does. `extra`: more variables (e.g. {"enable_thinking": false});
  /// `tools` and `documents` are None unless `extra` gives them, as apply_chat_template passes them. The
  /// template sees messages as given; objects keep their key order with ordered_json (tojson shows it).
  /// Errors (kInvalidArgument) name what is wrong: raise_exception's message, an unsupported construct, a
  /// message that is not an object, `extra` not an object or naming `messages` or `add_generation_prompt`.
  Result<std::string> render(const nlohmann::json& messages, bool add_generation_prompt,
                             const nlohmann::json& extra = nlohmann::json::object()) const;
  Result<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  /// The strings of the tokenizer's special tokens (tokenizer_config.json's added_tokens_decoder entries
  /// with special true, and the named ones: bos_token, eos_token, ..., additional_special_tokens), longest
  /// first: text that would pass for the template's own markup ("<|im_start|>") if a message held it.
  const std::vector<std::string>& special_token_strings() const { return special_token_strings_; }

  /// Where the template came from (a path), for messages.
  const std::string& where() const { return where_; }

 private:
  ChatTemplate(jinja::Template tmpl, nlohmann::ordered_json special_tokens, std::vector<std::string> strings,
               std::string where)
      : template_(std::move(tmpl)),
        special_tokens_(std::move(special_tokens)),
        special_token_strings_(std::move(strings)),
        where_(std::move(where)) {}

  template <typename Json>
  Result<std::string> render_json(const Json& messages, bool add_generation_prompt, const Json& extra) const;

  jinja::Template template_;
  nlohmann::ordered_json special_tokens_;  // the variables HF's special_tokens_map gives: name -> string/list
  std::vector<std::string> special_token_strings_;
  std::string where_;
};

/// The chat template of model directory `dir`: DIR/tokenizer_config.json's, std::nullopt when the directory
/// has no such file or it has no chat_template. DIR/chat_template.jinja, when present, replaces the config's
/// template (as transformers loads it), with the config's special tokens. Errors as ChatTemplate::load.
Result<std::optional<ChatTemplate>> load_model_chat_template(const std::string& dir);

}  // namespace crescent::model
