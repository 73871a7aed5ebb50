// The Conductor's HTTP front end: OpenAI-compatible routes over a Cluster (docs/serving.md).
//   POST /v1/completions, POST /v1/chat/completions   (stream or not; 429 + Retry-After when admission
//                                                       refuses, 400 for a prompt that can never fit)
//   GET /v1/models, GET /health
// Prompts are tokenized by the options' tokenizer (model::Tokenizer: bytes, the mock's and the presets');
// token-id prompts are used as given, within its vocabulary. Chat messages become a prompt through the
// model's chat template when the options have one, else the mock's (openai_api.h: chat_prompt).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "cluster/cluster.h"
#include "cluster/cluster_config.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "serve/http_server.h"
#include "serve/request_log.h"

namespace crescent::serve {

struct FrontendOptions {
  std::string model_name = "mock";  // what /v1/models lists and requests must name
  std::string
      api_key;  // non-empty: /v1 requests need "Authorization: Bearer <key>" (else 401); any case of "Bearer"
  int64_t default_max_tokens = 16;        // /v1/completions without max_tokens (the OpenAI default)
  int64_t default_chat_max_tokens = 256;  // /v1/chat/completions without max_tokens (the mock never stops)
  std::shared_ptr<const model::Tokenizer> tokenizer = model::byte_tokenizer();
  /// Whether token-id prompts must lie within the tokenizer's vocabulary (400 otherwise). Off in router mode
  /// without the model's tokenizer: the engines know their vocabulary, the bytes tokenizer does not.
  bool token_ids_within_vocabulary = true;
  /// The served model's chat template (model::load_model_chat_template), rendering /v1/chat/completions'
  /// messages with the generation prompt; null: the mock's <|role|> lines.
  std::shared_ptr<const model::ChatTemplate> chat_template = nullptr;
  /// The instances' executor (config.serve.executor): the mock draws tokens without a distribution, so a
  /// request asking for logprobs is refused (400 `unsupported`); the cpu executor gives them.
  cluster::ExecutorKind executor = cluster::ExecutorKind::kMock;
  /// When set, every answered request is appended to it (`serve --request-log`; serve/request_log.h).
  std::shared_ptr<RequestLog> request_log = nullptr;
};

/// The handler serving the routes above with `cluster` (which must outlive every request it answers).
HttpHandler make_frontend(cluster::Cluster& cluster, FrontendOptions options);

class EngineRelay;
/// The same routes in router mode (docs/router.md): requests are checked and tokenized as above, then `relay`
/// places them on engines crescent does not own and their answers are relayed as the engines wrote them.
/// Fields crescent's own instances do not implement pass to the engine (parse_completion_request's
/// refuse_unimplemented false), and logprobs are the engine's to give. `options.executor` is unused.
HttpHandler make_router_frontend(EngineRelay& relay, FrontendOptions options);

/// The check to run as HttpServerOptions::check_head beside make_frontend: a /v1 request without the
/// options' API key is answered 401 (with `WWW-Authenticate: Bearer`) before its body is read, so a client
/// without the key cannot make the server hold its body.
std::function<std::optional<HttpResponse>(const HttpRequest&)> frontend_head_check(
    const FrontendOptions& options);

}  // namespace crescent::serve
