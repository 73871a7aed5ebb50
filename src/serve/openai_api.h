// The OpenAI-compatible request and response shapes (docs/serving.md): parsing and
// validating /v1/completions and /v1/chat/completions bodies, and building the JSON answers, SSE chunks and
// errors. Pure functions over nlohmann::json, no I/O.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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
};

/// Parses and validates a request body (already parsed as JSON) for `endpoint`. Errors are 400s naming the
/// field: a body that is not an object, missing `model` / `prompt` / `messages`, wrong types, negative or
/// zero `max_tokens`, min_tokens above max_tokens, `n` other than 1, several prompts in one request,
/// stream_options without stream, temperature or top_p out of range, a stop string over 1,024 bytes, a chat
/// message without content or holding a role marker of the template (render_chat_prompt), and an OpenAI
/// field this server does not implement asked for (`echo`, `logprobs`, `top_logprobs`, `best_of`, `suffix`,
/// penalties, `logit_bias`, `response_format` other than text, `tools`, `functions`: code `unsupported`;
/// their neutral values pass). Other unknown fields are ignored (as the OpenAI API does). Sets `error` and
/// returns nullopt on failure.
std::optional<CompletionRequest> parse_completion_request(const nlohmann::json& body, Endpoint endpoint,
                                                          ApiError& error);

/// The text a chat request's messages become before tokenization: for each message "<|role|>\n" + content +
/// "\n", then "<|assistant|>\n" (the mock model's template; a real model's comes with its tokenizer).
std::string render_chat_prompt(const std::vector<ChatMessage>& messages);

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

/// The whole (non-streamed) answer: a text_completion or a chat.completion object with one choice.
/// finish_reason: "stop" or "length".
nlohmann::json completion_response(Endpoint endpoint, const ResponseHeader& header, std::string_view text,
                                   std::string_view finish_reason, const Usage& usage);

/// One streamed chunk (text_completion or chat.completion.chunk) carrying `text`; the chat endpoint's first
/// chunk also carries the role (`first`); `finish_reason` empty means null.
nlohmann::json stream_chunk(Endpoint endpoint, const ResponseHeader& header, std::string_view text,
                            bool first, std::string_view finish_reason);
/// The last chunk with `include_usage`: empty choices and the usage.
nlohmann::json usage_chunk(Endpoint endpoint, const ResponseHeader& header, const Usage& usage);

/// "data: " + json + "\n\n", the SSE framing of one chunk.
std::string sse_event(const nlohmann::json& chunk);
/// "data: [DONE]\n\n".
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace crescent::serve
