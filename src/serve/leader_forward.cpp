#include "serve/leader_forward.h"

#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "serve/openai_api.h"

namespace crescent::serve {
namespace {

// The answer when the leader cannot be relayed to before anything went out.
HttpResponse no_leader(const std::string& why) {
  ApiError e;
  e.http_status = 503;
  e.type = "server_error";
  e.code = "no-leader";
  e.message = fmt::format("this Conductor stands by and could not reach the leader ({}); retry later", why);
  HttpResponse r;
  r.status = 503;
  r.body = to_json(e).dump();
  r.headers.emplace_back("Retry-After", "1");
  return r;
}

// One relayed exchange: what the leader's answer has been so far.
struct Relay {
  explicit Relay(HttpResponder responder) : responder(std::move(responder)) {}
  HttpResponder responder;
  bool streaming = false;  // the leader answers with an event stream: relayed as it comes
  HttpResponse whole;      // otherwise: buffered, then answered at once
  std::string content_type;
};

}  // namespace

void forward_to(HttpClient& client, const HttpUrl& leader, HttpRequest request, HttpResponder responder) {
  HttpClientRequest out;
  out.method = request.method;
  out.host = leader.host;
  out.port = leader.port;
  out.target = leader.base_path + request.path;
  for (const char* name : {"authorization", "content-type", "accept"}) {
    if (std::string value = request.header(name); !value.empty()) out.headers.emplace_back(name, value);
  }
  out.body = std::move(request.body);
  out.response_timeout_s =
      600;                   // a queued prompt's first byte may be long in coming: the leader's own deadlines
  out.idle_timeout_s = 600;  // apply, and a client that leaves cancels
  auto relay = std::make_shared<Relay>(responder);
  HttpClientCallbacks callbacks;
  callbacks.on_head = [relay](int status, const std::vector<std::pair<std::string, std::string>>& headers) {
    for (const auto& [name, value] : headers) {
      if (name == "content-type") relay->content_type = value;
      if (name == "retry-after") relay->whole.headers.emplace_back("Retry-After", value);
    }
    relay->streaming = status == 200 && relay->content_type.starts_with("text/event-stream");
    if (relay->streaming) {
      relay->responder.start_stream();
    } else {
      relay->whole.status = status;
      relay->whole.content_type = relay->content_type.empty() ? "application/json" : relay->content_type;
    }
    return true;
  };
  callbacks.on_body = [relay](std::string_view piece) {
    if (relay->streaming) {
      relay->responder.write(std::string(piece));
      return true;
    }
    if (relay->whole.body.size() + piece.size() > kMaxForwardedBodyBytes) return false;
    relay->whole.body.append(piece);
    return true;
  };
  callbacks.on_end = [relay](const Status& status) {
    if (relay->streaming) {
      if (!status.ok()) {
        ApiError e;
        e.http_status = 503;
        e.type = "server_error";
        e.code = "conductor_failover";
        e.message = fmt::format("the leading Conductor's stream ended: {}", status.message());
        relay->responder.write(sse_event(to_json(e)) + std::string(kSseDone));
      }
      relay->responder.end();
      return;
    }
    if (!status.ok()) {
      relay->responder.respond(no_leader(status.message()));
      return;
    }
    relay->responder.respond(std::move(relay->whole));
  };
  const uint64_t id = client.send(std::move(out), std::move(callbacks));
  responder.on_disconnect([&client, id] { client.cancel(id); });
}

HttpHandler forward_unless_leading(HttpHandler local, std::function<std::string()> leader_url,
                                   HttpClient& client) {
  return [local = std::move(local), leader_url = std::move(leader_url), &client](HttpRequest request,
                                                                                 HttpResponder responder) {
    const std::string url = request.path == "/metrics" ? std::string() : leader_url();
    if (url.empty()) return local(std::move(request), std::move(responder));
    auto leader = parse_http_url(url);
    if (!leader.ok()) return responder.respond(no_leader(leader.status().message()));
    forward_to(client, *leader, std::move(request), std::move(responder));
  };
}

}  // namespace crescent::serve
