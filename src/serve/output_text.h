// A request's output token ids → the text its client sees, token by token, with the OpenAI API's stops:
// what vLLM's detokenizer and stop checker do for a request.
//   - EOS (the tokenizer's, when it has one) ends the output, unless `ignore_eos`; its text is not shown.
//   - The first of the `stop` strings to appear ends it; the text ends before it (the stop is not shown).
//   - Neither counts before the `min_tokens`-th token (a stop string must end in a token that counts).
//   - Text handed out never ends inside a UTF-8 character, nor in a tail that may yet become a stop string:
//     such a tail is held back until the next tokens settle it (or flush()).
// Ended by either: finish_reason "stop"; otherwise the request runs to max_tokens: "length".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"

namespace crescent::serve {

/// How a request's output may end early (CompletionRequest's fields).
struct StopConditions {
  std::vector<std::string> stop = {};  // stop strings (empty ones are ignored)
  bool ignore_eos = false;
  int64_t min_tokens = 0;
};

class OutputText {
 public:
  OutputText(std::shared_ptr<const model::Tokenizer> tokenizer, StopConditions stops);

  /// Takes the next output tokens; returns the text that may go out now (possibly empty). Once stopped(),
  /// tokens are ignored.
  std::string add(std::span<const int64_t> tokens);
  /// The text still held back; call once, when the output ended. Empty when stopped (add handed out all).
  std::string flush();
  /// True once EOS or a stop string ended the output.
  bool stopped() const { return stopped_; }
  /// "stop" when stopped, else "length".
  std::string_view finish_reason() const { return stopped_ ? "stop" : "length"; }

 private:
  // Text from sent_ that may go out now: all of it when stopped, else up to a held tail.
  std::string take_ready();

  std::shared_ptr<const model::Tokenizer> tokenizer_;
  StopConditions stops_;
  std::optional<int64_t> eos_;
  int64_t tokens_ = 0;
  std::string text_;  // every shown byte so far (cut at the stop when stopped)
  size_t sent_ = 0;   // bytes of text_ handed out
  bool stopped_ = false;
};

/// Bytes at the start of `text` that end on a whole UTF-8 character: all of it unless it ends with the
/// first 1-3 bytes of a longer character (whose missing bytes may come next). Invalid bytes count as whole.
size_t utf8_complete_prefix(std::string_view text);

}  // namespace crescent::serve
