#include "serve/http_profile_target.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <thread>
#include <vector>

#include "serve/http_client_error.h"

namespace crescent::serve {
namespace {

using nlohmann::json;
using ProfileClock = std::chrono::steady_clock;

// Bytes of an answer's body quoted in an error.
constexpr size_t kProfileBodyExcerptBytes = 300;

std::chrono::microseconds as_duration(double seconds) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(seconds));
}

double seconds_between(ProfileClock::time_point from, ProfileClock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// The start of `body` on one line, for an error's text.
std::string excerpt(const std::string& body) {
  std::string text = body.substr(0, kProfileBodyExcerptBytes);
  std::replace(text.begin(), text.end(), '\n', ' ');
  return body.size() > kProfileBodyExcerptBytes ? text + "..." : text;
}

// What one streamed request saw: when each token's chunk arrived.
struct StreamTimes {
  std::vector<ProfileClock::time_point> chunks;
  Status status;
};

class HttpTarget final : public model::ProfileTarget {
 public:
  HttpTarget(HttpProfileOptions options, std::string host, int port)
      : options_(std::move(options)), host_(std::move(host)), port_(port), random_(options_.seed) {}

  // GET /v1/models lists the model.
  Status check_model() {
    httplib::Client client = make_client();
    const auto res = client.Get("/v1/models", headers());
    if (!res) {
      return Status::unavailable(fmt::format("cannot reach {}: {} ({})", options_.url,
                                             httplib::to_string(res.error()),
                                             what_failed(res.error(), options_.timeout_s)));
    }
    const json models = json::parse(res->body, nullptr, false);
    if (res->status != 200 || models.is_discarded() || !models.contains("data") ||
        !models["data"].is_array()) {
      return Status::unavailable(fmt::format("{}/v1/models: HTTP {}, not a list of models: {}", options_.url,
                                             res->status, excerpt(res->body)));
    }
    std::vector<std::string> served;
    for (const json& m : models["data"]) {
      if (m.is_object() && m.contains("id") && m["id"].is_string())
        served.push_back(m["id"].get<std::string>());
    }
    if (std::ranges::find(served, options_.model) != served.end()) return Status();
    return Status::not_found(
        fmt::format("{} does not serve model \"{}\"; it serves: {}", options_.url, options_.model,
                    served.empty() ? "(none)" : fmt::format("\"{}\"", fmt::join(served, "\", \""))));
  }

  Result<double> prefill_s(int64_t new_tokens, int64_t prefix_tokens) override {
    if (new_tokens < 1 || prefix_tokens < 0 || prefix_tokens % options_.block_size_tokens != 0) {
      return Status::invalid_argument(fmt::format(
          "profile over HTTP: a prefill of {} new tokens after {} cached ones (the prefix must be a "
          "multiple of the block size, {})",
          new_tokens, prefix_tokens, options_.block_size_tokens));
    }
    const std::vector<int64_t> prompt = random_prompt(prefix_tokens + new_tokens);
    if (prefix_tokens > 0) {  // cached: its blocks are in the engine's prefix cache when the prompt comes
      const std::vector<int64_t> prefix(prompt.begin(), prompt.begin() + prefix_tokens);
      if (Result<double> warmed = complete_one(prefix); !warmed.ok()) return warmed.status();
    }
    return complete_one(prompt);
  }

  Result<double> decode_s(int64_t batch, int64_t context_tokens) override {
    if (batch < 1 || context_tokens < 1) {
      return Status::invalid_argument(
          fmt::format("profile over HTTP: a decode batch of {} requests of {} tokens", batch, context_tokens));
    }
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t i = 0; i < batch; ++i) prompts.push_back(random_prompt(context_tokens));
    // Each prompt cached first, so the streamed requests' prefills are short and they decode together.
    for (const std::vector<int64_t>& prompt : prompts) {
      if (Result<double> warmed = complete_one(prompt); !warmed.ok()) return warmed.status();
    }
    std::vector<StreamTimes> streams(static_cast<size_t>(batch));
    {
      std::vector<std::jthread> threads;
      for (size_t i = 0; i < streams.size(); ++i) {
        threads.emplace_back([this, &prompts, &streams, i] { streams[i] = stream_one(prompts[i]); });
      }
    }
    for (const StreamTimes& s : streams) CRESCENT_RETURN_IF_ERROR(s.status);
    // The window in which every request of the batch is decoding.
    ProfileClock::time_point all_decoding = ProfileClock::time_point::min();
    ProfileClock::time_point one_done = ProfileClock::time_point::max();
    for (const StreamTimes& s : streams) {
      all_decoding = std::max(all_decoding, s.chunks.front());
      one_done = std::min(one_done, s.chunks.back());
    }
    double inside_s = 0, all_s = 0;
    int64_t inside = 0, all = 0;
    for (const StreamTimes& s : streams) {
      for (size_t i = 1; i < s.chunks.size(); ++i) {
        const double gap_s = seconds_between(s.chunks[i - 1], s.chunks[i]);
        all_s += gap_s;
        ++all;
        if (s.chunks[i - 1] >= all_decoding && s.chunks[i] <= one_done) {
          inside_s += gap_s;
          ++inside;
        }
      }
    }
    if (all == 0) {
      return Status::internal(
          fmt::format("{}: the streams of a decode batch of {} gave one token chunk each (max_tokens {})",
                      options_.url, batch, options_.decode_output_tokens));
    }
    return inside >= batch ? inside_s / static_cast<double>(inside) : all_s / static_cast<double>(all);
  }

  Result<double> mixed_s(int64_t, int64_t, int64_t, int64_t) override {
    return Status::failed_precondition(
        "profile over HTTP: an iteration that decodes and prefills at once cannot be timed through the API");
  }

 private:
  httplib::Client make_client() const {
    httplib::Client client(host_, port_);
    client.set_connection_timeout(as_duration(std::min(10.0, options_.timeout_s)));
    client.set_read_timeout(as_duration(options_.timeout_s));
    client.set_write_timeout(as_duration(options_.timeout_s));
    return client;
  }

  httplib::Headers headers() const {
    httplib::Headers h;
    if (!options_.api_key.empty()) h.emplace("Authorization", "Bearer " + options_.api_key);
    return h;
  }

  std::vector<int64_t> random_prompt(int64_t tokens) {
    std::uniform_int_distribution<int64_t> id(0, options_.vocab_size - 1);
    std::vector<int64_t> prompt(static_cast<size_t>(tokens));
    for (int64_t& t : prompt) t = id(random_);
    return prompt;
  }

  // The error of an exchange that got no answer.
  Status no_answer(const httplib::Result& res, double after_s) const {
    return Status::unavailable(fmt::format("{}/v1/completions: {} after {:.1f} s ({})", options_.url,
                                           httplib::to_string(res.error()), after_s,
                                           what_failed(res.error(), options_.timeout_s)));
  }

  // POSTs a non-streamed completion of `prompt` with max_tokens 1; the seconds from sending it to its whole
  // answer.
  Result<double> complete_one(const std::vector<int64_t>& prompt) {
    const json body = {{"model", options_.model}, {"prompt", prompt}, {"max_tokens", 1}, {"stream", false}};
    httplib::Client client = make_client();
    const auto start = ProfileClock::now();
    const auto res = client.Post("/v1/completions", headers(), body.dump(), "application/json");
    const double took_s = seconds_between(start, ProfileClock::now());
    if (!res) return no_answer(res, took_s);
    if (res->status != 200) {
      return Status::internal(fmt::format("{}/v1/completions (a prompt of {} tokens): HTTP {}: {}",
                                          options_.url, prompt.size(), res->status, excerpt(res->body)));
    }
    const json answer = json::parse(res->body, nullptr, false);
    if (answer.is_discarded() || !answer.contains("choices") || !answer["choices"].is_array() ||
        answer["choices"].empty()) {
      return Status::internal(fmt::format("{}/v1/completions: HTTP 200 but not a completion: {}",
                                          options_.url, excerpt(res->body)));
    }
    return took_s;
  }

  // Streams a completion of `prompt` (decode_output_tokens of them, ignore_eos): when each token's chunk
  // arrived. Called from a thread of its own (only reads options_).
  StreamTimes stream_one(const std::vector<int64_t>& prompt) const {
    const json body = {{"model", options_.model},
                       {"prompt", prompt},
                       {"max_tokens", options_.decode_output_tokens},
                       {"stream", true},
                       {"ignore_eos", true}};
    StreamTimes out;
    httplib::Client client = make_client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.headers = headers();
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    const auto start = ProfileClock::now();
    const auto deadline = start + as_duration(options_.timeout_s);
    std::string raw, pending, stream_error;  // raw: the body's first bytes, for an error's text
    bool done = false;
    // SSE events: "data: {chunk}" or "data: [DONE]", each ended by a blank line. A token's chunk is one with
    // text, or an empty one before the last (a server may hold a token's text back); the last chunk without
    // text only says why the answer ended (as serve::replay counts them).
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      const auto now = ProfileClock::now();
      if (raw.size() < kProfileBodyExcerptBytes) {
        raw.append(data, std::min(n, kProfileBodyExcerptBytes - raw.size()));
      }
      const size_t searched = pending.empty() ? 0 : pending.size() - 1;  // "\n\n" may straddle
      pending.append(data, n);
      for (size_t end, from = searched; (end = pending.find("\n\n", from)) != std::string::npos; from = 0) {
        std::string event = pending.substr(0, end);
        pending.erase(0, end + 2);
        if (!event.empty() && event.back() == '\r') event.pop_back();
        if (event.rfind("data:", 0) != 0) continue;
        const std::string payload = event.substr(event.rfind("data: ", 0) == 0 ? 6 : 5);
        if (payload == "[DONE]") {
          done = true;
          continue;
        }
        const json chunk = json::parse(payload, nullptr, false);
        if (chunk.is_discarded() || !chunk.is_object()) {
          stream_error = "an unparsable stream event: " + excerpt(payload);
          return false;
        }
        if (chunk.contains("error")) {
          stream_error = "an error event: " + excerpt(payload);
          return false;
        }
        if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) continue;
        const json& choice = chunk["choices"][0];
        const bool last = choice.contains("finish_reason") && !choice["finish_reason"].is_null();
        const bool text = choice.contains("text") && choice["text"].is_string() &&
                          !choice["text"].get<std::string>().empty();
        if (!last || text) out.chunks.push_back(now);
      }
      if (pending.size() > (1 << 20)) {
        stream_error = "a stream event longer than 1 MiB";
        return false;
      }
      if (now > deadline) {
        stream_error = fmt::format("no whole answer within {:g} s", options_.timeout_s);
        return false;
      }
      return true;
    };
    const auto res = client.send(req);
    const double took_s = seconds_between(start, ProfileClock::now());
    const auto failed = [&](const std::string& what) {
      return Status::unavailable(fmt::format("{}/v1/completions (streamed, a prompt of {} tokens): {}",
                                             options_.url, prompt.size(), what));
    };
    if (!stream_error.empty()) {
      out.status = failed(stream_error);
    } else if (!res) {
      out.status = no_answer(res, took_s);
    } else if (res->status != 200) {
      out.status = Status::internal(fmt::format("{}/v1/completions (streamed): HTTP {}: {}", options_.url,
                                                res->status, excerpt(raw.empty() ? res->body : raw)));
    } else if (!done || out.chunks.empty()) {
      out.status =
          failed(fmt::format("the stream ended early ({} token chunks, no [DONE])", out.chunks.size()));
    }
    return out;
  }

  const HttpProfileOptions options_;
  const std::string host_;
  const int port_;
  std::mt19937_64 random_;
};

}  // namespace

Result<std::unique_ptr<model::ProfileTarget>> http_profile_target(const HttpProfileOptions& options) {
  std::smatch m;
  if (!std::regex_match(options.url, m, std::regex(R"(http://([^:/\s]+):(\d{1,5})/?)"))) {
    return Status::invalid_argument(
        fmt::format("--url '{}': expected http://HOST:PORT (e.g. http://127.0.0.1:8000)", options.url));
  }
  const int port = std::stoi(m[2].str());
  if (port < 1 || port > 65535) {
    return Status::invalid_argument(fmt::format("--url '{}': port {} out of range", options.url, port));
  }
  if (options.model.empty()) return Status::invalid_argument("profile over HTTP: no served model named");
  if (options.block_size_tokens < 1) return Status::invalid_argument("--block-size must be >= 1");
  if (options.vocab_size < 1) return Status::invalid_argument("--vocab-size must be >= 1");
  if (options.decode_output_tokens < 2) {
    return Status::invalid_argument("profile over HTTP: a decode timing needs max_tokens >= 2");
  }
  if (!(options.timeout_s > 0)) return Status::invalid_argument("--request-timeout must be > 0");
  HttpProfileOptions normalized = options;
  if (normalized.url.back() == '/') normalized.url.pop_back();
  auto target = std::make_unique<HttpTarget>(std::move(normalized), m[1].str(), port);
  CRESCENT_RETURN_IF_ERROR(target->check_model());
  return std::unique_ptr<model::ProfileTarget>(std::move(target));
}

}  // namespace crescent::serve
