#include "serve/replay.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/resource.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "engine/engine_core.h"
#include "engine/step_log.h"
#include "serve/http_client.h"

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

// Token `position` of the block with hash id `id` in a trace prompt (trace_prompt_tokens).
int64_t prompt_token(BlockKey id, int64_t position, int64_t vocab_size) {
  const uint64_t h = XXH3_64bits_withSeed(&id, sizeof(id), static_cast<uint64_t>(position));
  return static_cast<int64_t>(h % static_cast<uint64_t>(vocab_size));
}

// Raises this process's soft limit on open files to its hard limit: a replay holds a connection per request
// in flight, thousands of them.
void raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// How long after a request's deadline the client's own response and idle timeouts fire: the watchdog
// (every 100 ms) ends it first, so a request past its deadline always ends the same way, as hung.
constexpr double kTimeoutMarginS = 0.5;

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

// The JSON array text of trace_prompt_tokens(request, ...) ("[3,141,59]"), built from cached per-block
// fragments: the same hash id always stands for the same block_size_tokens ids, and a trace's prompts share
// most of their blocks, so a replay that keeps up with thousands of requests a second does not hash and print
// every token of every prompt (a 12k-token prompt: ~0.3 ms that way).
class PromptText {
 public:
  PromptText(int64_t block_size_tokens, int64_t vocab_size)
      : block_size_tokens_(block_size_tokens), vocab_size_(vocab_size) {}

  void append(const trace::Request& r, std::string& out) {
    out += '[';
    const size_t first = out.size();
    const auto whole_blocks = static_cast<size_t>(
        std::min<int64_t>(static_cast<int64_t>(r.block_keys.size()), r.input_tokens / block_size_tokens_));
    for (size_t b = 0; b < whole_blocks; ++b) out += fragment(r.block_keys[b]);
    // The last, partial block (and, in traces with fewer ids than blocks, the blocks after the last id):
    // token by token, as trace_prompt_tokens makes them.
    int64_t done = static_cast<int64_t>(whole_blocks) * block_size_tokens_;
    for (size_t b = whole_blocks; done < r.input_tokens; ++b) {
      const BlockKey id = r.block_keys.empty() ? 0 : r.block_keys[std::min(b, r.block_keys.size() - 1)];
      const int64_t base = b < r.block_keys.size() ? 0 : static_cast<int64_t>(b) * block_size_tokens_;
      for (int64_t t = 0; t < block_size_tokens_ && done < r.input_tokens; ++t, ++done) {
        fmt::format_to(std::back_inserter(out), "{},", prompt_token(id, base + t, vocab_size_));
      }
    }
    if (out.size() > first) out.pop_back();  // the last ','
    out += ']';
  }

 private:
  const std::string& fragment(BlockKey id) {
    if (cached_bytes_ > kMaxCachedBytes) {
      fragments_.clear();
      cached_bytes_ = 0;
    }
    auto [it, added] = fragments_.try_emplace(id);
    if (added) {
      const trace::Request one{.input_tokens = block_size_tokens_, .block_keys = {id}};
      for (int64_t t : trace_prompt_tokens(one, block_size_tokens_, vocab_size_))
        fmt::format_to(std::back_inserter(it->second), "{},", t);
      cached_bytes_ += it->second.size() + 96;
    }
    return it->second;
  }

  // Each entry counted with ~96 bytes of the map's own: at most ~64 MiB in all, then begun again.
  static constexpr size_t kMaxCachedBytes = 64 << 20;
  int64_t block_size_tokens_;
  int64_t vocab_size_;
  std::unordered_map<BlockKey, std::string> fragments_;
  size_t cached_bytes_ = 0;
};

// One request in flight: what its stream has said so far. Lives in its callbacks; used on the client's
// thread only.
struct Exchange {
  size_t index = 0;
  size_t attempt = 0;  // servers tried so far, minus one
  std::string body;    // kept to send again to the next server when a connection cannot be made
  Clock::time_point deadline;
  int status = 0;                      // the response's HTTP status, 0 before its head
  std::string raw;                     // the body's first bytes, for an error's text
  std::string text;                    // the answer so far
  std::vector<double> chunk_s;         // when each token's chunk arrived (seconds since start)
  int64_t completion_tokens = -1;      // from the usage chunk
  bool done = false;                   // "[DONE]" seen
  std::optional<Failure> broken;       // why the stream is unusable
  bool error_body_cut = false;         // an error body longer than kErrorBodyBytes: read no further
  uint64_t id = 0;                     // the client's id of the exchange, once send() returned (watchdog)
  std::atomic<bool> ended{false};      // on_end ran
  std::atomic<bool> timed_out{false};  // the watchdog cancelled it at its deadline
};

// Drives every request of one replay through one HttpClient: sends, reads streams, classifies endings.
class Replayer {
 public:
  Replayer(std::span<const trace::Request> trace, const ReplayOptions& options, ReplayResult& out)
      : trace_(trace),
        options_(options),
        out_(out),
        client_(HttpClient::start({.max_idle_per_host = 4096})) {}

  // Sends every request at its time (this thread paces; the client's thread does the rest) and waits for
  // every answer.
  void run() {
    out_.result.requests.resize(trace_.size());
    PromptText prompts(options_.block_size_tokens, options_.vocab_size);
    std::vector<double> lags_s;
    lags_s.reserve(trace_.size());
    start_ = Clock::now();
    std::thread watchdog([this] { watch_deadlines(); });
    for (size_t i = 0; i < trace_.size(); ++i) {
      auto ex = std::make_shared<Exchange>();
      ex->index = i;
      ex->body = request_body(trace_[i], prompts);
      const Clock::time_point at =
          start_ + std::chrono::duration_cast<Clock::duration>(
                       std::chrono::duration<double>(trace::arrival_time_s(trace_, i, options_.time_scale)));
      std::this_thread::sleep_until(at);
      const Clock::time_point now = Clock::now();
      lags_s.push_back(std::max(0.0, std::chrono::duration<double>(now - at).count()));
      cluster::RequestOutcome& o = out_.result.requests[i];
      o.trace_line = trace_[i].line;
      o.input_tokens = trace_[i].input_tokens;
      o.output_tokens = trace_[i].output_tokens;
      o.arrival_s = std::chrono::duration<double>(now - start_).count();
      ex->deadline = now + seconds(options_.timeout_s);
      {
        std::lock_guard lock(mu_);
        ++in_flight_;
        out_.max_in_flight = std::max(out_.max_in_flight, in_flight_);
      }
      send(std::move(ex));
    }
    {
      std::unique_lock lock(mu_);
      all_done_.wait(lock, [&] { return finished_ == static_cast<int64_t>(trace_.size()); });
      watchdog_stop_ = true;
      watchdog_wake_.notify_all();
    }
    watchdog.join();
    client_.reset();
    if (!lags_s.empty()) {
      std::sort(lags_s.begin(), lags_s.end());
      out_.schedule_lag_max_s = lags_s.back();
      out_.schedule_lag_p99_s = lags_s[std::min(lags_s.size() - 1, (lags_s.size() * 99 + 99) / 100 - 1)];
      out_.schedule_lag_mean_s =
          std::accumulate(lags_s.begin(), lags_s.end(), 0.0) / static_cast<double>(lags_s.size());
    }
  }

 private:
  static std::chrono::microseconds seconds(double s) {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(s));
  }

  std::string request_body(const trace::Request& r, PromptText& prompts) const {
    std::string body = R"({"model":)" + json(out_.model).dump() + R"(,"prompt":)";
    body.reserve(body.size() + static_cast<size_t>(r.input_tokens) * 4 + 160);
    prompts.append(r, body);
    fmt::format_to(
        std::back_inserter(body),
        R"(,"max_tokens":{},"ignore_eos":true,"stream":true,"stream_options":{{"include_usage":true}})",
        r.output_tokens);
    if (options_.check_mock_output) fmt::format_to(std::back_inserter(body), R"(,"seed":{})", r.line);
    body += '}';
    return body;
  }

  const ServerAddress& server_of(const Exchange& ex) const {
    return options_.servers[(ex.index + ex.attempt) % options_.servers.size()];
  }

  void send(std::shared_ptr<Exchange> ex) {
    const ServerAddress& server = server_of(*ex);
    // A request sent again to the next server has what is left of its time.
    const double wait_s =
        ex->attempt == 0
            ? options_.timeout_s
            : std::max(0.001, std::chrono::duration<double>(ex->deadline - Clock::now()).count());
    HttpClientRequest request{.method = "POST",
                              .host = server.host,
                              .port = static_cast<uint16_t>(server.port),
                              .target = "/v1/completions",
                              .headers = {},
                              // Kept for the next server only when there is one.
                              .body = options_.servers.size() > 1 ? ex->body : std::move(ex->body),
                              .connect_timeout_s = std::min(10.0, wait_s),
                              // The watchdog ends it at its deadline; these only back it up.
                              .response_timeout_s = wait_s + kTimeoutMarginS,
                              .idle_timeout_s = wait_s + kTimeoutMarginS};
    if (!options_.api_key.empty())
      request.headers.emplace_back("Authorization", "Bearer " + options_.api_key);
    HttpClientCallbacks callbacks;
    callbacks.on_head = [ex](int status, const auto&) {
      ex->status = status;
      return true;
    };
    callbacks.on_body = [this, ex](std::string_view piece) { return on_body(*ex, piece); };
    callbacks.on_end = [this, ex](const Status& status) { on_end(ex, status); };
    const uint64_t id = client_->send(std::move(request), std::move(callbacks));
    std::lock_guard lock(mu_);
    // (Its callbacks may have begun, or even ended, before send() returned: on_end then found no entry to
    // erase, and the watchdog drops one whose exchange has ended.)
    ex->id = id;
    live_.emplace(id, ex);
  }

  // Ends every exchange past its deadline, whatever its server sends or does not: the client's own timeouts
  // restart with each piece of the body (every 100 ms, until stopped).
  void watch_deadlines() {
    std::unique_lock lock(mu_);
    while (!watchdog_stop_) {
      watchdog_wake_.wait_for(lock, std::chrono::milliseconds(100));
      const Clock::time_point now = Clock::now();
      for (auto it = live_.begin(); it != live_.end();) {
        if (it->second->ended) {
          it = live_.erase(it);
        } else if (now > it->second->deadline && !it->second->timed_out.exchange(true)) {
          client_->cancel(it->first);
          ++it;
        } else {
          ++it;
        }
      }
    }
  }

  // Reads the next bytes of the body: an error's text, or the stream's SSE events. False: the stream is
  // broken (ex.broken says how) and the exchange stops there.
  bool on_body(Exchange& ex, std::string_view piece) {
    if (Clock::now() > ex.deadline) {
      ex.broken =
          Failure{FailureClass::kHung, fmt::format("no whole answer within {:g} s", options_.timeout_s)};
      return false;
    }
    if (ex.status != 200) {
      // An error's text: its first bytes are enough to tell what it says.
      ex.raw.append(piece.substr(0, kErrorBodyBytes - ex.raw.size()));
      ex.error_body_cut = ex.raw.size() >= kErrorBodyBytes;
      return !ex.error_body_cut;
    }
    if (!parser_of(ex).feed(piece).ok() && !ex.broken) {
      ex.broken = Failure{FailureClass::kMalformed,
                          fmt::format("a stream event longer than {} bytes", options_.max_event_bytes)};
    }
    return !ex.broken;
  }

  SseParser& parser_of(Exchange& ex) {
    auto [it, added] = parsers_.try_emplace(&ex, nullptr);
    if (added) {
      it->second = std::make_unique<SseParser>(
          [this, &ex](std::string_view data) {
            try {
              on_event(ex, data);
            } catch (const std::exception& e) {  // a stream event of an unexpected shape (json type_error)
              if (!ex.broken)
                ex.broken =
                    Failure{FailureClass::kMalformed, fmt::format("unexpected stream event ({})", e.what())};
            }
          },
          options_.max_event_bytes);
    }
    return *it->second;
  }

  // One SSE event's data: a chunk, the usage, "[DONE]" or an error.
  void on_event(Exchange& ex, std::string_view data) {
    if (ex.broken) return;
    const double now = std::chrono::duration<double>(Clock::now() - start_).count();
    if (data == "[DONE]") {
      ex.done = true;
      return;
    }
    const json chunk = json::parse(data, nullptr, false);
    if (chunk.is_discarded()) {
      ex.broken =
          Failure{FailureClass::kMalformed, "unparsable stream event: " + std::string(data.substr(0, 200))};
      return;
    }
    if (chunk.contains("error")) {
      ex.broken =
          Failure{FailureClass::kSseError,
                  "error event: " + chunk["error"].value("message", std::string(data.substr(0, 200)))};
      return;
    }
    cluster::RequestOutcome& o = out_.result.requests[ex.index];
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      const json& usage = chunk["usage"];
      ex.completion_tokens = usage.value("completion_tokens", int64_t{-1});
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
      if (options_.check_mock_output) ex.text += piece;
      if (!last || !piece.empty()) ex.chunk_s.push_back(now);
      const trace::Request& r = trace_[ex.index];
      if (std::ssize(ex.chunk_s) > r.output_tokens + options_.extra_chunks_allowed) {
        ex.broken = Failure{FailureClass::kMalformed,
                            fmt::format("the stream ran past max_tokens ({} token chunks for {})",
                                        ex.chunk_s.size(), r.output_tokens)};
      }
    }
  }

  void on_end(const std::shared_ptr<Exchange>& ex, const Status& status) {
    parsers_.erase(ex.get());
    ex->ended = true;
    // A server that cannot be connected to (nothing was sent): the next one takes the request.
    if (!ex->broken && ended_before_sending(status) && ex->attempt + 1 < options_.servers.size() &&
        Clock::now() < ex->deadline) {
      // A fresh exchange: nothing of the refused one carries over but the request.
      auto next = std::make_shared<Exchange>();
      next->index = ex->index;
      next->attempt = ex->attempt + 1;
      next->body = std::move(ex->body);
      next->deadline = ex->deadline;
      send(std::move(next));
      return;
    }
    std::optional<Failure> failure = outcome(*ex, status);
    const ServerAddress& server = server_of(*ex);
    cluster::RequestOutcome& o = out_.result.requests[ex->index];
    std::unique_lock lock(mu_);
    live_.erase(ex->id);
    if (failure) {
      ++out_.failed;
      ++out_.failures[static_cast<size_t>(failure->kind)];
      if (out_.first_error.empty()) {
        out_.first_error = fmt::format("request line {} at {}:{}: {}", trace_[ex->index].line, server.host,
                                       server.port, failure->message);
      }
      o = {.arrival_s = o.arrival_s,
           .finish_s = o.arrival_s,
           .trace_line = o.trace_line,
           .input_tokens = o.input_tokens,
           .output_tokens = o.output_tokens,
           .failed = true};
    }
    --in_flight_;
    ++finished_;
    const int64_t finished = finished_;
    if (finished_ == static_cast<int64_t>(trace_.size())) all_done_.notify_all();
    lock.unlock();
    // Only this thread calls it, so calls stay in order; not under mu_, so a slow terminal stalls no sender.
    if (options_.progress) options_.progress(finished, static_cast<int64_t>(trace_.size()));
  }

  // How exchange `ex` ended, given the client's `status`: fills its outcome; returns why it failed, or
  // nullopt.
  std::optional<Failure> outcome(Exchange& ex, const Status& status) {
    cluster::RequestOutcome& o = out_.result.requests[ex.index];
    const double end_s = std::chrono::duration<double>(Clock::now() - start_).count();
    if (ex.broken) return ex.broken;
    if (ex.timed_out) {
      return Failure{FailureClass::kHung, fmt::format("no whole answer within {:g} s", options_.timeout_s)};
    }
    const bool whole = status.ok() || (ex.error_body_cut && status.code() == StatusCode::kCancelled);
    if (!whole) {
      FailureClass kind = FailureClass::kConnectionClosed;
      if (ended_before_sending(status)) {
        kind = FailureClass::kConnectionRefused;
      } else if (status.code() == StatusCode::kDeadlineExceeded) {
        kind = FailureClass::kHung;
      } else if (status.code() == StatusCode::kInvalidArgument) {
        kind = FailureClass::kMalformed;
      }
      return Failure{kind, fmt::format("after {:.1f} s: {}", end_s - o.arrival_s, status.message())};
    }
    if (ex.status == 429 || ex.status == 400) {
      const json error = json::parse(ex.raw, nullptr, false);
      std::string code;
      if (!error.is_discarded() && error.contains("error") && error["error"].is_object() &&
          error["error"].value("code", json()).is_string()) {
        code = error["error"]["code"].get<std::string>();
      }
      if (ex.status == 400 && code != "context-length" && code != "context_length_exceeded") {
        return Failure{FailureClass::kHttpError, fmt::format("HTTP 400: {}", ex.raw.substr(0, 300))};
      }
      o.rejected = reason_from_code(code, ex.status);
      o.finish_s = o.arrival_s;
      return std::nullopt;
    }
    if (ex.status != 200) {
      return Failure{FailureClass::kHttpError, fmt::format("HTTP {}: {}", ex.status, ex.raw.substr(0, 300))};
    }
    if (!ex.done || ex.chunk_s.empty())
      return Failure{FailureClass::kConnectionClosed, "the stream ended early"};
    const trace::Request& r = trace_[ex.index];
    if (options_.check_mock_output) {
      if (const std::string expected = mock_text(static_cast<uint64_t>(r.line), r.output_tokens);
          ex.text != expected) {
        size_t at = 0;
        while (at < ex.text.size() && at < expected.size() && ex.text[at] == expected[at]) ++at;
        return Failure{FailureClass::kWrongOutput,
                       fmt::format("the answer ({} bytes) is not the mock model's ({} bytes) from byte {}",
                                   ex.text.size(), expected.size(), at)};
      }
    }
    o.ttft_s = ex.chunk_s.front() - o.arrival_s;
    o.finish_s = end_s;
    o.output_tokens =
        ex.completion_tokens >= 0 ? ex.completion_tokens : static_cast<int64_t>(ex.chunk_s.size());
    if (ex.chunk_s.size() >= 2) {
      std::vector<double> gaps;
      for (size_t i = 1; i < ex.chunk_s.size(); ++i) gaps.push_back(ex.chunk_s[i] - ex.chunk_s[i - 1]);
      const engine::TokenGaps g = engine::tbt_of_gaps(gaps);
      o.tbt_s = g.tbt_s;
      o.max_token_gap_s = g.max_gap_s;
    }
    return std::nullopt;
  }

  std::span<const trace::Request> trace_;
  const ReplayOptions& options_;
  ReplayResult& out_;
  Clock::time_point start_;
  // Each exchange's SSE parser, made at its first piece of body (client thread only).
  std::unordered_map<const Exchange*, std::unique_ptr<SseParser>> parsers_;
  std::mutex mu_;
  std::condition_variable all_done_;
  int64_t in_flight_ = 0;
  int64_t finished_ = 0;
  std::map<uint64_t, std::shared_ptr<Exchange>> live_;  // exchanges in flight by client id (under mu_)
  bool watchdog_stop_ = false;
  std::condition_variable watchdog_wake_;
  std::unique_ptr<HttpClient> client_;  // last: destroyed (its thread joined) before what its callbacks use
};

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
      tokens.push_back(prompt_token(id, base + t, vocab_size));
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
  raise_open_file_limit();
  Replayer(trace, options, out).run();
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
