// The OpenAI-compatible request and response shapes (docs/serving.md): parsing and
// validating /v1/completions and /v1/chat/completions bodies, and building the JSON answers, SSE chunks and
// errors. Pure functions over nlohmann::json, no I/O.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/logprobs.h"

namespace crescent::model {
class ChatTemplate;
}

namespace crescent::serve {

/// An API error: the HTTP status and the fields of the JSON body {"error": {message, type, param, code}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending request field, empty when none
  std::string code;   // machine-readable reason, empty when none

  /// 400 naming `param`.
  static ApiError bad_field(std::string param, std::string message);
};

/// The error body: {"error": {"message", "type", "param" (null when empty), "code" (null when empty)}}.
nlohmann::json to_json(const ApiError& error);

/// Which endpoint a request came to.
enum class Endpoint { kCompletions, kChatCompletions };

/// One chat message: role and its text (content given as a string or as text parts, joined).
struct ChatMessage {
  std::string role;
  std::string content;
};

/// A validated completion request (both endpoints).
struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  std::string prompt_text;                // completions: the prompt when given as text
  std::vector<int64_t> prompt_token_ids;  // completions: the prompt when given as token ids (used as given)
  bool prompt_is_token_ids = false;
  std::vector<ChatMessage> messages;  // chat
  std::optional<int64_t> max_tokens;  // most tokens to generate; absent: the endpoint's default
  int64_t min_tokens = 0;             // generate at least this many before a stop (vLLM extension)
  bool ignore_eos = false;            // generate exactly max_tokens (vLLM extension)
  bool stream = false;                // answer as server-sent events
  bool include_usage = false;         // stream_options.include_usage: a last chunk with usage
  std::optional<uint64_t> seed;       // sampling seed
  double temperature = 1.0;           // 0..2
  double top_p = 1.0;                 // (0, 1]
  std::vector<std::string> stop;      // stop strings (at most 4)
  /// Logprobs asked for: model::kNoLogprobs, or how many most likely alternatives each token's logprobs
  /// carry (0..model::kMaxTopLogprobs). Completions: `logprobs: N`; chat: `logprobs: true` with
  /// `top_logprobs: N` (0 when absent).
  int32_t top_logprobs = model::kNoLogprobs;
};

/// Parses and validates a request body (already parsed as JSON) for `endpoint`. Errors are 400s naming the
/// field: a body that is not an object, missing `model` / `prompt` / `messages`, wrong types, negative or
/// zero `max_tokens`, min_tokens above max_tokens, `n` other than 1, several prompts in one request,
/// stream_options without stream, temperature or top_p out of range, a stop string over 1,024 bytes, a chat
/// message without content (what its content may hold is chat_prompt's to check), logprobs out of range
/// (completions: `logprobs` an integer 0..20, no `top_logprobs`; chat: `logprobs` a boolean, `top_logprobs`
/// 0..20 and only with `logprobs: true`), and an OpenAI field this server does not implement asked for
/// (`echo`, `best_of`, `suffix`, penalties, `logit_bias`, `response_format` other than text, `tools`,
/// `functions`: code `unsupported`; their neutral values pass; with `refuse_unimplemented` false they pass
/// whatever their values, for a server that hands the body to an engine implementing them: router mode).
/// Whether the executor can give logprobs is the caller's to check. Other unknown fields are ignored (as the
/// OpenAI API does). Sets `error` and returns nullopt on failure.
std::optional<CompletionRequest> parse_completion_request(const nlohmann::json& body, Endpoint endpoint,
                                                          ApiError& error, bool refuse_unimplemented = true);

/// The text a chat request's messages become before tokenization with the mock's template: for each message
/// "<|role|>\n" + content + "\n", then "<|assistant|>\n".
std::string render_chat_prompt(const std::vector<ChatMessage>& messages);

/// The mock template's role markers, "<|system|>", "<|developer|>", "<|user|>", "<|assistant|>", "<|tool|>".
std::vector<std::string> mock_role_markers();

/// The prompt text of a chat request's messages. With `chat_template` (the served model's, issue 23 §2):
/// rendered as Hugging Face's apply_chat_template(messages, add_generation_prompt=True) renders it, each
/// message as {"role", "content"}. Without: the mock's template (render_chat_prompt). Text in a message that
/// would pass for the template's own markup, and so for a turn of another role, is refused with a 400 on
/// `messages[i].content`: the mock's role markers ("<|user|>"), or any of the model's special tokens
/// ("<|im_start|>", "<|eot_id|>"). A template that fails (raise_exception: "roles must alternate") is a 400
/// on `messages` carrying its message. Sets `error` and returns nullopt on failure.
std::optional<std::string> chat_prompt(const std::vector<ChatMessage>& messages,
                                       const model::ChatTemplate* chat_template, ApiError& error);

/// Token counts for the `usage` object; cached_tokens is the prompt's prefix hit
/// (usage.prompt_tokens_details.cached_tokens).
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};
nlohmann::json to_json(const Usage& usage);

/// Identity of one answer: id ("cmpl-…" or "chatcmpl-…"), creation time (Unix seconds), model.
struct ResponseHeader {
  std::string id;
  int64_t created = 0;
  std::string model;
};

/// One generated token's logprobs as an answer shows them: tokens as their bytes
/// (model::Tokenizer::token_bytes).
struct TokenLogprobsText {
  std::string token;                                    // the sampled token's bytes
  float logprob = 0;                                    // natural log, <= 0
  std::vector<std::pair<std::string, float>> top = {};  // the most likely tokens' bytes, most likely first
};

/// A choice's `logprobs` object for consecutive generated tokens `tokens` (one streamed chunk's, or a whole
/// answer's). Completions (OpenAI's legacy shape): {"tokens", "token_logprobs", "top_logprobs": one
/// {token: logprob} object per token, the alternatives and the sampled token (up to N + 1 keys; a token
/// text seen twice keeps its first, most likely, value), "text_offset": where each token's text starts in
/// the answer, in characters, counted from `text_offset` (advanced past these tokens)}. Chat: {"content":
/// [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}. A token's text is its
/// bytes, each byte that is not part of valid UTF-8 written "\xNN" (as OpenAI does; `bytes` are exact). A
/// logprob below -9999 (or -inf) is shown as -9999, as vLLM does.
nlohmann::json logprobs_json(Endpoint endpoint, std::span<const TokenLogprobsText> tokens,
                             int64_t& text_offset);

/// The whole (non-streamed) answer: a text_completion or a chat.completion object with one choice.
/// finish_reason: "stop" or "length"; `logprobs`: the choice's (null when not asked for).
nlohmann::json completion_response(Endpoint endpoint, const ResponseHeader& header, std::string_view text,
                                   std::string_view finish_reason, const Usage& usage,
                                   nlohmann::json logprobs = nullptr);

/// One streamed chunk (text_completion or chat.completion.chunk) carrying `text`; the chat endpoint's first
/// chunk also carries the role (`first`); `finish_reason` empty means null; `logprobs`: those of the tokens
/// this chunk carries (null when not asked for, or none).
nlohmann::json stream_chunk(Endpoint endpoint, const ResponseHeader& header, std::string_view text,
                            bool first, std::string_view finish_reason, nlohmann::json logprobs = nullptr);
/// The last chunk with `include_usage`: empty choices and the usage.
nlohmann::json usage_chunk(Endpoint endpoint, const ResponseHeader& header, const Usage& usage);

/// "data: " + json + "\n\n", the SSE framing of one chunk.
std::string sse_event(const nlohmann::json& chunk);
/// "data: [DONE]\n\n".
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace crescent::serve
