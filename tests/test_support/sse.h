// A streamed POST read as server-sent events, as the serve tests read `crescent serve`'s streams
// (docs/serving.md, "Streaming"): every `data:` payload in order, with a callback as each one arrives.
// Shared by every test that streams.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace crescent::test {

/// What a streamed POST got.
struct SseReply {
  int status = 0;  // 0: no response (the connection failed or was refused)
  std::string content_type;
  std::vector<std::string> events;  // each event's data payload in order, "[DONE]" included
  std::string raw;                  // every byte of the body, for messages
};

/// POSTs `body` (JSON text) to `path` with `client` and reads the answer as server-sent events.
/// `on_event(payload)` runs as each event arrives (before the next is read); returning false stops reading.
inline SseReply post_sse(httplib::Client& client, const std::string& path, const std::string& body,
                         const std::function<bool(const std::string& payload)>& on_event = {}) {
  SseReply reply;
  std::string pending;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    reply.raw.append(data, n);
    pending.append(data, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;  // a comment or another field
      event.erase(0, 6);
      reply.events.push_back(event);
      if (on_event && !on_event(event)) return false;
    }
    return true;
  };
  auto res = client.send(req);
  if (res) {
    reply.status = res->status;
    reply.content_type = res->get_header_value("Content-Type");
  }
  return reply;
}

/// A streamed completion (the OpenAI API's chunks as server-sent events) as its client saw it.
struct StreamedCompletion {
  std::string text;                           // the chunks' text, in order
  int64_t tokens = 0;                         // chunks with text (one token each from crescent's servers)
  std::atomic<int64_t> live_tokens{0};        // the same, readable from another thread while it streams
  std::string error;                          // the message of an error event; "" when none came
  bool done = false;                          // it ended with data: [DONE]
  std::chrono::steady_clock::time_point end;  // when the response ended
};

/// POSTs the completion request `body` (which asks for "stream": true) to `path` with `client` and reads its
/// chunks into `out` as they arrive.
inline void stream_completion(httplib::Client& client, const std::string& path, const nlohmann::json& body,
                              StreamedCompletion& out) {
  post_sse(client, path, body.dump(), [&](const std::string& event) {
    if (event == "[DONE]") {
      out.done = true;
      return true;
    }
    const nlohmann::json chunk = nlohmann::json::parse(event, nullptr, false);
    if (chunk.contains("error")) {
      out.error = chunk["error"].value("message", "?");
    } else if (chunk.contains("choices") && !chunk["choices"].empty() &&
               !chunk["choices"][0].value("text", "").empty()) {
      out.text += chunk["choices"][0]["text"].get<std::string>();
      ++out.tokens;
      ++out.live_tokens;
    }
    return true;
  });
  out.end = std::chrono::steady_clock::now();
}

}  // namespace crescent::test
