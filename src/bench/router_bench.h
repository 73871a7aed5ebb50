// The router bench (`crescent bench router`, docs/benchmarks.md "Router mode: routing overhead"): router
// mode's cost per request, in one process on loopback.
//   - `engines` stand-in engines: crescent's HttpServer answering /health, /v1/models, /metrics (vLLM's
//     cache_config_info: blocks of 16 tokens, 100,000 of them; no KV events, so the router tracks their
//     caches from what it routes) and /v1/completions with a short SSE stream, without reading the prompt;
//   - a router::Router over them (every engine `both`), its front end (serve::make_router_frontend) on an
//     HttpServer;
//   - an open-loop load generator (serve::HttpClient): streamed /v1/completions of prompt_bytes of text sent
//     at rate_per_s, Poisson arrivals (exponential gaps) or evenly spaced, whatever the answers do.
// Prompts are passages of `corpus_text`: each starts with one of `shared_prefixes` shared passages
// (shared_prefix_share of its bytes), then a line naming the request and a passage from a random place, so
// the Conductor's prefix matching finds real overlaps and every prompt is new.
// It reports the router's routing overhead (Router::take_overhead_samples_s: the front end having the whole
// request to its engine request sent, parsing and tokenizing included), the client's end-to-end latency,
// the achieved rate, CPU per request, and the stages of the path timed alone on the same prompts. Prints
// nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cluster/cluster_config.h"
#include "common/status.h"
#include "model/hf_tokenizer.h"
#include "model/tokenizer.h"

namespace crescent::bench {

/// How the load generator spaces its requests.
enum class ArrivalSpacing {
  kPoisson,  // exponential gaps of mean 1 / rate_per_s (seeded): an open-loop Poisson process
  kUniform,  // exactly 1 / rate_per_s apart
};

/// What `bench router` runs.
struct RouterBenchOptions {
  /// The router's config (its serve section's policy and admission; its profile, or its model and hardware,
  /// for the cost model), as `serve conductor --engines` resolves it.
  cluster::ClusterConfig config;
  /// Makes the front end's tokenizer (e.g. a tokenizer.json's) with a prefix cache of the given bytes (0:
  /// none), each call a new one with empty caches (the stages timed alone take their own), or null when it
  /// cannot (the bench then fails); make_tokenizer null: the bytes of the prompt.
  std::function<std::shared_ptr<const model::Tokenizer>(size_t prefix_cache_bytes)> make_tokenizer;
  /// The prefix cache of the run's tokenizer (model/hf_tokenizer.h); 0: none.
  size_t token_prefix_cache_bytes = model::kDefaultTokenPrefixCacheBytes;
  /// The text prompts are cut from (UTF-8; at least 1 KiB).
  std::string corpus_text;
  int64_t prompt_bytes =
      32768;                // each prompt's size in bytes (a UTF-8 boundary may take up to 3 off), >= 256
  double rate_per_s = 200;  // arrivals per second, > 0
  double seconds = 10;      // the measured part of the run, > 0
  double warmup_s = 1;      // sent first at the same rate, not measured (caches, connections), >= 0
  ArrivalSpacing spacing = ArrivalSpacing::kPoisson;
  uint32_t engines = 4;              // stand-in engines, 1..64
  uint32_t shared_prefixes = 8;      // distinct shared prefixes, >= 1
  double shared_prefix_share = 0.5;  // the share of a prompt's bytes its shared prefix is, 0..0.95
  int64_t max_tokens = 4;            // each request's; a stand-in answers with this many SSE events, 1..64
  uint64_t seed = 1;                 // prompts and arrivals
};

/// Nearest-rank percentiles of a set of samples, in the unit its field's name says.
struct Percentiles {
  size_t count = 0;
  double p50 = 0, p90 = 0, p99 = 0, max = 0;
};

/// One stage of the request path timed alone, on the measured prompts, on one thread whose caches the
/// warm-up prompts warmed.
struct StageTiming {
  std::string name;  // "tokenize", ...
  std::string what;  // what was timed, for reports
  Percentiles us;    // microseconds per prompt
};

/// Everything one router bench measured.
struct RouterBenchReport {
  std::string tokenizer_kind;     // model::Tokenizer::kind() of the front end's tokenizer
  double prompt_tokens_mean = 0;  // tokens per measured prompt
  size_t requests_sent = 0;       // measured requests (warm-up ones not counted)
  size_t answered = 0;            // of them, whole 200 answers ending in [DONE]
  size_t failed = 0;              // of them, anything else (an error status, a broken stream, a timeout)
  double offered_per_s = 0;       // requests_sent / the measured part's sending time
  double achieved_per_s = 0;      // answered / (last answer - first send)
  Percentiles overhead_us;        // the router's routing overhead, measured requests
  Percentiles end_to_end_us;      // client: send() called -> the whole streamed answer received
  Percentiles send_lag_us;        // client: send() called - its scheduled time (the generator's lag)
  double cpu_us_per_request = 0;  // the whole process (user + system, getrusage) / requests_sent
  /// The part of cpu_us_per_request spent outside the stand-in engines' and the load generator's threads:
  /// the front end's HTTP server, the router's client and threads.
  double router_cpu_us_per_request = 0;
  double front_end_thread_cpu_us_per_request = 0;  // of which the front end's HTTP server thread
  /// Minor page faults of the whole process (getrusage) / requests_sent: fresh memory touched per request,
  /// each fault a trip into the kernel that a virtual machine makes dear.
  double page_faults_per_request = 0;
  /// The front end's tokenizer's prefix cache over the whole run (probe and warm-up included); all 0 when it
  /// has none.
  model::TokenPrefixCache::Stats token_prefix_cache;
  /// The Conductor's placement (cluster::place: Algorithm 1 and its bookkeeping) in the run, mean
  /// microseconds per measured request, from the router's crescent_conductor_decision_seconds.
  double placement_us_mean = 0;
  std::vector<StageTiming> stages;  // the path's stages timed alone
};

/// Starts the engines, the router and its front end on free loopback ports, runs the load, stops them, then
/// times the stages alone. Errors: kInvalidArgument for options out of range (naming the field); the HTTP
/// servers' and the router's start errors. Requests that fail are counted, not an error.
Result<RouterBenchReport> run_router_bench(const RouterBenchOptions& options);

}  // namespace crescent::bench
