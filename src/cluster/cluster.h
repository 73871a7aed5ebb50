// What the HTTP front end needs of a cluster, whether it runs in this process (LocalCluster) or as separate
// prefill and decode processes (serve::RemoteCluster): submit a tokenized request, hear its tokens, cancel
// it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/instance_id.h"
#include "conductor/conductor.h"
#include "kv/block_key.h"
#include "model/logprobs.h"

namespace crescent::cluster {

/// How a request ended, for its owner.
struct RequestSummary {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose KV was reused (prefix hit)
  InstanceId prefill_instance = 0;
  InstanceId decode_instance = 0;
};

/// What the cluster tells a request's owner, from the cluster's thread (keep them short: post elsewhere;
/// never call back into the cluster from one, cancel() included: it holds its lock). After on_done or
/// on_error nothing more comes.
struct RequestCallbacks {
  /// New output tokens, in order, with their logprobs when the request asked for them
  /// (ClusterRequest::top_logprobs: one per token; else empty). Returning false stops the request there (the
  /// owner saw EOS or a stop string): its instances drop it and on_done follows at once.
  std::function<bool(std::span<const int64_t> tokens, std::span<const model::TokenLogprobs> logprobs)>
      on_tokens;
  std::function<void(const RequestSummary& summary)> on_done;  // the last token was delivered
  /// The request failed after it was accepted: `code` says how ("instance_down": an instance serving it went
  /// down; "kv_transfer_failed": its KV did not reach decode in time, or failed its check; "prefill_failed":
  /// its prefill instance could not run or ship it; "queue_timeout", "prefill_timeout",
  /// "kv_handoff_timeout": its prefill instance did not start it, finish it, or hand its KV to decode by the
  /// stage's deadline; "decode_timeout": its decode instance gave no token for the decoding stage's timeout:
  /// conductor_core.h, RequestStage), `message` says why.
  std::function<void(const std::string& code, const std::string& message)> on_error;
};

/// The request as the cluster takes it.
struct ClusterRequest {
  std::vector<int64_t> prompt_token_ids;
  int64_t max_tokens = 1;  // at most this many are generated (fewer when on_tokens stops it)
  uint64_t seed = 0;       // the sampler's (the mock's tokens are a function of it)
  double temperature = 1;  // 0: greedy; OpenAI's range [0, 2]
  double top_p = 1;        // (0, 1]
  /// model::kNoLogprobs, or 0..model::kMaxTopLogprobs: each token comes with its logprobs and this many
  /// most likely alternatives (an executor with a distribution only: the cpu executor).
  int32_t top_logprobs = model::kNoLogprobs;
  /// Output tokens the request had before this placement (a stream moved off a decode instance that went
  /// down: its prompt then ends with them, and max_tokens counts what is left). Its sampler and the mock
  /// model go on from there, so the tokens are those an undisturbed run gives.
  int64_t output_offset = 0;
};

/// What the front end asks of whatever serves behind it (a Cluster, or router mode's engines:
/// serve/relay.h) besides requests. Thread-safe.
class ServingStatus {
 public:
  virtual ~ServingStatus() = default;
  /// KV tokens a request may hold at most (prompt + output): a decode instance's HBM.
  virtual int64_t max_context_tokens() const = 0;
  /// Requests accepted and not yet finished, failed or cancelled.
  virtual size_t requests_in_flight() const = 0;
  /// GET /metrics: the Prometheus text format (serve_metrics.h), with the current loads.
  virtual std::string metrics_text() const = 0;
  /// Instances the Conductor may place on now: prefill and decode (GET /health is 503 while either is 0).
  virtual std::pair<uint32_t, uint32_t> instances_up() const = 0;
};

/// A cluster behind the front end. Thread-safe.
class Cluster : public ServingStatus {
 public:
  /// Places `request` (Conductor::schedule at the current time). Accepted: its tokens follow through
  /// `callbacks` and `id` names it for cancel(). Refused: the decision says why; no callback comes.
  virtual conductor::Decision submit(ClusterRequest request, RequestCallbacks callbacks, uint64_t& id) = 0;
  /// Stops request `id` wherever it is and frees its KV; no callback comes afterwards. No-op when finished.
  virtual void cancel(uint64_t id) = 0;
};

}  // namespace crescent::cluster
