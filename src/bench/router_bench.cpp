#include "bench/router_bench.h"

#include <fmt/format.h>
#include <pthread.h>
#include <time.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/json_util.h"
#include "common/percentile.h"
#include "common/process_usage.h"
#include "kv/block_key.h"
#include "router/engine_body.h"
#include "router/router.h"
#include "serve/frontend.h"
#include "serve/http_client.h"
#include "serve/http_server.h"

namespace crescent::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr const char* kModel = "bench-model";
constexpr int64_t kBlockSizeTokens = 16;           // the stand-ins' vLLM-like blocks
constexpr int64_t kEngineBlocks = 100'000;         // their cache_config_info num_gpu_blocks
constexpr int64_t kEngineContextTokens = 1 << 22;  // their max_model_len: never the limit here
constexpr size_t kColdTokenizeSamples = 16;        // prompts tokenized with an empty word cache
constexpr double kAnswerWaitS = 60;                // the longest wait for the answers after the last send

double elapsed_s(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The CPU clock of the thread that first calls capture() (an HTTP server's or client's event loop thread,
// found from inside one of its handlers or callbacks).
class ThreadCpuClock {
 public:
  void capture() {
    if (known_.load(std::memory_order_acquire)) return;
    std::call_once(once_, [&] {
      if (::pthread_getcpuclockid(::pthread_self(), &id_) == 0) known_.store(true, std::memory_order_release);
    });
  }
  // CPU seconds the thread has used so far; 0 while it is unknown. REQUIRES: the thread is alive.
  double seconds() const {
    if (!known_.load(std::memory_order_acquire)) return 0;
    timespec t{};
    if (::clock_gettime(id_, &t) != 0) return 0;
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
  }

 private:
  std::once_flag once_;
  std::atomic<bool> known_{false};
  clockid_t id_{};
};

// CPU seconds the calling thread has used.
double this_thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

Percentiles percentiles(std::vector<double> samples, double scale) {
  Percentiles p;
  p.count = samples.size();
  if (samples.empty()) return p;
  std::sort(samples.begin(), samples.end());
  p.p50 = nearest_rank(samples, 50) * scale;
  p.p90 = nearest_rank(samples, 90) * scale;
  p.p99 = nearest_rank(samples, 99) * scale;
  p.max = samples.back() * scale;
  return p;
}

// ---- Prompts ---------------------------------------------------------------------------------------------

// `bytes` of `corpus` from about `start` on (moved to the next UTF-8 lead byte; wrapping around to its
// beginning after a blank line), cut at a UTF-8 boundary.
std::string passage(const std::string& corpus, size_t start, size_t bytes) {
  const auto continuation = [&](size_t i) { return (static_cast<unsigned char>(corpus[i]) & 0xC0) == 0x80; };
  start %= corpus.size();
  while (start < corpus.size() && continuation(start)) ++start;
  if (start == corpus.size()) start = 0;
  std::string out;
  out.reserve(bytes + 4);
  while (out.size() < bytes) {
    out.append(corpus, start, bytes - out.size());
    if (out.size() < bytes) out += "\n\n";
    start = 0;
  }
  out.resize(bytes);
  size_t end = out.size();
  while (end > 0 && (static_cast<unsigned char>(out[end - 1]) & 0xC0) == 0x80) --end;
  // `end` is at a lead byte's position + 1 or after ASCII; drop a lead byte whose sequence was cut.
  if (end > 0) {
    const auto lead = static_cast<unsigned char>(out[end - 1]);
    const size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (end - 1 + length > out.size())
      end -= 1;
    else
      end = end - 1 + length;
  }
  out.resize(end);
  return out;
}

struct Workload {
  std::vector<std::string> prompts;  // probe, warm-up, then measured
  std::vector<std::string> bodies;   // their /v1/completions bodies
  std::vector<double> offsets_s;     // each one's send time from the start of the load (probe: 0)
  size_t warmup = 0;                 // requests after the probe that are not measured
};

Workload make_workload(const RouterBenchOptions& o) {
  std::mt19937_64 rng(o.seed);
  const std::string& corpus = o.corpus_text;
  const auto prompt_bytes = static_cast<size_t>(o.prompt_bytes);
  const auto prefix_bytes = static_cast<size_t>(static_cast<double>(prompt_bytes) * o.shared_prefix_share);
  std::vector<std::string> prefixes;
  for (uint32_t k = 0; k < o.shared_prefixes; ++k) prefixes.push_back(passage(corpus, rng(), prefix_bytes));

  Workload w;
  w.warmup = static_cast<size_t>(std::llround(o.warmup_s * o.rate_per_s));
  const auto measured = static_cast<size_t>(std::max<long long>(1, std::llround(o.seconds * o.rate_per_s)));
  const size_t total = 1 + w.warmup + measured;
  std::exponential_distribution<double> gap(o.rate_per_s);
  double at_s = 0;
  for (size_t i = 0; i < total; ++i) {
    std::string prompt = prefixes[rng() % prefixes.size()];
    prompt += fmt::format("\n\nRequest {}:\n", i);
    if (prompt.size() < prompt_bytes) prompt += passage(corpus, rng(), prompt_bytes - prompt.size());
    json body = {{"model", kModel}, {"prompt", prompt}, {"max_tokens", o.max_tokens}, {"stream", true}};
    w.bodies.push_back(body.dump());
    w.prompts.push_back(std::move(prompt));
    if (i > 1) at_s += o.spacing == ArrivalSpacing::kPoisson ? gap(rng) : 1 / o.rate_per_s;
    w.offsets_s.push_back(at_s);
  }
  return w;
}

// ---- Stand-in engines
// --------------------------------------------------------------------------------------

serve::HttpResponse text_response(std::string content_type, std::string body) {
  serve::HttpResponse r;
  r.content_type = std::move(content_type);
  r.body = std::move(body);
  return r;
}

// A vLLM-like engine that answers at once: its completions are `events` SSE chunks of one word, then [DONE],
// whatever the request asked (it does not read the body).
serve::HttpHandler stand_in_engine(int64_t events, ThreadCpuClock& clock) {
  std::string stream;
  for (int64_t k = 0; k < events; ++k) {
    stream += fmt::format(
        "data: {{\"id\":\"cmpl-bench\",\"object\":\"text_completion\",\"created\":0,\"model\":\"{}\","
        "\"choices\":[{{\"index\":0,\"text\":\" word\",\"logprobs\":null,\"finish_reason\":{}}}]}}\n\n",
        kModel, k + 1 == events ? "\"length\"" : "null");
  }
  stream += "data: [DONE]\n\n";
  const std::string models =
      json{{"object", "list"},
           {"data", {{{"id", kModel}, {"object", "model"}, {"max_model_len", kEngineContextTokens}}}}}
          .dump();
  const std::string metrics = fmt::format(
      "# TYPE vllm:cache_config_info "
      "gauge\nvllm:cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\"}} 1\n"
      "vllm:num_requests_running{{model_name=\"{}\"}} 0\n",
      kBlockSizeTokens, kEngineBlocks, kModel);
  return [stream, models, metrics, &clock](serve::HttpRequest request, serve::HttpResponder responder) {
    clock.capture();
    if (request.path == "/health") return responder.respond(text_response("application/json", "{}"));
    if (request.path == "/v1/models") return responder.respond(text_response("application/json", models));
    if (request.path == "/metrics")
      return responder.respond(text_response("text/plain; version=0.0.4", metrics));
    if (request.path == "/v1/completions" && request.method == "POST") {
      responder.start_stream();
      responder.write(stream);
      return responder.end();
    }
    serve::HttpResponse missing = text_response("application/json", R"({"error":"no such route"})");
    missing.status = 404;
    responder.respond(std::move(missing));
  };
}

// ---- The load generator
// ------------------------------------------------------------------------------------

// One request's fate, written on the client's thread.
struct Exchange {
  Clock::time_point scheduled, sent, ended;
  int status = 0;
  bool done = false;  // its stream ended with [DONE]
  bool ok = false;    // a whole 200 answer with [DONE]
  std::unique_ptr<serve::SseParser> sse;
};

class LoadGenerator {
 public:
  LoadGenerator(int port, size_t requests) : port_(port), exchanges_(requests) {
    client_ = serve::HttpClient::start();
  }

  // Sends request `i` with `body` now.
  void send(size_t i, std::string body, Clock::time_point scheduled) {
    Exchange& e = exchanges_[i];
    e.scheduled = scheduled;
    e.sse = std::make_unique<serve::SseParser>([&e](std::string_view data) {
      if (data == "[DONE]") e.done = true;
    });
    serve::HttpClientRequest request;
    request.host = "127.0.0.1";
    request.port = static_cast<uint16_t>(port_);
    request.target = "/v1/completions";
    request.body = std::move(body);
    serve::HttpClientCallbacks callbacks;
    callbacks.on_head = [this, &e](int status, const auto&) {
      client_clock_.capture();
      e.status = status;
      return true;
    };
    callbacks.on_body = [&e](std::string_view piece) { return e.sse->feed(piece).ok(); };
    callbacks.on_end = [this, &e](const Status& status) {
      client_clock_.capture();
      e.ended = Clock::now();
      e.ok = status.ok() && e.status == 200 && e.done;
      e.sse.reset();
      std::lock_guard lock(mu_);
      ++ended_;
      cv_.notify_all();
    };
    e.sent = Clock::now();
    client_->send(std::move(request), std::move(callbacks));
  }

  // Waits until `n` exchanges ended or `timeout_s` passed; the number ended.
  size_t wait_for(size_t n, double timeout_s) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return ended_ >= n; });
    return ended_;
  }

  const std::vector<Exchange>& exchanges() const { return exchanges_; }
  const ThreadCpuClock& client_clock() const { return client_clock_; }
  void stop() { client_.reset(); }  // every exchange still open ends (cancelled)

 private:
  int port_;
  std::vector<Exchange> exchanges_;
  ThreadCpuClock client_clock_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t ended_ = 0;
  std::unique_ptr<serve::HttpClient> client_;  // last: destroyed first, its callbacks then done
};

// ---- Stages alone
// ------------------------------------------------------------------------------------------

// Runs `body` on a new thread (whose thread-local caches are empty) and waits for it.
void on_fresh_thread(const std::function<void()>& body) {
  std::thread thread(body);
  thread.join();
}

// The sum and count of the router's crescent_conductor_decision_seconds histogram in `metrics` (0, 0 when
// absent).
std::pair<double, double> decision_sum_count(const std::string& metrics) {
  const auto value = [&](std::string_view name) {
    const size_t at = metrics.find(std::string("\n") + std::string(name) + " ");
    if (at == std::string::npos) return 0.0;
    return std::strtod(metrics.c_str() + at + name.size() + 2, nullptr);
  };
  return {value("crescent_conductor_decision_seconds_sum"),
          value("crescent_conductor_decision_seconds_count")};
}

// Times `stage` on each measured prompt's body on a new thread (empty caches), after running it on the
// probe's and the warm-up's: as the front end's thread runs it, warmed by the same requests.
Percentiles time_stage(const Workload& w, const std::function<void(size_t)>& stage) {
  const size_t first = 1 + w.warmup;
  std::vector<double> seconds;
  std::thread thread([&] {
    for (size_t i = 0; i < first; ++i) stage(i);
    for (size_t i = first; i < w.prompts.size(); ++i) {
      const auto t0 = Clock::now();
      stage(i);
      seconds.push_back(elapsed_s(t0, Clock::now()));
    }
  });
  thread.join();
  return percentiles(seconds, 1e6);
}

// A new front-end tokenizer (empty caches) with a prefix cache of `prefix_cache_bytes`:
// options.make_tokenizer's, or the bytes of the prompt; null when make_tokenizer could not make one.
std::shared_ptr<const model::Tokenizer> new_tokenizer(const RouterBenchOptions& options,
                                                      size_t prefix_cache_bytes) {
  return options.make_tokenizer ? options.make_tokenizer(prefix_cache_bytes)
                                : std::shared_ptr<const model::Tokenizer>(model::byte_tokenizer());
}

void time_stages(const RouterBenchOptions& options, const Workload& w, RouterBenchReport& report) {
  // New tokenizers, so the stages' caches hold what the front end's held when it met the measured prompts:
  // the probe's and the warm-up's (time_stage runs them first), not the measured ones.
  const std::shared_ptr<const model::Tokenizer> tokenizer =
      new_tokenizer(options, options.token_prefix_cache_bytes);
  const std::shared_ptr<const model::Tokenizer> no_prefix_cache = new_tokenizer(options, 0);
  if (tokenizer == nullptr || no_prefix_cache == nullptr) return;  // checked before the run: not timed
  // What the front end and the router do with a request, one step at a time, each step's input ready.
  std::vector<std::string> bodies(w.prompts.size());
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    bodies[i] = json{{"model", kModel}, {"prompt", w.prompts[i]}, {"max_tokens", 4}, {"stream", true}}.dump();
  }
  report.stages.push_back({"parse body", "the request body into a JSON tree (parse_json_bounded, depth 64)",
                           time_stage(w, [&](size_t i) { (void)parse_json_bounded(bodies[i], 64); })});
  report.stages.push_back({"tokenize",
                           "the prompt, its caches (words, prefixes) warmed by the warm-up prompts",
                           time_stage(w, [&](size_t i) { (void)tokenizer->encode(w.prompts[i]); })});
  if (options.make_tokenizer && options.token_prefix_cache_bytes > 0) {
    report.stages.push_back({"tokenize, no prefix cache", "the same, the tokenizer without its prefix cache",
                             time_stage(w, [&](size_t i) { (void)no_prefix_cache->encode(w.prompts[i]); })});
  }
  std::vector<std::vector<int64_t>> ids(w.prompts.size());
  for (size_t i = 0; i < w.prompts.size(); ++i) ids[i] = tokenizer->encode(w.prompts[i]);
  const BlockKey seed = XXH3_64bits(kModel, std::string_view(kModel).size());
  report.stages.push_back(
      {"block keys", "the prompt's block keys (kv::prompt_block_keys, 16 tokens a block)",
       time_stage(w, [&](size_t i) { (void)kv::prompt_block_keys(ids[i], kBlockSizeTokens, seed); })});
  std::vector<serve::RelayedRequest> relayed(w.prompts.size());
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    relayed[i].body = json::parse(bodies[i]);
    relayed[i].prompt_token_ids = ids[i];
    relayed[i].stream = true;
  }
  report.stages.push_back(
      {"engine body", "the engine's body, the prompt as token ids (router::engine_body)",
       time_stage(w, [&](size_t i) { (void)router::engine_body(relayed[i], true, false, nullptr); })});
  // A prompt seen for the first time, on a thread whose caches are empty (after a one-byte encode, so
  // allocating them is not counted), by a tokenizer without a prefix cache.
  const std::shared_ptr<const model::Tokenizer>& cold = no_prefix_cache;
  const size_t first = 1 + w.warmup;
  std::vector<double> cold_s;
  for (size_t i = first; i < w.prompts.size() && cold_s.size() < kColdTokenizeSamples; ++i) {
    on_fresh_thread([&] {
      (void)cold->encode("x");
      const auto t0 = Clock::now();
      const std::vector<int64_t> encoded = cold->encode(w.prompts[i]);
      cold_s.push_back(elapsed_s(t0, Clock::now()));
    });
  }
  report.stages.push_back(
      {"tokenize cold",
       fmt::format("{} measured prompts, each on a new thread (empty caches)", cold_s.size()),
       percentiles(cold_s, 1e6)});
}

Status check_router_bench_options(const RouterBenchOptions& o) {
  const auto bad = [](const std::string& what) { return Status::invalid_argument("bench router: " + what); };
  if (o.corpus_text.size() < 1024) return bad("the corpus text is under 1 KiB");
  if (o.prompt_bytes < 256) return bad(fmt::format("prompt_bytes {} is under 256", o.prompt_bytes));
  if (o.prompt_bytes > (16 << 20) / 2)
    return bad(fmt::format("prompt_bytes {} is over 8 MiB", o.prompt_bytes));
  if (!(o.rate_per_s > 0) || !(o.seconds > 0) || !(o.warmup_s >= 0)) {
    return bad("rate_per_s and seconds must be > 0, warmup_s >= 0");
  }
  const double requests = o.rate_per_s * (o.seconds + o.warmup_s);
  if (requests * static_cast<double>(o.prompt_bytes) * 2.5 > 8.0 * (1ull << 30)) {
    return bad(fmt::format("{:.0f} requests of {} bytes would hold over 8 GiB of prompts and bodies",
                           requests, o.prompt_bytes));
  }
  if (o.engines < 1 || o.engines > 64) return bad(fmt::format("engines {} is outside 1..64", o.engines));
  if (o.shared_prefixes < 1) return bad("shared_prefixes must be >= 1");
  if (!(o.shared_prefix_share >= 0 && o.shared_prefix_share <= 0.95)) {
    return bad(fmt::format("shared_prefix_share {} is outside 0..0.95", o.shared_prefix_share));
  }
  if (o.max_tokens < 1 || o.max_tokens > 64)
    return bad(fmt::format("max_tokens {} is outside 1..64", o.max_tokens));
  return Status::ok_status();
}

}  // namespace

Result<RouterBenchReport> run_router_bench(const RouterBenchOptions& options) {
  CRESCENT_RETURN_IF_ERROR(check_router_bench_options(options));
  const std::shared_ptr<const model::Tokenizer> tokenizer =
      new_tokenizer(options, options.token_prefix_cache_bytes);
  if (tokenizer == nullptr) return Status::invalid_argument("bench router: the tokenizer could not be made");
  Workload w = make_workload(options);
  RouterBenchReport report;
  report.tokenizer_kind = std::string(tokenizer->kind());

  // The engines.
  std::deque<ThreadCpuClock> engine_clocks(options.engines);
  std::vector<std::unique_ptr<serve::HttpServer>> engines;
  router::RouterOptions router_options;
  for (uint32_t k = 0; k < options.engines; ++k) {
    auto server =
        serve::HttpServer::start({.port = 0}, stand_in_engine(options.max_tokens, engine_clocks[k]));
    if (!server.ok()) return server.status();
    router::EngineEntry entry;
    entry.name = fmt::format("engine-{}", k);
    entry.url = fmt::format("http://127.0.0.1:{}", (*server)->port());
    entry.role = router::EngineRole::kBoth;
    entry.model = kModel;
    entry.block_size_tokens = kBlockSizeTokens;
    router_options.engines.push_back(std::move(entry));
    engines.push_back(std::move(*server));
  }
  // The router, as `serve conductor --engines` starts it.
  router_options.config = options.config;
  router_options.block_key_seed = XXH3_64bits(kModel, std::string_view(kModel).size());
  router_options.startup_timeout_s = 10;
  router_options.log_engines = false;
  auto router = router::Router::start(std::move(router_options));
  if (!router.ok()) return router.status();
  serve::FrontendOptions frontend;
  frontend.model_name = kModel;
  frontend.tokenizer = tokenizer;
  frontend.token_ids_within_vocabulary = options.make_tokenizer != nullptr;
  ThreadCpuClock front_clock;
  serve::HttpHandler handler = serve::make_router_frontend(**router, frontend);
  auto front = serve::HttpServer::start(
      {.port = 0}, [&front_clock, handler](serve::HttpRequest request, serve::HttpResponder responder) {
        front_clock.capture();
        handler(std::move(request), std::move(responder));
      });
  if (!front.ok()) return front.status();

  // The load: a probe (the path works; every thread's clock is known), the warm-up, then the measured part.
  LoadGenerator load((*front)->port(), w.bodies.size());
  std::vector<std::string>& bodies = w.bodies;
  load.send(0, std::move(bodies[0]), Clock::now());
  if (load.wait_for(1, 30) < 1 || !load.exchanges()[0].ok) {
    const Exchange& e = load.exchanges()[0];
    return Status::unavailable(
        fmt::format("bench router: the first request through the router failed (HTTP {}{})", e.status,
                    e.ended == Clock::time_point() ? ", no answer in 30 s" : ""));
  }
  const size_t first = 1 + w.warmup;
  const auto start = Clock::now();
  long faults_start = 0;
  double cpu_start = 0, sender_cpu_start = 0, client_cpu_start = 0, front_cpu_start = 0,
         engines_cpu_start = 0;
  std::pair<double, double> decisions_start{0, 0};
  const auto engines_cpu = [&] {
    double s = 0;
    for (const ThreadCpuClock& c : engine_clocks) s += c.seconds();
    return s;
  };
  for (size_t i = 1; i < bodies.size(); ++i) {
    if (i == first) {
      cpu_start = process_cpu_seconds();
      faults_start = process_minor_page_faults();
      sender_cpu_start = this_thread_cpu_seconds();
      client_cpu_start = load.client_clock().seconds();
      front_cpu_start = front_clock.seconds();
      engines_cpu_start = engines_cpu();
      decisions_start = decision_sum_count((*router)->metrics_text());
    }
    const auto scheduled =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(w.offsets_s[i]));
    std::this_thread::sleep_until(scheduled);
    load.send(i, std::move(bodies[i]), scheduled);
  }
  load.wait_for(bodies.size(), kAnswerWaitS);
  const double cpu_s = process_cpu_seconds() - cpu_start;
  const long faults = process_minor_page_faults() - faults_start;
  const double sender_cpu_s = this_thread_cpu_seconds() - sender_cpu_start;
  const double client_cpu_s = load.client_clock().seconds() - client_cpu_start;
  const double front_cpu_s = front_clock.seconds() - front_cpu_start;
  const double engines_cpu_s = engines_cpu() - engines_cpu_start;
  std::vector<double> overhead_s = (*router)->take_overhead_samples_s();
  const std::pair<double, double> decisions_end = decision_sum_count((*router)->metrics_text());
  if (decisions_end.second > decisions_start.second) {
    report.placement_us_mean =
        (decisions_end.first - decisions_start.first) / (decisions_end.second - decisions_start.second) * 1e6;
  }
  load.stop();
  (*front)->stop();
  router->reset();
  for (auto& e : engines) e->stop();

  // The measured requests.
  std::vector<double> end_to_end_s, lag_s;
  Clock::time_point first_sent = Clock::time_point::max(), last_sent{}, last_end{};
  for (size_t i = first; i < load.exchanges().size(); ++i) {
    const Exchange& e = load.exchanges()[i];
    ++report.requests_sent;
    first_sent = std::min(first_sent, e.sent);
    last_sent = std::max(last_sent, e.sent);
    lag_s.push_back(elapsed_s(e.scheduled, e.sent));
    if (!e.ok) {
      ++report.failed;
      continue;
    }
    ++report.answered;
    last_end = std::max(last_end, e.ended);
    end_to_end_s.push_back(elapsed_s(e.sent, e.ended));
  }
  const auto n = static_cast<double>(report.requests_sent);
  if (report.requests_sent > 1) report.offered_per_s = (n - 1) / elapsed_s(first_sent, last_sent);
  if (report.answered > 0) {
    report.achieved_per_s = static_cast<double>(report.answered) / elapsed_s(first_sent, last_end);
  }
  // The router's samples are in the order it sent the requests on: the probe's and the warm-up's first.
  if (overhead_s.size() > first) {
    overhead_s.erase(overhead_s.begin(), overhead_s.begin() + static_cast<std::ptrdiff_t>(first));
  } else {
    overhead_s.clear();
  }
  report.overhead_us = percentiles(overhead_s, 1e6);
  report.end_to_end_us = percentiles(end_to_end_s, 1e6);
  report.send_lag_us = percentiles(lag_s, 1e6);
  report.cpu_us_per_request = cpu_s / n * 1e6;
  report.router_cpu_us_per_request = (cpu_s - engines_cpu_s - client_cpu_s - sender_cpu_s) / n * 1e6;
  report.front_end_thread_cpu_us_per_request = front_cpu_s / n * 1e6;
  report.page_faults_per_request = static_cast<double>(faults) / n;
  if (const auto stats = model::token_prefix_cache_stats(*tokenizer)) report.token_prefix_cache = *stats;
  double tokens = 0;
  for (size_t i = first; i < w.prompts.size(); ++i)
    tokens += static_cast<double>(tokenizer->encode(w.prompts[i]).size());
  report.prompt_tokens_mean = tokens / n;

  time_stages(options, w, report);
  return report;
}

}  // namespace crescent::bench
