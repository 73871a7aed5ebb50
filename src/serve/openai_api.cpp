#include "serve/openai_api.h"

#include <fmt/format.h>

#include <array>
#include <limits>

#include "model/chat_template.h"

namespace crescent::serve {
namespace {

// Longest stop string taken: each token's check costs up to its length squared (serve/output_text.h).
constexpr size_t kMaxStopBytes = 1024;

using nlohmann::json;

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an integer";
  }
}

// Reads optional field `name` of `body` with `read`; false (error set) when present with the wrong type or
// value. A null value counts as absent, as the OpenAI API treats it.
template <typename Read>
bool optional_field(const json& body, const char* name, ApiError& error, Read read) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return true;
  return read(*it, error);
}

bool read_bool(const json& v, const char* name, bool& out, ApiError& error) {
  if (!v.is_boolean()) {
    error = ApiError::bad_field(name, fmt::format("'{}' must be a boolean, got {}", name, type_name(v)));
    return false;
  }
  out = v.get<bool>();
  return true;
}

bool read_int(const json& v, const char* name, int64_t min, int64_t& out, ApiError& error) {
  if (!v.is_number_integer()) {
    error = ApiError::bad_field(name, fmt::format("'{}' must be an integer, got {}", name, type_name(v)));
    return false;
  }
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    error = ApiError::bad_field(name, fmt::format("'{}' is too large: {}", name, v.dump()));
    return false;
  }
  out = v.get<int64_t>();
  if (out < min) {
    error = ApiError::bad_field(name, fmt::format("'{}' must be >= {}, got {}", name, min, out));
    return false;
  }
  return true;
}

bool read_number(const json& v, const char* name, double lo, double hi, bool lo_open, double& out,
                 ApiError& error) {
  if (!v.is_number()) {
    error = ApiError::bad_field(name, fmt::format("'{}' must be a number, got {}", name, type_name(v)));
    return false;
  }
  out = v.get<double>();
  if (!(lo_open ? out > lo : out >= lo) || !(out <= hi)) {
    error = ApiError::bad_field(
        name, fmt::format("'{}' must be in {}{}, {}], got {}", name, lo_open ? "(" : "[", lo, hi, out));
    return false;
  }
  return true;
}

bool read_prompt(const json& v, CompletionRequest& r, ApiError& error) {
  if (v.is_string()) {
    r.prompt_text = v.get<std::string>();
    return true;
  }
  if (v.is_array()) {
    // One prompt as token ids, or a one-element list of prompts (text or ids).
    if (v.size() == 1 && (v[0].is_string() || v[0].is_array())) return read_prompt(v[0], r, error);
    if (!v.empty() && (v[0].is_string() || v[0].is_array())) {
      error = ApiError::bad_field("prompt", fmt::format("several prompts in one request are not supported "
                                                        "(got {}); send one request per prompt",
                                                        v.size()));
      return false;
    }
    r.prompt_is_token_ids = true;
    r.prompt_token_ids.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer() || v[i].get<int64_t>() < 0) {
        error = ApiError::bad_field(
            "prompt", fmt::format("'prompt' as token ids must hold non-negative integers; element {} is {}",
                                  i, v[i].dump()));
        return false;
      }
      r.prompt_token_ids.push_back(v[i].get<int64_t>());
    }
    if (r.prompt_token_ids.empty()) {
      error = ApiError::bad_field("prompt", "'prompt' is empty");
      return false;
    }
    return true;
  }
  error = ApiError::bad_field(
      "prompt", fmt::format("'prompt' must be a string or an array of token ids, got {}", type_name(v)));
  return false;
}

// The mock template's marker of a turn of `role` (render_chat_prompt).
std::string role_marker(std::string_view role) {
  return fmt::format("<|{}|>", role);
}

bool read_messages(const json& v, CompletionRequest& r, ApiError& error) {
  if (!v.is_array() || v.empty()) {
    error = ApiError::bad_field("messages", "'messages' must be a non-empty array of {role, content}");
    return false;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const json& m = v[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      error = ApiError::bad_field(where, fmt::format("'{}' must be an object with a string 'role'", where));
      return false;
    }
    ChatMessage message{m["role"].get<std::string>(), ""};
    static constexpr std::string_view kRoles[] = {"system", "developer", "user", "assistant", "tool"};
    if (std::find(std::begin(kRoles), std::end(kRoles), message.role) == std::end(kRoles)) {
      error = ApiError::bad_field(where + ".role",
                                  fmt::format("'{}.role' must be system, developer, user, assistant or tool; "
                                              "got '{}'",
                                              where, message.role));
      return false;
    }
    const json content = m.value("content", json());
    if (content.is_string()) {
      message.content = content.get<std::string>();
    } else if (content.is_array()) {
      for (const json& part : content) {
        if (!part.is_object() || part.find("type") == part.end() || part["type"] != "text" ||
            !part.contains("text") ||
            !part["text"].is_string()) {
          error = ApiError::bad_field(
              where + ".content", fmt::format("'{}.content' parts must be {{\"type\": \"text\", \"text\": "
                                              "string}} (this model reads text only)",
                                              where));
          return false;
        }
        message.content += part["text"].get<std::string>();
      }
    } else {
      error = ApiError::bad_field(
          where + ".content", fmt::format("'{}.content' must be a string or an array of text parts, got {}",
                                          where, type_name(content)));
      return false;
    }
    r.messages.push_back(std::move(message));
  }
  return true;
}

json header_fields(const ResponseHeader& header, const char* object) {
  return {{"id", header.id}, {"object", object}, {"created", header.created}, {"model", header.model}};
}

json finish_value(std::string_view finish_reason) {
  return finish_reason.empty() ? json() : json(finish_reason);
}

// The one choice of an answer or chunk: {"index": 0, <field>: <content>, "logprobs", "finish_reason"}.
json one_choice(const char* field, json content, std::string_view finish_reason, json logprobs) {
  return {{"index", 0},
          {field, std::move(content)},
          {"logprobs", std::move(logprobs)},
          {"finish_reason", finish_value(finish_reason)}};
}

// Reads the logprobs fields into r.top_logprobs (parse_completion_request says what each endpoint takes).
bool read_logprobs(const json& body, CompletionRequest& r, ApiError& error) {
  const json none;
  auto it = body.find("logprobs");
  const json& logprobs = it == body.end() ? none : *it;
  it = body.find("top_logprobs");
  const json& top = it == body.end() ? none : *it;
  const std::string range = fmt::format("0 to {}", model::kMaxTopLogprobs);
  const auto in_range = [](const json& v) {
    return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= model::kMaxTopLogprobs &&
           !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(model::kMaxTopLogprobs));
  };
  if (r.endpoint == Endpoint::kCompletions) {
    // OpenAI's legacy `logprobs: N`: the sampled token's logprob and the N most likely (0: the sampled
    // token's only). false, as null, asks for nothing.
    if (!top.is_null() && !(top.is_number_integer() && top == 0)) {
      error = ApiError::bad_field("top_logprobs",
                                  "'top_logprobs' is a chat completions field; "
                                  "/v1/completions takes 'logprobs': N");
      return false;
    }
    if (logprobs.is_null() || (logprobs.is_boolean() && !logprobs.get<bool>())) return true;
    if (!in_range(logprobs)) {
      error = ApiError::bad_field(
          "logprobs", fmt::format("'logprobs' must be an integer from {}, got {}", range, logprobs.dump()));
      return false;
    }
    r.top_logprobs = logprobs.get<int32_t>();
    return true;
  }
  // Chat: `logprobs: true`, with `top_logprobs: N` alternatives (0 when absent).
  bool wanted = false;
  if (logprobs.is_boolean()) {
    wanted = logprobs.get<bool>();
  } else if (!logprobs.is_null() && !(logprobs.is_number_integer() && logprobs == 0)) {
    error = ApiError::bad_field("logprobs",
                                fmt::format("'logprobs' must be a boolean, got {}", type_name(logprobs)));
    return false;
  }
  if (!top.is_null() && !in_range(top)) {
    error = ApiError::bad_field(
        "top_logprobs", fmt::format("'top_logprobs' must be an integer from {}, got {}", range, top.dump()));
    return false;
  }
  const int32_t alternatives = top.is_null() ? 0 : top.get<int32_t>();
  if (!wanted) {
    if (alternatives > 0) {
      error = ApiError::bad_field("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      return false;
    }
    return true;
  }
  r.top_logprobs = alternatives;
  return true;
}

// Whether `bytes[at..]` starts with a whole, valid UTF-8 character; its length then.
size_t utf8_char_length(std::string_view bytes, size_t at) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const unsigned char lead = b(at);
  size_t n = 0;
  uint32_t min = 0;
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) {
    n = 2, min = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    n = 3, min = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    n = 4, min = 0x10000;
  } else {
    return 0;
  }
  if (at + n > bytes.size()) return 0;
  uint32_t code = lead & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) {
    if ((b(at + i) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (b(at + i) & 0x3F);
  }
  // Overlong forms, surrogates and beyond Unicode are not valid.
  if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return n;
}

// A token's text as the API shows it: its bytes, each byte outside valid UTF-8 as "\xNN"; and its length
// in characters.
std::pair<std::string, int64_t> token_text(std::string_view bytes) {
  std::string out;
  int64_t chars = 0;
  for (size_t at = 0; at < bytes.size(); ++chars) {
    if (const size_t n = utf8_char_length(bytes, at); n > 0) {
      out.append(bytes.substr(at, n));
      at += n;
    } else {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(bytes[at]));
      chars += 3;  // the escape's 4 characters
      ++at;
    }
  }
  return {std::move(out), chars};
}

// A logprob as shown: -9999 at the least (vLLM's floor: JSON has no -inf).
double shown(float logprob) {
  return std::max(static_cast<double>(logprob), -9999.0);
}

json byte_list(std::string_view bytes) {
  json out = json::array();
  for (const char c : bytes) out.push_back(static_cast<unsigned char>(c));
  return out;
}

}  // namespace

ApiError ApiError::bad_field(std::string param, std::string message) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

json to_json(const ApiError& error) {
  return {{"error",
           {{"message", error.message},
            {"type", error.type},
            {"param", error.param.empty() ? json() : json(error.param)},
            {"code", error.code.empty() ? json() : json(error.code)}}}};
}

// OpenAI fields crescent does not implement: a request that asks for one is refused (400 `unsupported`), not
// answered as if it had been honoured. Each with the values that ask for nothing (clients send defaults).
bool no_unsupported_fields(const json& body, ApiError& error) {
  const auto neutral = [](std::string_view name, const json& v) {
    if (v.is_null()) return true;
    if (name == "echo") return v.is_boolean() && !v.get<bool>();
    if (name == "best_of") return v.is_number_integer() && v == 1;
    if (name == "suffix") return v.is_string() && v.get_ref<const std::string&>().empty();
    if (name == "presence_penalty" || name == "frequency_penalty")
      return v.is_number() && v.get<double>() == 0;
    if (name == "repetition_penalty") return v.is_number() && v.get<double>() == 1;
    if (name == "response_format") return v.is_object() && v.size() == 1 && v.contains("type") && v["type"] == "text";
    return (v.is_array() || v.is_object()) && v.empty();  // logit_bias, tools, functions, tool_choice
  };
  static constexpr std::string_view kUnsupported[] = {"echo",
                                                      "best_of",
                                                      "suffix",
                                                      "presence_penalty",
                                                      "frequency_penalty",
                                                      "repetition_penalty",
                                                      "logit_bias",
                                                      "response_format",
                                                      "tools",
                                                      "tool_choice",
                                                      "functions",
                                                      "function_call"};
  for (std::string_view name : kUnsupported) {
    auto it = body.find(name);
    if (it == body.end() || neutral(name, *it)) continue;
    error = ApiError::bad_field(
        std::string(name), fmt::format("'{}' is not supported by this server (got {})", name, it->dump()));
    error.code = "unsupported";
    return false;
  }
  return true;
}

std::optional<CompletionRequest> parse_completion_request(const json& body, Endpoint endpoint,
                                                          ApiError& error, bool refuse_unimplemented) {
  if (!body.is_object()) {
    error = ApiError::bad_field(
        "", fmt::format("the request body must be a JSON object, got {}", type_name(body)));
    return std::nullopt;
  }
  CompletionRequest r;
  r.endpoint = endpoint;
  if (refuse_unimplemented && !no_unsupported_fields(body, error)) return std::nullopt;
  if (!read_logprobs(body, r, error)) return std::nullopt;
  auto model = body.find("model");
  if (model == body.end() || !model->is_string()) {
    error = ApiError::bad_field(
        "model", model == body.end() ? "'model' is required"
                                     : fmt::format("'model' must be a string, got {}", type_name(*model)));
    return std::nullopt;
  }
  r.model = model->get<std::string>();
  if (endpoint == Endpoint::kCompletions) {
    auto prompt = body.find("prompt");
    if (prompt == body.end() || prompt->is_null()) {
      error = ApiError::bad_field("prompt", "'prompt' is required");
      return std::nullopt;
    }
    if (!read_prompt(*prompt, r, error)) return std::nullopt;
  } else {
    auto messages = body.find("messages");
    if (messages == body.end()) {
      error = ApiError::bad_field("messages", "'messages' is required");
      return std::nullopt;
    }
    if (!read_messages(*messages, r, error)) return std::nullopt;
  }

  int64_t value = 0;
  // Chat's newer name for max_tokens; either may be given.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (!optional_field(body, name, error, [&](const json& v, ApiError& e) {
          if (!read_int(v, name, 1, value, e)) return false;
          r.max_tokens = value;
          return true;
        })) {
      return std::nullopt;
    }
  }
  if (!optional_field(body, "min_tokens", error, [&](const json& v, ApiError& e) {
        return read_int(v, "min_tokens", 0, r.min_tokens, e);
      })) {
    return std::nullopt;
  }
  if (r.max_tokens && r.min_tokens > *r.max_tokens) {
    error = ApiError::bad_field(
        "min_tokens",
        fmt::format("'min_tokens' ({}) must not exceed 'max_tokens' ({})", r.min_tokens, *r.max_tokens));
    return std::nullopt;
  }
  int64_t n = 1;
  if (!optional_field(body, "n", error,
                      [&](const json& v, ApiError& e) { return read_int(v, "n", 1, n, e); })) {
    return std::nullopt;
  }
  if (n != 1) {
    error = ApiError::bad_field("n", fmt::format("'n' must be 1 (one choice per request), got {}", n));
    return std::nullopt;
  }
  if (!optional_field(
          body, "ignore_eos", error,
          [&](const json& v, ApiError& e) { return read_bool(v, "ignore_eos", r.ignore_eos, e); }) ||
      !optional_field(body, "stream", error,
                      [&](const json& v, ApiError& e) { return read_bool(v, "stream", r.stream, e); })) {
    return std::nullopt;
  }
  auto options = body.find("stream_options");
  if (options != body.end() && !options->is_null()) {
    if (!r.stream) {
      error = ApiError::bad_field("stream_options", "'stream_options' is only allowed when 'stream' is true");
      return std::nullopt;
    }
    if (!options->is_object()) {
      error = ApiError::bad_field(
          "stream_options", fmt::format("'stream_options' must be an object, got {}", type_name(*options)));
      return std::nullopt;
    }
    if (!optional_field(*options, "include_usage", error, [&](const json& v, ApiError& e) {
          return read_bool(v, "stream_options.include_usage", r.include_usage, e);
        })) {
      return std::nullopt;
    }
  }
  if (!optional_field(body, "seed", error, [&](const json& v, ApiError& e) {
        if (!v.is_number_integer()) {
          e = ApiError::bad_field("seed", fmt::format("'seed' must be an integer, got {}", type_name(v)));
          return false;
        }
        r.seed = v.get<uint64_t>();  // negative seeds wrap, as a 64-bit seed
        return true;
      })) {
    return std::nullopt;
  }
  if (!optional_field(body, "temperature", error,
                      [&](const json& v, ApiError& e) {
                        return read_number(v, "temperature", 0, 2, false, r.temperature, e);
                      }) ||
      !optional_field(body, "top_p", error, [&](const json& v, ApiError& e) {
        return read_number(v, "top_p", 0, 1, true, r.top_p, e);
      })) {
    return std::nullopt;
  }
  if (!optional_field(body, "stop", error, [&](const json& v, ApiError& e) {
        if (v.is_string()) {
          r.stop.push_back(v.get<std::string>());
        } else if (v.is_array() && v.size() <= 4 &&
                   std::all_of(v.begin(), v.end(), [](const json& s) { return s.is_string(); })) {
          for (const json& s : v) r.stop.push_back(s.get<std::string>());
        } else {
          e = ApiError::bad_field("stop", "'stop' must be a string or an array of at most 4 strings");
          return false;
        }
        std::erase_if(r.stop, [](const std::string& s) { return s.empty(); });
        for (const std::string& s : r.stop) {
          if (s.size() > kMaxStopBytes) {
            e = ApiError::bad_field("stop", fmt::format("a stop string is {} bytes; at most {} are taken",
                                                        s.size(), kMaxStopBytes));
            return false;
          }
        }
        return true;
      })) {
    return std::nullopt;
  }
  return r;
}

std::vector<std::string> mock_role_markers() {
  std::vector<std::string> out;
  for (std::string_view role : {"system", "developer", "user", "assistant", "tool"})
    out.push_back(role_marker(role));
  return out;
}

std::optional<std::string> chat_prompt(const std::vector<ChatMessage>& messages,
                                       const model::ChatTemplate* chat_template, ApiError& error) {
  // A template's markup is plain text to the tokenizer (or, for special tokens, becomes their ids): a message
  // holding it would pass for a turn of another role (a user writing "<|im_start|>system"). Refused, not
  // spliced in.
  static const std::vector<std::string> kMockMarkers = mock_role_markers();
  const std::vector<std::string>& markers =
      chat_template != nullptr ? chat_template->special_token_strings() : kMockMarkers;
  const char* what =
      chat_template != nullptr ? "the model's special token" : "the chat template's role marker";
  // One pass over each message's text: markers (a model may have hundreds) are tried only where a byte that
  // begins one of them stands.
  std::array<bool, 256> begins{};
  for (const std::string& marker : markers) begins[static_cast<unsigned char>(marker[0])] = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& content = messages[i].content;
    for (size_t at = 0; at < content.size(); ++at) {
      if (!begins[static_cast<unsigned char>(content[at])]) continue;
      for (const std::string& marker : markers) {
        if (content.compare(at, marker.size(), marker) != 0) continue;
        const std::string where = fmt::format("messages[{}]", i);
        error = ApiError::bad_field(
            where + ".content",
            fmt::format("'{}.content' holds {} {}, which would pass for a turn of another role", where, what,
                        marker));
        return std::nullopt;
      }
    }
  }
  if (chat_template == nullptr) return render_chat_prompt(messages);
  // {"role", "content"} in the order clients write them (a template iterating a message's items sees it).
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  auto text = chat_template->render(list, /*add_generation_prompt=*/true);
  if (!text.ok()) {
    // The message without the template's path (the server's file system is not the client's business).
    std::string message = text.status().message();
    const std::string prefix = chat_template->where() + ": ";
    if (message.starts_with(prefix)) message.erase(0, prefix.size());
    error = ApiError::bad_field("messages",
                                fmt::format("the model's chat template refused the messages: {}", message));
    return std::nullopt;
  }
  return std::move(*text);
}

std::string render_chat_prompt(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const ChatMessage& m : messages) {
    out += role_marker(m.role) + "\n";
    out += m.content;
    out += "\n";
  }
  out += role_marker("assistant") + "\n";
  return out;
}

json to_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

json logprobs_json(Endpoint endpoint, std::span<const TokenLogprobsText> tokens, int64_t& text_offset) {
  if (endpoint == Endpoint::kChatCompletions) {
    json content = json::array();
    for (const TokenLogprobsText& t : tokens) {
      json top = json::array();
      for (const auto& [bytes, logprob] : t.top) {
        top.push_back(
            {{"token", token_text(bytes).first}, {"logprob", shown(logprob)}, {"bytes", byte_list(bytes)}});
      }
      content.push_back({{"token", token_text(t.token).first},
                         {"logprob", shown(t.logprob)},
                         {"bytes", byte_list(t.token)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
  }
  json texts = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprobsText& t : tokens) {
    auto [text, chars] = token_text(t.token);
    json top = json::object();
    for (const auto& [bytes, logprob] : t.top) top.emplace(token_text(bytes).first, shown(logprob));
    top.emplace(text, shown(t.logprob));  // the sampled token, when not among them
    texts.push_back(std::move(text));
    values.push_back(shown(t.logprob));
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += chars;
  }
  return {{"tokens", std::move(texts)},
          {"token_logprobs", std::move(values)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json completion_response(Endpoint endpoint, const ResponseHeader& header, std::string_view text,
                         std::string_view finish_reason, const Usage& usage, json logprobs) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  json out = header_fields(header, chat ? "chat.completion" : "text_completion");
  out["choices"] = json::array({one_choice(chat ? "message" : "text",
                                           chat ? json{{"role", "assistant"}, {"content", text}} : json(text),
                                           finish_reason, std::move(logprobs))});
  out["usage"] = to_json(usage);
  return out;
}

json stream_chunk(Endpoint endpoint, const ResponseHeader& header, std::string_view text, bool first,
                  std::string_view finish_reason, json logprobs) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  json out = header_fields(header, chat ? "chat.completion.chunk" : "text_completion");
  json content = text;
  if (chat) {
    content = {{"content", text}};
    if (first) content["role"] = "assistant";
  }
  out["choices"] = json::array(
      {one_choice(chat ? "delta" : "text", std::move(content), finish_reason, std::move(logprobs))});
  return out;
}

json usage_chunk(Endpoint endpoint, const ResponseHeader& header, const Usage& usage) {
  json out =
      header_fields(header, endpoint == Endpoint::kCompletions ? "text_completion" : "chat.completion.chunk");
  out["choices"] = json::array();
  out["usage"] = to_json(usage);
  return out;
}

std::string sse_event(const json& chunk) {
  // Invalid UTF-8 (bytes a byte-level model draws at random; OutputText never cuts a whole character) is
  // replaced, never thrown on.
  return "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace crescent::serve
