// Router mode (docs/router.md): crescent's Conductor in front of inference engines it does not own
// (vLLM/SGLang-style OpenAI-compatible servers). Each engine is an instance of the Conductor's ClusterState:
// what its prefix cache holds comes from its KV events (or, without them, from what was routed to it:
// engine_cache.h), its queue from the Conductor's own predictions corrected by the first tokens it sees, its
// load from its /metrics and the requests in flight there. A request is placed as the paper does it
// (Algorithm 1 over estimated TTFT, admission by predicted load: cluster::place) and sent:
// - to a `both` engine whole, its answer relayed to the client as the engine writes it;
// - disaggregated, first to the prefill engine with vLLM's kv_transfer_params {do_remote_decode: true} and
//   max_tokens 1, then to the decode engine with the kv_transfer_params the prefill answer returned, whose
//   answer is relayed.
// An engine that stops answering (refused connections, /health failing) leaves the view: requests not yet
// answering there are placed again elsewhere, answers under way end with an error.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cluster/cluster_config.h"
#include "common/status.h"
#include "kv/block_key.h"
#include "perf/profile.h"
#include "router/engines.h"
#include "serve/relay.h"

namespace crescent::router {

struct RouterOptions {
  /// The engines at start (an engines file: check_engines holds for them).
  std::vector<EngineEntry> engines;
  /// SLOs, policy (placement_policy says which runs) and admission (config.serve), and the model and
  /// hardware of the cost model of engines without a profile.
  cluster::ClusterConfig config;
  /// The cost model of engines whose entry names no profile (`crescent profile --url`); none: the config's
  /// model and hardware (its roofline, or its own profile, e.g. --profile). An entry's profile times that
  /// engine alone (conductor::Conductor::set_instance_cost_models).
  std::optional<perf::Profile> default_profile;
  /// Seeds every block key (kv/block_key.h): the served model's identity.
  BlockKey block_key_seed = 0;
  double poll_interval_s = 1;         // each engine's /health and /metrics are read this often
  double connect_timeout_s = 2;       // an engine that does not accept a connection by then failed it
  double engine_idle_timeout_s = 600;  // an engine silent this long on a request (queue included) failed it
  double startup_timeout_s = 30;      // start() waits this long for every engine to answer
  int max_attempts = 3;               // placements of a request whose engine failed before answering
  bool log_engines = true;            // "engine gpu-0 up" / "... down: why" lines on stderr
  /// With an etcd endpoint ("http://HOST:PORT"): engines registered under etcd_prefix/engines/NAME (the
  /// value: an engine entry as in an engines file, JSON) join while the router runs, and leave when their key
  /// goes. Those of the engines file stay regardless.
  std::string etcd_endpoint;
  std::string etcd_prefix = "/crescent-serve";
};

/// The prefill policy the router places by: config.serve.policy, except that global-cache-aware is taken as
/// cache-aware when the engines share no kv_pool (an engine cannot load a prefix another engine computed).
/// With a pool, a prefix any engine holds (its KV events) is a fetch priced at the hardware's
/// network_bytes_per_s (paper §4.2, Algorithm 1).
conductor::PrefillPolicy placement_policy(const RouterOptions& options);

/// Router mode's EngineRelay. Thread-safe.
class Router final : public serve::EngineRelay {
 public:
  /// Checks every engine (its /v1/models lists its model; its /metrics block size, when it says one, is its
  /// entry's; its cache size is known when it publishes no KV events), waiting up to startup_timeout_s for
  /// each to answer, then starts routing. Errors (kInvalidArgument, kUnavailable) name the entry: an
  /// unreachable url, another model, a wrong block size, an unknown cache size, an unreadable profile.
  static Result<std::unique_ptr<Router>> start(RouterOptions options);
  ~Router() override;

  conductor::Decision relay(serve::RelayedRequest request, serve::RelayCallbacks callbacks,
                            uint64_t& id) override;
  void cancel(uint64_t id) override;
  int64_t max_context_tokens() const override;
  size_t requests_in_flight() const override;
  std::string metrics_text() const override;
  std::pair<uint32_t, uint32_t> instances_up() const override;

  /// The routing overhead of each request since the last take (seconds, in the order they were sent; at most
  /// 2^20 are kept): from the front end having the whole request (RelayedRequest::received) to its first
  /// engine request sent, parsing, tokenizing and placing it. Also the crescent_router_overhead_seconds
  /// histogram. For benchmarks (docs/benchmarks.md).
  std::vector<double> take_overhead_samples_s();

  class Impl;

 private:
  explicit Router(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::router
