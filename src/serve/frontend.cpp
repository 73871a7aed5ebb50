#include "serve/frontend.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <mutex>

#include "common/json_util.h"
#include "common/secret.h"
#include "serve/openai_api.h"
#include "serve/output_text.h"
#include "serve/relay.h"

namespace crescent::serve {
namespace {

using nlohmann::json;

HttpResponse json_response(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

HttpResponse error_response(const ApiError& error) {
  HttpResponse r = json_response(error.http_status, to_json(error));
  if (error.http_status == 429 || error.http_status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

ApiError make_error(int status, std::string type, std::string code, std::string message) {
  ApiError e;
  e.http_status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  return e;
}

// Bodies nesting deeper are refused before anything deeper is built: copying or printing a deep tree
// recurses, and 200,000 levels would overflow the event loop's stack.
constexpr int kMaxJsonDepth = 64;

// Whether `request` carries `api_key` (empty: no key is asked): "Authorization: Bearer <key>", the scheme in
// any case (RFC 9110 §11.1), the key compared in constant time.
bool authorized(const HttpRequest& request, const std::string& api_key) {
  if (api_key.empty()) return true;
  const std::string value = request.header("authorization");
  constexpr std::string_view kScheme = "bearer ";
  if (value.size() < kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) return false;
  }
  size_t start = kScheme.size();
  while (start < value.size() && value[start] == ' ') ++start;
  return secrets_equal(std::string_view(value).substr(start), api_key);
}

// A seed that is a function of the prompt alone (xxh3 of its token ids).
uint64_t prompt_seed(const std::vector<int64_t>& token_ids) {
  return XXH3_64bits(token_ids.data(), token_ids.size() * sizeof(int64_t));
}

HttpResponse unauthorized() {
  HttpResponse r =
      error_response(make_error(401, "authentication_error", "invalid_api_key",
                                "missing or wrong API key (send \"Authorization: Bearer <key>\")"));
  r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

// Routes that need the API key: the model API, not /health or /metrics (probes and scrapers).
bool needs_key(const HttpRequest& request) {
  return request.path.starts_with("/v1/") || request.path == "/v1";
}

// What one request's callbacks share; touched only on the cluster's driver thread after submit.
struct Exchange {
  HttpResponder responder{nullptr};
  Endpoint endpoint = Endpoint::kCompletions;
  ResponseHeader header;
  bool stream = false;
  bool include_usage = false;
  bool first_chunk = true;
  std::string text;  // non-streamed: the answer so far
  std::optional<OutputText> output;
  // With logprobs asked for: each token's, as text (non-streamed: the answer's so far), and where the next
  // token's text starts in the answer (completions' text_offset).
  std::shared_ptr<const model::Tokenizer> tokenizer;
  bool logprobs = false;
  std::vector<TokenLogprobsText> token_logprobs;
  int64_t text_offset = 0;
  // With a request log: what it records when the request is answered.
  std::shared_ptr<RequestLog> request_log;
  int64_t arrival_unix_ms = 0;
  json body;
  std::vector<int64_t> prompt_token_ids;

  // Adds the logprobs of delivered tokens to token_logprobs, their tokens as text.
  void add_logprobs(std::span<const model::TokenLogprobs> delivered, std::span<const int64_t> tokens) {
    for (size_t i = 0; i < delivered.size() && i < tokens.size(); ++i) {
      TokenLogprobsText& t = token_logprobs.emplace_back();
      t.token = tokenizer->token_bytes(tokens[i]);
      t.logprob = delivered[i].logprob;
      t.top.reserve(delivered[i].top.size());
      for (const auto& [id, logprob] : delivered[i].top)
        t.top.emplace_back(tokenizer->token_bytes(id), logprob);
    }
  }
};

class Frontend {
 public:
  Frontend(cluster::Cluster& cluster, FrontendOptions options)
      : status_(cluster), cluster_(&cluster), options_(std::move(options)) {}
  Frontend(EngineRelay& relay, FrontendOptions options)
      : status_(relay), relay_(&relay), options_(std::move(options)) {}

  void handle(HttpRequest request, HttpResponder responder) {
    if (request.path == "/health") {
      if (!is_get(request)) return responder.respond(method_not_allowed("GET, HEAD"));
      // Ready when a request can be placed: at least one prefill and one decode instance up.
      const auto [prefill_up, decode_up] = status_.instances_up();
      const bool ready = prefill_up > 0 && decode_up > 0;
      return responder.respond(json_response(ready ? 200 : 503, {{"status", ready ? "ok" : "unavailable"},
                                                                 {"prefill_instances_up", prefill_up},
                                                                 {"decode_instances_up", decode_up}}));
    }
    if (request.path == "/metrics") {
      if (!is_get(request)) return responder.respond(method_not_allowed("GET, HEAD"));
      HttpResponse metrics;
      metrics.content_type = "text/plain; version=0.0.4";
      metrics.body = status_.metrics_text();
      return responder.respond(std::move(metrics));
    }
    if (request.path == "/v1/models" || request.path.starts_with("/v1/models/")) {
      if (!authorized(request)) return responder.respond(unauthorized());
      if (!is_get(request)) return responder.respond(method_not_allowed("GET, HEAD"));
      const json model = {{"id", options_.model_name},
                          {"object", "model"},
                          {"created", started_unix_s_},
                          {"owned_by", "crescent"},
                          {"max_model_len", status_.max_context_tokens()}};
      if (request.path == "/v1/models") {
        return responder.respond(json_response(200, {{"object", "list"}, {"data", json::array({model})}}));
      }
      // OpenAI's retrieve-model call.
      const std::string id = request.path.substr(std::string_view("/v1/models/").size());
      if (id != options_.model_name) {
        return responder.respond(error_response(make_error(
            404, "invalid_request_error", "model_not_found",
            fmt::format("model '{}' does not exist; this server serves '{}'", id, options_.model_name))));
      }
      return responder.respond(json_response(200, model));
    }
    Endpoint endpoint;
    if (request.path == "/v1/completions") {
      endpoint = Endpoint::kCompletions;
    } else if (request.path == "/v1/chat/completions") {
      endpoint = Endpoint::kChatCompletions;
    } else {
      return responder.respond(error_response(make_error(
          404, "not_found_error", "", fmt::format("no route {} {}", request.method, request.path))));
    }
    if (!authorized(request)) return responder.respond(unauthorized());
    if (request.method != "POST") return responder.respond(method_not_allowed("POST"));
    complete(endpoint, request, std::move(responder));
  }

 private:
  bool authorized(const HttpRequest& request) const { return serve::authorized(request, options_.api_key); }
  // GET, or HEAD (answered with GET's headers and no body: the HTTP server drops it).
  static bool is_get(const HttpRequest& request) {
    return request.method == "GET" || request.method == "HEAD";
  }
  static HttpResponse method_not_allowed(const char* allowed) {
    HttpResponse r = error_response(
        make_error(405, "invalid_request_error", "method_not_allowed", fmt::format("use {}", allowed)));
    r.headers.emplace_back("Allow", allowed);
    return r;
  }

  void complete(Endpoint endpoint, const HttpRequest& http_request, HttpResponder responder) {
    const auto received = std::chrono::steady_clock::now();  // the request is all here (router overhead)
    const int64_t arrival_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count();
    Result<json> parsed_body = parse_json_bounded(http_request.body, kMaxJsonDepth);
    if (!parsed_body.ok()) {
      return responder.respond(error_response(ApiError::bad_field(
          "", parsed_body.status().code() == StatusCode::kOutOfRange
                  ? fmt::format("the request body nests deeper than {} levels", kMaxJsonDepth)
                  : std::string("the request body is not valid JSON"))));
    }
    json body = std::move(*parsed_body);
    ApiError error;
    // In router mode the engines implement what crescent's own instances do not (penalties, tools, ...).
    std::optional<CompletionRequest> parsed =
        parse_completion_request(body, endpoint, error, /*refuse_unimplemented=*/relay_ == nullptr);
    if (!parsed) return responder.respond(error_response(error));
    CompletionRequest& r = *parsed;
    if (r.model != options_.model_name) {
      return responder.respond(error_response(make_error(
          404, "invalid_request_error", "model_not_found",
          fmt::format("model '{}' does not exist; this server serves '{}'", r.model, options_.model_name))));
    }
    if (r.top_logprobs != model::kNoLogprobs && relay_ == nullptr &&
        options_.executor == cluster::ExecutorKind::kMock) {
      // Refused, not answered with made-up numbers.
      ApiError e = ApiError::bad_field("logprobs",
                                       "'logprobs' is not supported by this server: the mock executor has no "
                                       "logprobs (it draws tokens without a distribution; serve a model "
                                       "with --executor cpu)");
      e.code = "unsupported";
      return responder.respond(error_response(e));
    }
    cluster::ClusterRequest request;
    if (r.prompt_is_token_ids) {
      for (size_t i = 0; i < r.prompt_token_ids.size() && options_.token_ids_within_vocabulary; ++i) {
        if (r.prompt_token_ids[i] >= options_.tokenizer->vocab_size()) {
          return responder.respond(error_response(ApiError::bad_field(
              "prompt", fmt::format("token id {} at position {} is outside the vocabulary (0..{})",
                                    r.prompt_token_ids[i], i, options_.tokenizer->vocab_size() - 1))));
        }
      }
      request.prompt_token_ids = std::move(r.prompt_token_ids);
    } else if (endpoint == Endpoint::kChatCompletions) {
      std::optional<std::string> text = chat_prompt(r.messages, options_.chat_template.get(), error);
      if (!text) return responder.respond(error_response(error));
      request.prompt_token_ids = options_.tokenizer->encode(*text);
    } else {
      request.prompt_token_ids = options_.tokenizer->encode(r.prompt_text);
    }
    if (request.prompt_token_ids.empty()) {
      return responder.respond(error_response(ApiError::bad_field("prompt", "the prompt is empty")));
    }
    const auto input = static_cast<int64_t>(request.prompt_token_ids.size());
    const int64_t limit = status_.max_context_tokens();
    request.max_tokens = r.max_tokens.value_or(
        endpoint == Endpoint::kCompletions ? options_.default_max_tokens : options_.default_chat_max_tokens);
    if (request.max_tokens > limit - input) {  // (not input + max_tokens: it may overflow)
      ApiError e = ApiError::bad_field(
          r.max_tokens ? "max_tokens" : "prompt",
          fmt::format("the prompt ({} tokens) plus max_tokens ({}) exceed the model's context of {} tokens",
                      input, request.max_tokens, limit));
      e.code = "context_length_exceeded";
      return responder.respond(error_response(e));
    }
    if (relay_ != nullptr) {
      return relay(endpoint, std::move(body), std::move(request.prompt_token_ids), request.max_tokens,
                   r.stream, received, std::move(responder));
    }
    // Without a seed each request samples its own way; greedy (temperature 0) must answer a prompt the same
    // every time whatever the executor, so the mock's tokens (a function of the seed) then come from the
    // prompt.
    request.seed =
        r.seed.value_or(r.temperature == 0 ? prompt_seed(request.prompt_token_ids) : next_id_.load());
    request.temperature = r.temperature;
    request.top_p = r.top_p;
    request.top_logprobs = r.top_logprobs;

    auto exchange = std::make_shared<Exchange>();
    exchange->responder = responder;
    exchange->endpoint = endpoint;
    exchange->stream = r.stream;
    exchange->include_usage = r.include_usage;
    exchange->logprobs = r.top_logprobs != model::kNoLogprobs;
    exchange->tokenizer = options_.tokenizer;
    if (options_.request_log) {
      exchange->request_log = options_.request_log;
      exchange->arrival_unix_ms = arrival_unix_ms;
      exchange->body = std::move(body);
      exchange->prompt_token_ids = request.prompt_token_ids;
    }
    const uint64_t serial = next_id_.fetch_add(1);
    exchange->header.id =
        fmt::format("{}-{:016x}", endpoint == Endpoint::kCompletions ? "cmpl" : "chatcmpl", serial);
    exchange->header.created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    exchange->header.model = options_.model_name;
    if (r.stream) responder.start_stream();

    cluster::RequestCallbacks callbacks;
    exchange->output.emplace(
        options_.tokenizer,
        StopConditions{.stop = r.stop, .ignore_eos = r.ignore_eos, .min_tokens = r.min_tokens});
    callbacks.on_tokens = [exchange](std::span<const int64_t> tokens,
                                     std::span<const model::TokenLogprobs> logprobs) {
      const std::string piece = exchange->output->add(tokens);
      if (exchange->logprobs) exchange->add_logprobs(logprobs, tokens);
      if (exchange->stream) {
        // A chunk for every delivery, empty while text is held back: a client times each token by them. It
        // carries the logprobs of its tokens.
        json chunk_logprobs;
        if (exchange->logprobs) {
          chunk_logprobs = logprobs_json(exchange->endpoint, exchange->token_logprobs, exchange->text_offset);
          exchange->token_logprobs.clear();
        }
        exchange->responder.write(
            sse_event(stream_chunk(exchange->endpoint, exchange->header, piece, exchange->first_chunk, "",
                                   std::move(chunk_logprobs))));
        exchange->first_chunk = false;
      } else {
        exchange->text += piece;
      }
      return !exchange->output->stopped();  // stopped: EOS or a stop string, the request ends here
    };
    callbacks.on_done = [exchange](const cluster::RequestSummary& s) {
      const Usage usage{s.prompt_tokens, s.completion_tokens, s.cached_tokens};
      if (exchange->request_log) {
        exchange->request_log->append(exchange->arrival_unix_ms, exchange->body, exchange->prompt_token_ids,
                                      s.completion_tokens, s.cached_tokens);
      }
      const std::string rest = exchange->output->flush();
      const std::string_view finish_reason = exchange->output->finish_reason();
      if (exchange->stream) {
        std::string tail = sse_event(
            stream_chunk(exchange->endpoint, exchange->header, rest, exchange->first_chunk, finish_reason));
        if (exchange->include_usage)
          tail += sse_event(usage_chunk(exchange->endpoint, exchange->header, usage));
        tail += kSseDone;
        exchange->responder.write(std::move(tail));
        exchange->responder.end();
      } else {
        exchange->text += rest;
        json logprobs;
        if (exchange->logprobs) {
          logprobs = logprobs_json(exchange->endpoint, exchange->token_logprobs, exchange->text_offset);
        }
        exchange->responder.respond(
            json_response(200, completion_response(exchange->endpoint, exchange->header, exchange->text,
                                                   finish_reason, usage, std::move(logprobs))));
      }
    };
    callbacks.on_error = [exchange](const std::string& code, const std::string& message) {
      const ApiError e = make_error(503, "server_error", code, message);
      if (exchange->stream && !exchange->first_chunk) {
        // The stream is under way: an error event, then [DONE] (how vLLM and OpenAI end a broken stream).
        exchange->responder.write(fmt::format("data: {}\n\n{}", to_json(e).dump(), kSseDone));
        exchange->responder.end();
      } else {
        exchange->responder.respond(error_response(e));  // nothing went out yet
      }
    };
    uint64_t id = 0;
    const conductor::Decision decision = cluster_->submit(std::move(request), std::move(callbacks), id);
    if (!answer_refusal(decision, responder)) responder.on_disconnect([this, id] { cluster_->cancel(id); });
  }

  // Router mode: the relay places the request and relays its engine's answer as the engine wrote it.
  void relay(Endpoint endpoint, json body, std::vector<int64_t> prompt_token_ids, int64_t max_tokens,
             bool stream, std::chrono::steady_clock::time_point received, HttpResponder responder) {
    RelayedRequest request;
    request.received = received;
    request.endpoint = endpoint;
    request.body = std::move(body);
    request.prompt_token_ids = std::move(prompt_token_ids);
    request.max_tokens = max_tokens;
    request.stream = stream;
    // A streamed 200 is written as it comes; anything else is answered whole once it is all here.
    struct Answer {
      HttpResponder responder{nullptr};
      bool streaming = false;
      HttpResponse whole;
    };
    auto answer = std::make_shared<Answer>();
    answer->responder = responder;
    RelayCallbacks callbacks;
    callbacks.on_head = [answer](int status, const std::string& content_type) {
      answer->whole.status = status;
      answer->whole.content_type = content_type;
      answer->streaming = status == 200 && content_type.starts_with("text/event-stream");
      if (answer->streaming) answer->responder.start_stream();
    };
    callbacks.on_body = [answer](std::string_view bytes) {
      if (answer->streaming) {
        answer->responder.write(std::string(bytes));
      } else {
        answer->whole.body.append(bytes);
      }
    };
    callbacks.on_end = [answer] {
      if (answer->streaming) {
        answer->responder.end();
      } else {
        answer->responder.respond(std::move(answer->whole));
      }
    };
    callbacks.on_error = [answer](int http_status, const std::string& code, const std::string& message,
                                  bool after_head) {
      const ApiError e = make_error(http_status, "server_error", code, message);
      if (after_head && answer->streaming) {
        // The stream is under way: an error event, then [DONE] (how vLLM and OpenAI end a broken stream).
        answer->responder.write(fmt::format("data: {}\n\n{}", to_json(e).dump(), kSseDone));
        answer->responder.end();
      } else {
        answer->responder.respond(error_response(e));
      }
    };
    uint64_t id = 0;
    const conductor::Decision decision = relay_->relay(std::move(request), std::move(callbacks), id);
    if (!answer_refusal(decision, responder)) responder.on_disconnect([this, id] { relay_->cancel(id); });
  }

  // Answers a refused `decision` (503 with no instance, 400 for a request that can never fit, else 429 with
  // Retry-After); false when it was accepted.
  static bool answer_refusal(const conductor::Decision& decision, const HttpResponder& responder) {
    if (decision.rejected == conductor::RejectReason::kNoInstance) {
      responder.respond(error_response(make_error(503, "server_error", "no-instance",
                                                  "no prefill or no decode instance is up; retry later")));
      return true;
    }
    if (decision.rejected != conductor::RejectReason::kNone) {
      const bool never = decision.rejected == conductor::RejectReason::kContextLength;
      ApiError e =
          make_error(never ? 400 : 429, never ? "invalid_request_error" : "rate_limit_error",
                     std::string(conductor::to_string(decision.rejected)),
                     never ? "the request can never fit a decode instance's KV cache"
                           : fmt::format("the cluster is overloaded (admission refused it: {}); retry later",
                                         conductor::to_string(decision.rejected)));
      responder.respond(error_response(e));  // the stream's headers have not gone out yet
      return true;
    }
    return false;
  }

  cluster::ServingStatus& status_;
  cluster::Cluster* cluster_ = nullptr;  // one of the two
  EngineRelay* relay_ = nullptr;
  const FrontendOptions options_;
  const int64_t started_unix_s_ =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace

std::function<std::optional<HttpResponse>(const HttpRequest&)> frontend_head_check(
    const FrontendOptions& options) {
  return [api_key = options.api_key](const HttpRequest& head) -> std::optional<HttpResponse> {
    if (needs_key(head) && !authorized(head, api_key)) return unauthorized();
    return std::nullopt;
  };
}

HttpHandler make_frontend(cluster::Cluster& cluster, FrontendOptions options) {
  auto frontend = std::make_shared<Frontend>(cluster, std::move(options));
  return [frontend](HttpRequest request, HttpResponder responder) {
    frontend->handle(std::move(request), std::move(responder));
  };
}

HttpHandler make_router_frontend(EngineRelay& relay, FrontendOptions options) {
  auto frontend = std::make_shared<Frontend>(relay, std::move(options));
  return [frontend](HttpRequest request, HttpResponder responder) {
    frontend->handle(std::move(request), std::move(responder));
  };
}

}  // namespace crescent::serve
