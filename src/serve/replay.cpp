#include "serve/replay.h"

#include <fmt/format.h>
#include <httplib.h>
#include <xxhash.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "engine/engine_core.h"
#include "engine/step_log.h"
#include "serve/http_client_error.h"

namespace crescent::serve {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

conductor::RejectReason reason_from_code(const std::string& code, int status) {
  if (code == "tbt") return conductor::RejectReason::kTbt;
  if (code == "decode-capacity") return conductor::RejectReason::kDecodeCapacity;
  if (code == "context-length" || (status == 400)) return conductor::RejectReason::kContextLength;
  return conductor::RejectReason::kTtft;
}

// Bytes of a body kept for an error's text.
constexpr size_t kErrorBodyBytes = 64 << 10;

// Why a request failed.
struct Failure {
  FailureClass kind;
  std::string message;
};

// The text a crescent instance running the mock executor answers with `tokens` tokens for `seed`.
std::string mock_text(uint64_t seed, int64_t tokens) {
  std::string text;
  for (int64_t i = 0; i < tokens; ++i) text.push_back(static_cast<char>(engine::mock_token(seed, i)));
  return text;
}

// One request's exchange with `server`: sends it, reads the stream, fills `o` (its arrival_s already set).
// Returns why it failed, or nullopt.
std::optional<Failure> run_one(const ReplayOptions& options, const ServerAddress& server,
                               const std::string& model, const trace::Request& r, Clock::time_point start,
                               cluster::RequestOutcome& o) {
  json body = {{"model", model},
               {"prompt", trace_prompt_tokens(r, options.block_size_tokens, options.vocab_size)},
               {"max_tokens", r.output_tokens},
               {"ignore_eos", true},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (options.check_mock_output) body["seed"] = r.line;
  httplib::Client client(server.host, server.port);
  const auto seconds = [](double s) {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(s));
  };
  client.set_connection_timeout(seconds(std::min(10.0, options.timeout_s)));
  client.set_read_timeout(seconds(options.timeout_s));
  client.set_write_timeout(seconds(options.timeout_s));
  const Clock::time_point deadline = Clock::now() + seconds(options.timeout_s);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!options.api_key.empty()) req.set_header("Authorization", "Bearer " + options.api_key);

  std::string raw, pending, text;  // raw: the body's first bytes, for an error's text
  std::optional<Failure> stream_failure;
  std::vector<double> chunk_s;  // when each token's chunk arrived (seconds since start)
  int64_t completion_tokens = -1;
  bool done = false;
  const auto broken = [&](FailureClass kind, std::string message) {
    stream_failure = Failure{kind, std::move(message)};
  };
  // Consumes the stream's bytes: SSE events, each a chunk, the usage, "[DONE]" or an error.
  // False: the stream is broken (stream_failure says how) and the request stops there.
  const auto receive = [&](const char* data, size_t n) {
    const double now = std::chrono::duration<double>(Clock::now() - start).count();
    if (raw.size() < kErrorBodyBytes) raw.append(data, std::min(n, kErrorBodyBytes - raw.size()));
    const size_t searched = pending.size() > 0 ? pending.size() - 1 : 0;  // "\n\n" may straddle
    pending.append(data, n);
    for (size_t end, from = searched; (end = pending.find("\n\n", from)) != std::string::npos; from = 0) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      const json chunk = json::parse(payload, nullptr, false);
      if (chunk.is_discarded()) {
        broken(FailureClass::kMalformed, "unparsable stream event: " + payload.substr(0, 200));
        continue;
      }
      if (chunk.contains("error")) {
        broken(FailureClass::kSseError,
               "error event: " + chunk["error"].value("message", payload.substr(0, 200)));
        continue;
      }
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        const json& usage = chunk["usage"];
        completion_tokens = usage.value("completion_tokens", int64_t{-1});
        if (usage.contains("prompt_tokens_details") && usage["prompt_tokens_details"].is_object()) {
          o.prefix_hit_tokens = usage["prompt_tokens_details"].value("cached_tokens", int64_t{0});
        }
      }
      // A token's chunk: one with text, or an empty one before the last (crescent sends a chunk per token,
      // empty while its text is held back, e.g. a UTF-8 character's first bytes); a last chunk without text
      // only says why the answer ended.
      if (chunk.contains("choices") && chunk["choices"].is_array() && !chunk["choices"].empty()) {
        const json& choice = chunk["choices"][0];
        const bool last = choice.contains("finish_reason") && !choice["finish_reason"].is_null();
        const std::string piece = choice.value("text", std::string());
        text += piece;
        if (!last || !piece.empty()) chunk_s.push_back(now);
        if (std::ssize(chunk_s) > r.output_tokens + options.extra_chunks_allowed) {
          broken(FailureClass::kMalformed,
                 fmt::format("the stream ran past max_tokens ({} token chunks for {})", chunk_s.size(),
                             r.output_tokens));
          return false;
        }
      }
    }
    if (pending.size() > options.max_event_bytes) {
      broken(FailureClass::kMalformed,
             fmt::format("a stream event longer than {} bytes", options.max_event_bytes));
      return false;
    }
    if (Clock::now() > deadline) {
      broken(FailureClass::kHung, fmt::format("no whole answer within {:g} s", options.timeout_s));
      return false;
    }
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    try {
      return receive(data, n);
    } catch (const std::exception& e) {  // a stream event of an unexpected shape (json type_error)
      broken(FailureClass::kMalformed, fmt::format("unexpected stream event ({})", e.what()));
      return false;
    }
  };
  const auto failure = [&](FailureClass kind, const std::string& message) {
    return Failure{kind,
                   fmt::format("request line {} at {}:{}: {}", r.line, server.host, server.port, message)};
  };
  auto res = client.send(req);
  const double end_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (stream_failure) return failure(stream_failure->kind, stream_failure->message);
  if (!res) {
    const double took_s = end_s - o.arrival_s;
    FailureClass kind = FailureClass::kConnectionClosed;
    if (res.error() == httplib::Error::Connection || res.error() == httplib::Error::ConnectionTimeout) {
      kind = FailureClass::kConnectionRefused;
    } else if (took_s >= options.timeout_s * 0.99) {
      kind = FailureClass::kHung;
    }
    return failure(kind, fmt::format("{} after {:.1f} s ({})", httplib::to_string(res.error()), took_s,
                                     what_failed(res.error(), options.timeout_s)));
  }
  if (res->status == 429 || res->status == 400) {
    const json error = json::parse(raw.empty() ? res->body : raw, nullptr, false);
    std::string code;
    if (!error.is_discarded() && error.contains("error") &&
        error["error"].value("code", json()).is_string()) {
      code = error["error"]["code"].get<std::string>();
    }
    if (res->status == 400 && code != "context-length" && code != "context_length_exceeded") {
      return failure(FailureClass::kHttpError,
                     fmt::format("HTTP 400: {}", (raw.empty() ? res->body : raw).substr(0, 300)));
    }
    o.rejected = reason_from_code(code, res->status);
    o.finish_s = o.arrival_s;
    return std::nullopt;
  }
  if (res->status != 200) {
    return failure(FailureClass::kHttpError,
                   fmt::format("HTTP {}: {}", res->status, (raw.empty() ? res->body : raw).substr(0, 300)));
  }
  if (!done || chunk_s.empty()) return failure(FailureClass::kConnectionClosed, "the stream ended early");
  if (options.check_mock_output) {
    if (const std::string expected = mock_text(static_cast<uint64_t>(r.line), r.output_tokens);
        text != expected) {
      size_t at = 0;
      while (at < text.size() && at < expected.size() && text[at] == expected[at]) ++at;
      return failure(FailureClass::kWrongOutput,
                     fmt::format("the answer ({} bytes) is not the mock model's ({} bytes) from byte {}",
                                 text.size(), expected.size(), at));
    }
  }
  o.ttft_s = chunk_s.front() - o.arrival_s;
  o.finish_s = end_s;
  o.output_tokens = completion_tokens >= 0 ? completion_tokens : static_cast<int64_t>(chunk_s.size());
  if (chunk_s.size() >= 2) {
    std::vector<double> gaps;
    for (size_t i = 1; i < chunk_s.size(); ++i) gaps.push_back(chunk_s[i] - chunk_s[i - 1]);
    const engine::TokenGaps g = engine::tbt_of_gaps(gaps);
    o.tbt_s = g.tbt_s;
    o.max_token_gap_s = g.max_gap_s;
  }
  return std::nullopt;
}

}  // namespace

const char* to_string(FailureClass c) {
  switch (c) {
    case FailureClass::kHung:
      return "hung";
    case FailureClass::kHttpError:
      return "http_error";
    case FailureClass::kSseError:
      return "sse_error";
    case FailureClass::kConnectionClosed:
      return "connection_closed";
    case FailureClass::kConnectionRefused:
      return "connection_refused";
    case FailureClass::kMalformed:
      return "malformed";
    case FailureClass::kWrongOutput:
      return "wrong_output";
  }
  return "?";
}

std::vector<int64_t> trace_prompt_tokens(const trace::Request& request, int64_t block_size_tokens,
                                         int64_t vocab_size) {
  std::vector<int64_t> tokens;
  tokens.reserve(static_cast<size_t>(request.input_tokens));
  for (size_t b = 0; tokens.size() < static_cast<size_t>(request.input_tokens); ++b) {
    // More tokens than hash ids cover (not in valid traces): the last id's block continues.
    const BlockKey id =
        request.block_keys.empty() ? 0 : request.block_keys[std::min(b, request.block_keys.size() - 1)];
    const int64_t base = b < request.block_keys.size() ? 0 : static_cast<int64_t>(b) * block_size_tokens;
    for (int64_t t = 0; t < block_size_tokens && tokens.size() < static_cast<size_t>(request.input_tokens);
         ++t) {
      const uint64_t h = XXH3_64bits_withSeed(&id, sizeof(id), static_cast<uint64_t>(base + t));
      tokens.push_back(static_cast<int64_t>(h % static_cast<uint64_t>(vocab_size)));
    }
  }
  return tokens;
}

namespace {

// The sum and count of histogram `name` in the server's /metrics, or nullopt (no such metric, no answer).
std::optional<std::pair<double, double>> server_histogram(const ReplayOptions& options,
                                                          const std::string& name) {
  httplib::Client client(options.servers.front().host, options.servers.front().port);
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(10, 0);
  httplib::Headers headers;
  if (!options.api_key.empty()) headers.emplace("Authorization", "Bearer " + options.api_key);
  auto res = client.Get("/metrics", headers);
  if (!res || res->status != 200) return std::nullopt;
  std::optional<double> sum, count;
  std::istringstream lines(res->body);
  for (std::string line; std::getline(lines, line);) {
    const auto value = [&](const std::string& key) -> std::optional<double> {
      if (line.rfind(key + " ", 0) != 0) return std::nullopt;
      try {
        return std::stod(line.substr(key.size() + 1));
      } catch (const std::exception&) {
        return std::nullopt;
      }
    };
    if (auto v = value(name + "_sum")) sum = v;
    if (auto v = value(name + "_count")) count = v;
  }
  if (!sum || !count) return std::nullopt;
  return std::pair{*sum, *count};
}

constexpr const char* kExposedTransfer = "crescent_kv_exposed_transfer_seconds";

}  // namespace

Result<ReplayResult> replay(std::span<const trace::Request> trace, const ReplayOptions& options) {
  if (!(options.time_scale > 0)) {
    return Status::invalid_argument(fmt::format("--time-scale must be > 0, got {}", options.time_scale));
  }
  if (options.vocab_size < 1) return Status::invalid_argument("--vocab-size must be >= 1");
  if (options.block_size_tokens < 1) return Status::invalid_argument("--block-size must be >= 1");
  if (options.servers.empty()) return Status::invalid_argument("no server to replay against");
  ReplayResult out;
  out.model = options.model;
  // The first server that lists a model names it.
  for (size_t i = 0; out.model.empty() && i < options.servers.size(); ++i) {
    const ServerAddress& server = options.servers[i];
    httplib::Client client(server.host, server.port);
    client.set_connection_timeout(5, 0);
    client.set_read_timeout(10, 0);
    httplib::Headers headers;
    if (!options.api_key.empty()) headers.emplace("Authorization", "Bearer " + options.api_key);
    auto res = client.Get("/v1/models", headers);
    if (!res) {
      if (i + 1 < options.servers.size()) continue;
      return Status::unavailable(fmt::format("cannot reach http://{}:{}: {}", server.host, server.port,
                                             httplib::to_string(res.error())));
    }
    const json models = json::parse(res->body, nullptr, false);
    if (res->status != 200 || models.is_discarded() || !models.contains("data") ||
        !models["data"].is_array() || models["data"].empty() ||
        !models["data"][0].value("id", json()).is_string()) {
      if (i + 1 < options.servers.size()) continue;
      return Status::unavailable(fmt::format("http://{}:{}/v1/models lists no model (HTTP {}): {}",
                                             server.host, server.port, res->status,
                                             res->body.substr(0, 200)));
    }
    out.model = models["data"][0]["id"].get<std::string>();
  }
  const auto exposed_before = server_histogram(options, kExposedTransfer);
  out.result.requests.resize(trace.size());
  std::mutex mu;
  std::condition_variable all_done;
  int64_t finished = 0;
  const auto start = Clock::now();
  for (size_t i = 0; i < trace.size(); ++i) {
    const double at_s = trace::arrival_time_s(trace, i, options.time_scale);
    std::this_thread::sleep_until(start +
                                  std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                      at_s)));  // One detached thread per request in flight (open loop:
                                                // arrivals never wait for answers); each frees its
    // resources when it ends, however long the trace.
    std::thread([&, i] {
      cluster::RequestOutcome& o = out.result.requests[i];
      o.trace_line = trace[i].line;
      o.input_tokens = trace[i].input_tokens;
      o.output_tokens = trace[i].output_tokens;
      o.arrival_s = std::chrono::duration<double>(Clock::now() - start).count();
      std::optional<Failure> failure;
      for (size_t k = 0; k < options.servers.size(); ++k) {
        failure = run_one(options, options.servers[(i + k) % options.servers.size()], out.model, trace[i],
                          start, o);
        if (!failure || failure->kind != FailureClass::kConnectionRefused) break;
      }
      std::lock_guard lock(mu);
      if (failure) {
        ++out.failed;
        ++out.failures[static_cast<size_t>(failure->kind)];
        if (out.first_error.empty()) out.first_error = failure->message;
        o = {.arrival_s = o.arrival_s,
             .finish_s = o.arrival_s,
             .trace_line = o.trace_line,
             .input_tokens = o.input_tokens,
             .output_tokens = o.output_tokens,
             .failed = true};
      }
      ++finished;
      if (options.progress) options.progress(finished, static_cast<int64_t>(trace.size()));
      if (finished == static_cast<int64_t>(trace.size())) all_done.notify_all();
    }).detach();
  }
  {
    std::unique_lock lock(mu);
    all_done.wait(lock, [&] { return finished == static_cast<int64_t>(trace.size()); });
  }
  for (const cluster::RequestOutcome& o : out.result.requests) {
    out.result.makespan_s = std::max(out.result.makespan_s, o.finish_s);
  }
  if (const auto exposed_after = server_histogram(options, kExposedTransfer);
      exposed_before && exposed_after) {
    const double count = exposed_after->second - exposed_before->second;
    if (count > 0) out.kv_exposed_transfer_mean_s = (exposed_after->first - exposed_before->first) / count;
  }
  return out;
}

}  // namespace crescent::serve
