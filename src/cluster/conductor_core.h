// The Conductor's side of a live cluster, written once for the in-process cluster (LocalCluster) and the
// multi-process one (serve::RemoteCluster): it places requests with the real Conductor over a ClusterState
// through the placement protocol (placement.h, the simulator's too), keeps
// each accepted request until its last token, turns instance events into tokens for the request's owner and
// into metrics, and fails the requests of an instance that went down or that overran a stage deadline
// (RequestStage: an instance that heartbeats but never answers). How orders reach instances is the owner's
// InstanceLinks. Not thread-safe: the owner serializes every call (one mutex).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cluster/cluster.h"
#include "cluster/cluster_config.h"
#include "cluster/placement.h"
#include "cluster/serve_metrics.h"
#include "common/secret.h"
#include "conductor/cluster_state.h"
#include "conductor/conductor.h"
#include "engine/engine_core.h"
#include "perf/cost_model.h"

namespace crescent::cluster {

/// How a live cluster is run: its config (model, hardware, counts, cache sizes, SLOs; policy and admission
/// in config.serve) and what the run resolved beside it (serve_options.h).
struct ClusterOptions {
  ClusterConfig config;
  int64_t block_size_tokens = 512;
  std::string model_name = "mock";  // the model_name label of the metrics
  /// Seeds every block key (kv/block_key.h): the model's identity with the cpu executor
  /// (config.serve.executor), kv::kMockModelSeed for the mock.
  BlockKey block_key_seed = kv::kMockModelSeed;
  /// The model's context (max_position_embeddings) with the cpu executor: prompt + output never exceed
  /// it. 0: no limit but the decode instances' KV capacity (the mock).
  int64_t model_context_tokens = 0;
};

/// The most tokens a request may have (prompt + max_tokens): serve.max_request_kv_share of a decode
/// instance's KV capacity (decode_kv_capacity_tokens), and no more than the model's context when it has one
/// or serve.max_model_len_tokens when set. What the front end refuses past (400) and /v1/models reports.
int64_t max_context_tokens(const ClusterOptions& options);

/// Checks `options` as the simulator checks a run (validate(config, block_size_tokens)).
Status validate(const ClusterOptions& options);

/// How the core sends orders to instances. Called with the owner's lock held: queue, do not block.
class InstanceLinks {
 public:
  virtual ~InstanceLinks() = default;
  /// The placement protocol's first step (PlacementDriver::report_decode_loads): bring every decode
  /// instance's load in `state` up to `now_s`. Instances that report on their own: nothing to do.
  virtual void report_decode_loads(conductor::ClusterState& state, double now_s) {
    (void)state;
    (void)now_s;
  }
  /// Queue request `id`'s prompt (FIFO) on prefill instance `p`, reusing the arranged prefix; its KV goes to
  /// decode instance `d` when it decodes (max_tokens > 1). `prefix.ready_s` is on the core's clock.
  virtual void send_prefill(InstanceId p, uint64_t id, const ClusterRequest& request,
                            std::span<const BlockKey> block_keys,
                            const engine::EngineCore::ArrangedPrefix& prefix, InstanceId d, double now_s) = 0;
  /// Reserve HBM on decode instance `d` for `id` (its prompt + max_tokens); its KV comes later.
  virtual void send_expect(InstanceId d, uint64_t id, const ClusterRequest& request, double now_s) = 0;
  /// `id`'s prefill (of `input_tokens`) started on its prefill instance and should end in `prefill_s`: decode
  /// instance `d` takes room for its KV now and counts its KV transfer timeout from then (before, the prompt
  /// may wait in a queue of any length).
  virtual void send_kv_coming(InstanceId d, uint64_t id, int64_t input_tokens, double prefill_s) = 0;
  /// `id`'s prefill is done with `first_token`: its KV is (or is being) handed to decode instance `d`, which
  /// then joins it to its batch.
  virtual void send_kv_handoff(InstanceId d, uint64_t id, int64_t input_tokens, int64_t first_token,
                               double now_s) = 0;
  /// Drop `id` on prefill instance `p` and decode instance `d` and free its KV there.
  virtual void send_cancel(InstanceId p, InstanceId d, uint64_t id) = 0;
};

/// Where an accepted request is, as the Conductor waits on its instances. Each stage has a deadline
/// (serve.stage_timeout_floor_s + serve.stage_timeout_factor x the stage's predicted time): past it the
/// request fails with the stage's code. The first three count from the stage's start; decoding's from the
/// request's last progress (its KV's arrival, then each token), so only a decode that stopped is caught.
enum class RequestStage : uint8_t {
  kQueued,     // placed, its prefill not started (predicted: Decision::queue_s); "queue_timeout"
  kPrefill,    // prefill started, no first token yet (Decision::transfer_s + prefill_s); "prefill_timeout"
  kKvHandoff,  // first token out, its KV not yet all at decode (the whole prompt's KV transfer);
               // "kv_handoff_timeout"
  kDecoding,   // its KV is at decode: the gap since its last token (one decode step of its context alone);
               // "decode_timeout"
};

class ConductorCore final : private PlacementDriver {
 public:
  /// `links` must outlive the core. REQUIRES: validate(options) is ok.
  ConductorCore(const ClusterOptions& options, InstanceLinks& links);

  /// Decides `request` at `now_s` (the core's clock, seconds) by the placement protocol (cluster::place);
  /// accepted: records it, sends its orders, and sets `id`.
  conductor::Decision place(ClusterRequest request, RequestCallbacks callbacks, uint64_t& id, double now_s);
  /// The owner's cancel at `now_s`: drops `id` (the id place() gave, whatever placement the request is on
  /// now) everywhere (no callback). No-op when unknown.
  void cancel(uint64_t id, double now_s);

  // Events from instances (the core's clock).
  /// `id`'s prefill started with `hit_tokens` of its prompt reused.
  void on_prefill_start(uint64_t id, int64_t hit_tokens, double now_s);
  /// `id`'s prefill on `instance` ended with `first_token`: it goes out (a one-token request is done), with
  /// its `logprobs` when the request asked for them (nullptr: none came).
  void on_first_token(InstanceId instance, uint64_t id, int64_t first_token, double now_s,
                      const model::TokenLogprobs* logprobs = nullptr);
  /// `id`'s KV has reached its decode instance (after on_first_token): the decode instance is told.
  void on_kv_shipped(uint64_t id, double now_s);
  /// A decode step gave each of `ids` one token, `tokens[i]` to `ids[i]`; a request with all its tokens
  /// finishes. `logprobs[j]` goes with the token of ids[logprob_rows[j]] (the requests that asked for them);
  /// REQUIRES: logprob_rows increasing, below ids.size(), as long as logprobs.
  void on_tokens(std::span<const uint64_t> ids, std::span<const int64_t> tokens, double now_s,
                 std::span<const uint32_t> logprob_rows = {},
                 std::span<const model::TokenLogprobs> logprobs = {});
  /// The mock model's next token for `id` (mock_token of its seed and the tokens it has): what an instance
  /// running the mock executor in this process reports. 0 for an unknown id.
  int64_t next_mock_token(uint64_t id) const;
  /// `id` cannot go on at `now_s` (e.g. its KV never reached decode): its owner hears on_error(code, message)
  /// (codes: RequestCallbacks::on_error).
  void fail(uint64_t id, const std::string& code, const std::string& message, double now_s);
  /// Prefill instance `p` went down: it leaves the Conductor's view. The requests whose KV it had not
  /// handed to decode are placed again (their old instances drop them: decode reservations are cancelled)
  /// under a new id, the only one their new instances see, while their owner keeps the first; events naming
  /// an old id are ignored from then on. One whose first token is out goes on from it (on_decode_down). A
  /// request fails with instance_down instead when it used up serve.max_request_placements or nothing can
  /// take it.
  void on_prefill_down(InstanceId p, double now_s);
  /// Decode instance `d` went down at `now_s`: it leaves the view and its requests are placed again as
  /// on_prefill_down's are; a stream with tokens out moves: its prompt plus the tokens it gave are prefilled
  /// on another instance (ClusterRequest::output_offset) and it goes on where it stopped, its client seeing
  /// no error. Past serve.max_request_placements it fails with instance_down (an SSE error event).
  void on_decode_down(InstanceId d, double now_s);
  /// Fails (as fail() does: its instances drop it, the Conductor's estimates give back what it held) every
  /// request whose stage deadline (RequestStage) passed by `now_s`, with the stage's code; returns how many.
  /// The owner calls it periodically (RemoteCluster's control loop, every 20 ms) or at next_deadline_s().
  size_t expire_deadlines(double now_s);
  /// The earliest stage deadline still pending, on the core's clock (seconds); infinity when none. It may be
  /// one whose request has since moved on: expire_deadlines() then fails nothing.
  double next_deadline_s() const;
  /// The deadline of `id`'s current stage (seconds, the core's clock; while it decodes, its last progress +
  /// the stage's timeout); infinity when it is not in flight.
  double stage_deadline_s(uint64_t id) const;

  /// A prefill instance joins while the cluster serves (membership beyond the config's counts,
  /// docs/serving.md): numbered after the last, with no blocks and an empty queue; down until
  /// state().on_prefill_up.
  InstanceId add_prefill_instance();
  /// A decode instance joins, with the config's decode KV capacity (kv_capacity_tokens()); down until
  /// state().on_decode_up.
  InstanceId add_decode_instance();
  /// Instance `p` (`d`) drains at `now_s`: nothing new is placed there, while the requests it has go on to
  /// their end (unlike on_prefill_down / on_decode_down, nothing is placed again). It leaves the view as a
  /// down instance does (its cache and queue, or its load, are forgotten); when it finally goes,
  /// on_prefill_down / on_decode_down place again whatever it had not finished.
  void on_prefill_draining(InstanceId p, double now_s) { state_.on_prefill_down(p, now_s); }
  void on_decode_draining(InstanceId d) { state_.on_decode_down(d); }

  /// The Conductor's state, fed directly with KV events, decode reports and instances coming up.
  conductor::ClusterState& state() { return state_; }
  const perf::CostModel& cost() const { return cost_; }
  ServeMetrics& metrics() { return metrics_; }
  int64_t kv_capacity_tokens() const { return kv_capacity_tokens_; }
  /// The most tokens a request may have (max_context_tokens(options)).
  int64_t max_context_tokens() const { return cluster::max_context_tokens(options_); }
  size_t requests_in_flight() const { return requests_.size(); }
  /// Whether `id` (an instance's: the request's current placement) is in flight.
  bool has_request(uint64_t id) const { return requests_.contains(id); }
  /// Where `id` (an instance's: the request's current placement) runs and how far it got; nullptr when it
  /// is not in flight.
  const RequestSummary* summary(uint64_t id) const {
    auto it = requests_.find(id);
    return it == requests_.end() ? nullptr : &it->second.summary;
  }

 private:
  struct Live {
    ClusterRequest request;
    RequestCallbacks callbacks;
    std::vector<BlockKey> block_keys;
    RequestSummary summary;
    uint64_t owner_id = 0;            // once placed again: the id its owner knows it by (place()'s)
    std::vector<int64_t> output_ids;  // every token it gave so far (a moved stream goes on from them)
    int64_t placements = 0;
    bool placed = false;  // its current placement holds a share of the Conductor's estimates
    bool prefill_started = false, prefill_done = false;
    int64_t first_token = 0;
    double predicted_prefill_s = 0;  // the Conductor's prefix load + compute time (Decision)
    RequestStage stage = RequestStage::kQueued;
    double stage_deadline_s = 0;  // the current stage's, as queued in deadlines_
    double submitted_s = 0, prefill_start_s = 0, first_token_s = 0, last_token_s = 0;  // core's clock
    double decode_window_s = 0;    // decoding: how long it may go without a token (the stage's timeout)
    double decode_progress_s = 0;  // decoding: its KV's arrival or its last token, the core's clock
  };

  // PlacementDriver: the protocol's steps, as orders through links_.
  void report_decode_loads(conductor::ClusterState& state, double now_s) override {
    links_.report_decode_loads(state, now_s);
  }
  void on_placed(const conductor::Decision& decision, uint64_t id, double now_s) override;
  void expect(InstanceId d, uint64_t id, const conductor::RequestInfo& request, double now_s) override;
  void submit_prefill(InstanceId p, uint64_t id, const conductor::RequestInfo& request,
                      const engine::EngineCore::ArrangedPrefix& prefix, InstanceId d, double now_s) override;

  // Request `id` ends before its last token (cancelled or failed) at `now_s`: its instances drop it, and
  // everything it held in the Conductor's estimates goes (its prefill's share of the queue, its placed
  // blocks, its pending count: an instance with nothing left pending is idle now). Every way a request can
  // end without finishing goes through here; the rest finish() or are finished by the first token.
  void drop(uint64_t id, double now_s);
  // Request `id`'s current placement ends (its instances drop it; its share of the prefill queue, its placed
  // blocks and its pending count are given back); the request itself goes on.
  void release_placement(uint64_t id, Live& live, double now_s);
  // Places request `id` again (on_prefill_down) under a new id; false when it used up its placements or
  // nothing can take it (it is then as it was, for the caller to fail).
  bool place_again(uint64_t id, std::string_view reason, double now_s);
  // place_again() each of `ids` (skipping those gone), failing with instance_down, saying `why`, those
  // that cannot be.
  void place_again_or_fail(std::vector<uint64_t> ids, std::string_view reason, const std::string& why,
                           double now_s);
  // Forgets request `it` (and its owner's id for it).
  void erase(std::unordered_map<uint64_t, Live>::iterator it);
  // Delivers request `id`'s next token (with its logprobs, or nullptr); the owner's stop (on_tokens false)
  // finishes it there.
  void emit_token(uint64_t id, int64_t token, double now_s, const model::TokenLogprobs* logprobs);
  // Request `id` ended well ("length": all its tokens; "stop": its owner's stop): metrics, the Conductor's
  // output-length observation, on_done.
  void finish(uint64_t id, double now_s, std::string_view finished_reason);
  // `live` (request `id`) enters `stage` at `now_s`, predicted to take `predicted_s`: its deadline is set
  // and queued.
  void enter_stage(uint64_t id, Live& live, RequestStage stage, double predicted_s, double now_s);

  const ClusterOptions options_;
  InstanceLinks& links_;
  const perf::CostModel cost_;
  conductor::Conductor conductor_;
  const int64_t kv_capacity_tokens_;
  conductor::ClusterState state_;
  ServeMetrics metrics_;                                // thread-safe
  std::unordered_map<uint64_t, Live> requests_;         // by current id: the one its instances know
  std::unordered_map<uint64_t, uint64_t> current_ids_;  // owner's id -> current id, of requests placed again
  UnguessableIds request_ids_;                          // ids no client or instance can guess from another
  std::vector<int64_t> prefills_pending_;  // per prefill instance: requests placed, prefill not done
  std::vector<uint64_t> scratch_ids_;
  // Stage deadlines, earliest on top: (deadline, request). An entry is stale when its request has moved to
  // another stage or ended (its Live's stage_deadline_s differs); stale entries are dropped as they surface.
  using Deadline = std::pair<double, uint64_t>;
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<>> deadlines_;
};

}  // namespace crescent::cluster
