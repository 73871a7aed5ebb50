// Router mode's side of the front end (docs/router.md): requests answered by inference engines crescent does
// not own, whose answers (JSON, or a stream of server-sent events) are relayed to the client as the engine
// wrote them. The front end parses, checks and tokenizes a request as for crescent's own cluster; an
// EngineRelay (router/router.h) places it and relays the engine's answer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/cluster.h"
#include "conductor/conductor.h"
#include "serve/openai_api.h"

namespace crescent::serve {

/// A request as the front end hands it on: the client's body (the engine gets it, with the prompt as token
/// ids where it takes them) and what the front end made of it.
struct RelayedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  nlohmann::json body;                    // the client's, as parsed
  std::vector<int64_t> prompt_token_ids;  // the prompt as the model's tokenizer (and chat template) reads it
  int64_t max_tokens = 1;                 // the most it may generate (the body's, or the endpoint's default)
  bool stream = false;
  /// When the front end had the whole request (before parsing and tokenizing it): the start of the routing
  /// overhead the relay measures.
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
};

/// How an engine's answer reaches the client, from the relay's threads (keep them short; never call back
/// into the relay). Either on_head, then on_body 0+ times, then on_end; or on_error alone, or after on_head
/// and some of the body when the engine failed mid-answer. Nothing after on_end or on_error.
struct RelayCallbacks {
  /// The answer's status and content type ("application/json", "text/event-stream").
  std::function<void(int status, const std::string& content_type)> on_head;
  std::function<void(std::string_view bytes)> on_body;
  std::function<void()> on_end;
  /// The request failed: `http_status` (503: no engine could take it; 502: an engine failed it) and the
  /// error's `code` and `message` (as RequestCallbacks::on_error's). `after_head`: on_head came already, so
  /// the client is mid-answer (a stream ends with an SSE error event).
  std::function<void(int http_status, const std::string& code, const std::string& message, bool after_head)>
      on_error;
};

/// Engines behind the front end. Thread-safe.
class EngineRelay : public cluster::ServingStatus {
 public:
  /// Places `request` (the Conductor's decision and admission, as cluster::Cluster::submit) and sends it to
  /// its engines; accepted: the answer follows through `callbacks` and `id` names it for cancel(). Refused:
  /// the decision says why and no callback comes.
  virtual conductor::Decision relay(RelayedRequest request, RelayCallbacks callbacks, uint64_t& id) = 0;
  /// Stops request `id` (the client left): its engine exchanges are closed, so the engines abort it. No
  /// callback comes afterwards. No-op when finished.
  virtual void cancel(uint64_t id) = 0;
};

}  // namespace crescent::serve
