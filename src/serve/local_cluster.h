// A disaggregated cluster in one process, on the steady clock: the real Conductor over a ClusterState,
// prefill and decode instances that are engine::EngineCore with the mock executor, and KV hand-off delayed by
// the cost model's transfer time. It is the simulator's system run in real time, so the HTTP front end can
// serve before the instances become separate processes moving real KV bytes (issue 10 §2-§3, not done yet).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/block_key.h"
#include "common/status.h"
#include "conductor/conductor.h"
#include "sim/cluster_config.h"

namespace crescent::serve {

/// The keys of a prompt's full blocks: key[i] = xxh3_64(token ids of block i, seed = key[i-1]), key[-1] = 0,
/// so equal keys mean equal prefixes (paper §3.2.1). A trailing partial block has no key.
std::vector<BlockKey> prompt_block_keys(std::span<const int64_t> token_ids, int64_t block_size_tokens);

/// The mock model's output: a deterministic token (a byte: 'a'..'z' or ' ') for output position `index` of a
/// request with `seed`.
int64_t mock_token(uint64_t seed, int64_t index);

/// How a request ended, for its owner.
struct RequestSummary {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose KV was reused (prefix hit)
  InstanceId prefill_instance = 0;
  InstanceId decode_instance = 0;
};

/// What the cluster tells a request's owner, from its driver thread (keep them short: post elsewhere).
struct RequestCallbacks {
  std::function<void(std::span<const int64_t> tokens)> on_tokens;  // new output tokens, in order
  std::function<void(const RequestSummary& summary)> on_done;      // the last token was delivered
};

/// The request as the cluster takes it.
struct ClusterRequest {
  std::vector<int64_t> prompt_token_ids;
  int64_t max_tokens = 1;  // exactly this many are generated (the mock model never stops early)
  uint64_t seed = 0;
};

struct LocalClusterOptions {
  sim::ClusterConfig config;
  conductor::PrefillPolicy policy = conductor::PrefillPolicy::kGlobalCacheAware;
  conductor::Admission admission = conductor::Admission::kNone;
  int64_t block_size_tokens = 512;
  std::string model_name = "mock";  // the model_name label of the metrics
};

/// The cluster. Thread-safe: submit() and cancel() from any thread; callbacks come from its driver thread.
class LocalCluster {
 public:
  /// Validates the config (as the simulator does) and starts the driver thread.
  static Result<std::unique_ptr<LocalCluster>> start(const LocalClusterOptions& options);
  ~LocalCluster();

  /// Places `request` (Conductor::schedule at the current time). Accepted: its tokens follow through
  /// `callbacks` and `id` names it for cancel(). Refused: the decision says why; no callback comes.
  conductor::Decision submit(ClusterRequest request, RequestCallbacks callbacks, uint64_t& id);
  /// Stops request `id` wherever it is and frees its KV; no callback comes afterwards. No-op when finished.
  void cancel(uint64_t id);
  /// KV tokens a request may hold at most (prompt + output), a decode instance's HBM.
  int64_t max_context_tokens() const;
  /// Requests accepted and not yet finished or cancelled.
  size_t requests_in_flight() const;
  /// GET /metrics: the Prometheus text format (serve_metrics.h), with the current loads.
  std::string metrics_text() const;

  class Impl;

 private:
  explicit LocalCluster(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::serve
