// What `--model DIR` or `--tokenizer FILE` names for the commands that turn prompts into token ids
// (`tokenize`, `trace import`): the model's tokenizer and its chat template.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

namespace crescent::cli {

/// A model's tokenizer and chat template, and where they came from (for messages).
struct PromptTokenizer {
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::optional<model::ChatTemplate> chat_template;  // none when the files have no chat_template
  /// "--model DIR" or "the directory of --tokenizer FILE".
  std::string source;
  /// Where the template is looked for: "DIR/tokenizer_config.json" (or "... beside it").
  std::string template_file;

  /// The error for `what` ("--chat", "chat messages") needing a template these files do not have.
  Status no_chat_template(std::string_view what) const;
};

/// Loads --model DIR's tokenizer (model::load_tokenizer, checked against DIR/config.json's vocab_size when
/// there is one) or --tokenizer FILE (a tokenizer.json), and the chat template of DIR or of FILE's directory
/// (model::load_model_chat_template). Exactly one of the two is non-empty. Errors (kInvalidArgument) name the
/// flag and file: not a directory, an unreadable tokenizer, a config.json or template that does not parse.
Result<PromptTokenizer> load_prompt_tokenizer(const std::string& model_dir, const std::string& tokenizer_file);

}  // namespace crescent::cli
