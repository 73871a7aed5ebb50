// A standby Conductor's HTTP front end (docs/serving.md, "Conductor failover"): while another Conductor
// leads, every request but /metrics is relayed to the leader's HTTP and its answer relayed back, a whole
// response as it came or an event stream piece by piece; a client that leaves cancels the relayed exchange.
// With no leader known (or when this Conductor leads) the local handler answers.
#pragma once

#include <functional>
#include <string>

#include "serve/http_client.h"
#include "serve/http_server.h"

namespace crescent::serve {

/// The largest whole (non-stream) response relayed from the leader; a larger one is answered 502.
inline constexpr size_t kMaxForwardedBodyBytes = 64 << 20;

/// Relays `request` to the server at `leader` (its base URL, "http://host:port") through `client` and answers
/// `responder` with what comes back: the status, content type, body and Retry-After of a whole response;
/// an event stream's events as they arrive. The request's method, path, body, Authorization and Content-Type
/// go along. If the leader cannot be reached or answers badly: 503 `no-leader` with Retry-After: 1 before
/// anything was relayed; mid-stream, an SSE error event (code `conductor_failover`) and `data: [DONE]`.
void forward_to(HttpClient& client, const HttpUrl& leader, HttpRequest request, HttpResponder responder);

/// A handler that forwards to the leader named by `leader_url()` ("" when this process leads or no leader is
/// known: then `local` answers), except /metrics, which is always this process's own. `client` must outlive
/// the handler.
HttpHandler forward_unless_leading(HttpHandler local, std::function<std::string()> leader_url,
                                   HttpClient& client);

}  // namespace crescent::serve
