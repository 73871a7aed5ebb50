// The Conductor: places each request on a prefill and a decode instance (paper §4, Algorithm 1).
// A pure decision over a ClusterView; the caller (simulator or live server) carries it out: enqueues the
// request, pins its blocks in the chosen instance's cache, copies fetched blocks (which is how hot blocks
// gain replicas).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "conductor/busy_order.h"
#include "conductor/cluster_view.h"
#include "conductor/placement_history.h"
#include "kv/block_index.h"
#include "perf/cost_model.h"

namespace crescent::conductor {

/// How the prefill instance is chosen.
enum class PrefillPolicy {
  kRandom,            // uniformly at random (seeded)
  kRoundRobin,        // each instance in turn (what vLLM's disaggregated proxy does): a baseline
  kLeastLoaded,       // smallest estimated queue time
  kCacheAware,        // Algorithm 1 with local prefixes only: min(queue + prefill(n, local prefix))
  kGlobalCacheAware,  // Algorithm 1 with remote-prefix fetch and kvcache_balancing_threshold (§4.2)
};

/// Parses "random", "round-robin", "least-loaded", "cache-aware", "global-cache-aware". Error (kNotFound)
/// lists the valid names.
Result<PrefillPolicy> parse_prefill_policy(std::string_view name);
/// The name of `policy`, as parse_prefill_policy() reads it.
std::string_view to_string(PrefillPolicy policy);
/// All policy names, in the order above.
std::vector<std::string> prefill_policy_names();

/// When to refuse a request at arrival, before any prefill is spent on it (arXiv report §7). Every policy but
/// kNone rejects when the best predicted TTFT exceeds the TTFT SLO; they differ in how they judge the decode
/// pool.
enum class Admission {
  kNone,  // accept everything (requests may miss their SLOs)
  /// Algorithm 1 lines 18-19: the chosen decode instance's predicted TBT (its step time with the request and
  /// everything running, waiting or incoming there) must meet the TBT SLO. It does not look at HBM room.
  kSlo,
  /// Early rejection (§7.2): some decode instance must be able to take it (HBM room for prompt + expected
  /// output, step time within the TBT SLO) judged on its current load: the requests running or waiting there
  /// now. The request is placed on that instance.
  kEarly,
  /// Predictive early rejection (§7.4): the same judgement on the decode load predicted ahead: requests
  /// already placed (in prefill) join, running requests expected to finish before this request's prefill
  /// starts leave (see conductor.cpp for why the horizon stops there).
  kPredictive,
};

/// Running mean of the output lengths of finished requests: the expected output of a request whose length is
/// not known yet, starting from a prior worth `prior_weight` observations. The observations are summed as
/// integers, so the mean does not depend on the order they come in (the simulator's decode instances report
/// the requests they finish in index order, not time order: sim/disaggregated.cpp).
class OutputLengthEstimator {
 public:
  explicit OutputLengthEstimator(double prior_tokens = 256, double prior_weight = 8)
      : prior_sum_tokens_(prior_tokens * prior_weight), prior_weight_(prior_weight) {}
  void observe(int64_t output_tokens) {
    observed_tokens_ += output_tokens;
    ++observed_;
  }
  double expected_tokens() const {
    return (prior_sum_tokens_ + static_cast<double>(observed_tokens_)) /
           (prior_weight_ + static_cast<double>(observed_));
  }

 private:
  double prior_sum_tokens_;
  double prior_weight_;
  int64_t observed_tokens_ = 0;
  int64_t observed_ = 0;
};

/// Parses "none", "slo", "early", "predictive". Error (kNotFound) lists the valid names.
Result<Admission> parse_admission(std::string_view name);
/// The name of `admission`, as parse_admission() reads it.
std::string_view to_string(Admission admission);
/// All admission policy names, in the order above.
std::vector<std::string> admission_names();

struct ConductorOptions {
  PrefillPolicy policy = PrefillPolicy::kGlobalCacheAware;
  Admission admission = Admission::kNone;
  int64_t block_size_tokens = 512;
  /// A prefill instance computes a prompt in iterations of at most this many tokens (0: one iteration), and
  /// the Conductor predicts its prefill as those iterations (CostModel::prefill_iterations_time_s).
  int64_t prefill_chunk_tokens = 0;
  /// Fetch a remote prefix when best_len / local_len exceeds this (Algorithm 1 line 5; the paper tunes it by
  /// hand). 1.0 fetches whenever a longer prefix exists elsewhere.
  double kvcache_balancing_threshold = 1.0;
  /// Instances keep their prefix caches in HBM (inference engines in router mode, docs/router.md), not in
  /// DRAM as Mooncake's prefill instances do: a reused prefix costs no host-to-device load (T_transfer is the
  /// fetch alone).
  bool prefix_cache_in_hbm = false;
  double ttft_slo_s = 30.0;  // for admission policies
  double tbt_slo_s = 0.1;    // for admission policies
  uint64_t seed = 1;         // for PrefillPolicy::kRandom
  /// Prior of the output-length estimator (tokens) used to judge decode load before outputs are observed.
  double expected_output_prior_tokens = 256;
};

/// The request facts the Conductor uses.
struct RequestInfo {
  int64_t input_tokens = 0;
  std::span<const BlockKey> block_keys;  // one per block of the prompt, chained prefix hashes
  /// Most tokens it may generate (the API's max_tokens); decode reserves HBM KV for prompt + this.
  int64_t max_output_tokens = 0;
  /// Already accepted: it is placed again after its instance failed (a live cluster), so admission does not
  /// judge it again (an accepted request is never refused later); a request that cannot run anywhere is.
  bool admitted = false;
  /// How many of its leading blocks a later request may name (ClusterState::on_request_placed indexes only
  /// those): all of them in a live cluster, which cannot know. A simulator that read the whole trace knows
  /// that no later request names the blocks past it, so no decision will look them up.
  size_t reused_later_blocks = std::numeric_limits<size_t>::max();
};

/// Why a request was refused.
enum class RejectReason {
  kNone,
  kTtft,            // predicted TTFT above the TTFT SLO (overload: the live server answers HTTP 429)
  kTbt,             // predicted TBT above the TBT SLO (429)
  kDecodeCapacity,  // admission judged the decode pool unable to take it now (429)
  kContextLength,   // prompt + max output exceed every decode instance's HBM KV capacity: it can never run,
                    // whatever the load (the live server answers HTTP 400, as for a too-long prompt)
  kNoInstance,      // no prefill or no decode instance is up (a live cluster; the server answers HTTP 503)
};
/// "none", "ttft", "tbt", "decode-capacity", "context-length", "no-instance".
std::string_view to_string(RejectReason reason);

/// A placement: where the request runs and what the Conductor predicted for it.
struct Decision {
  RejectReason rejected = RejectReason::kNone;
  InstanceId prefill_instance = 0;
  InstanceId decode_instance = 0;
  int64_t local_prefix_tokens = 0;    // prompt tokens already cached on the chosen prefill instance
  int64_t fetched_prefix_tokens = 0;  // further prompt tokens fetched from `fetch_from` before prefill
  InstanceId fetch_from = 0;          // meaningful when fetched_prefix_tokens > 0
  int64_t prefill_tokens = 0;         // tokens to compute (>= 1: the last token is always recomputed)
  /// Predicted time to bring the reused prefix into HBM: network fetch of the remote part plus host → device
  /// load of the whole prefix (paper §3.1 step 1).
  double transfer_s = 0;
  double queue_s = 0;            // predicted wait before it can start: the queue, or the fetch source
  double prefill_s = 0;          // predicted prefill compute time (CostModel::prefill_iterations_time_s)
  double ttft_s = 0;             // queue_s + transfer_s + prefill_s
  double predicted_tbt_s = 0;    // decode step time predicted on the chosen decode instance
  bool decode_has_room = false;  // its HBM can take the request's KV now (else it waits to join the batch)

  int64_t prefix_tokens() const { return local_prefix_tokens + fetched_prefix_tokens; }
};

/// Places requests. Holds options, the cost model, scratch space and its own memory of where it placed
/// requests lately (PlacementHistory, for tie-breaks): every fact about the cluster comes from the
/// ClusterView passed to schedule(). Every policy breaks ties (exactly equal estimates, as idle queues and
/// equal prefixes give) between prefill instances, decode instances and fetch sources by fewest recent
/// placements, then round robin, never by index. Not thread-safe (scratch, RNG, history).
class Conductor {
 public:
  /// `cost_model` must outlive the Conductor.
  Conductor(const perf::CostModel& cost_model, ConductorOptions options);

  /// Chooses prefill and decode instances for `request` arriving at `now_s` (seconds, non-decreasing across
  /// calls). Never fails; a refusal is reported in Decision::rejected (the live server answers HTTP 429, or
  /// 400 for RejectReason::kContextLength). An accepted decision is recorded as a placement (it counts in
  /// later tie-breaks).
  Decision schedule(const ClusterView& cluster, const RequestInfo& request, double now_s);

  const ConductorOptions& options() const { return options_; }

  /// Instances that are not alike (router mode's engines, each with the cost model of its own profile:
  /// docs/router.md): prefill instance i is timed by `prefill[i]` and decode instance d by `decode[d]` where
  /// those are set; a null entry, or an instance past the end, by the constructor's model. Empty vectors:
  /// every instance alike (and Algorithm 1 computes each prefix length's cost once, not each instance's).
  /// The models must outlive the Conductor.
  void set_instance_cost_models(std::vector<const perf::CostModel*> prefill,
                                std::vector<const perf::CostModel*> decode);

  /// Whether a prefill choice may use the busy order kept across decisions (busy_order.h) instead of a loop
  /// over every instance, when it applies: 64 instances or more, and for the cache-aware policies, instances
  /// alike (no set_instance_cost_models) nearly all of which have one local prefix length. The decisions are
  /// the same either way; tests and benchmarks compare the two.
  void set_busy_order_enabled(bool enabled) { busy_order_enabled_ = enabled; }
  /// How many prefill choices the busy order answered (the others were loops over every instance).
  uint64_t busy_order_choices() const { return busy_order_choices_; }

  /// Records a finished request's output length (feeds the output-length estimator used by admission).
  void observe_output(int64_t output_tokens) { output_estimator_.observe(output_tokens); }
  double expected_output_tokens() const { return output_estimator_.expected_tokens(); }

 private:
  // A candidate prefill instance and Algorithm 1's estimate for it.
  struct PrefillChoice {
    InstanceId instance = 0;
    int64_t local_blocks = 0;
    int64_t fetched_blocks = 0;
    InstanceId fetch_from = 0;  // meaningful when fetched_blocks > 0
    double transfer_s = 0, queue_s = 0, prefill_s = 0;
  };
  PrefillChoice choose_prefill(const ClusterView& cluster, const RequestInfo& request, double now_s);
  PrefillChoice evaluate(InstanceId instance, int64_t local_blocks, int64_t prefix_blocks,
                         const RequestInfo& request, double queue_s) const;
  // How long a fetch of the best prefix (match_) waits at `now_s` for the holder that will have computed it
  // soonest, in seconds: 0 when one has (the search stops there) or when there is no best prefix, infinity
  // when no holder's time is finite.
  double fetch_wait_s(const ClusterView& cluster, const RequestInfo& request, double now_s) const;
  // Where a remote prefix comes from: the holder of the best prefix that will have computed it soonest, ties
  // to the one that served the fewest fetches recently, then round robin. Asked only for a choice that
  // fetches: it reads every holder's blocks, and a shared system prompt's block has hundreds of holders.
  // REQUIRES: match_.best_blocks > 0.
  InstanceId choose_fetch_source(const ClusterView& cluster, const RequestInfo& request) const;
  std::optional<InstanceId> decode_instance_for(const ClusterView& cluster, const RequestInfo& request,
                                                double horizon_s, double& predicted_tbt_s);
  InstanceId choose_decode(const ClusterView& cluster, const RequestInfo& request, double& predicted_tbt_s,
                           bool& fits);
  // The loops' answer from busy_order_ when nearly every instance has one local prefix length (their scores
  // differ only by queue): prefill instance i scores max(queue_i, floor[L_i]) + cost[L_i] for its local
  // length L_i (floor and cost indexed by length), and the lowest wins, ties by prefill_history_. None when
  // the order does not apply or every score is infinite. `keys` are the request's; match_ came from
  // `cluster`'s index.
  std::optional<InstanceId> pick_prefill_by_order(const ClusterView& cluster, std::span<const BlockKey> keys,
                                                  std::span<const double> busy_until,
                                                  std::span<const uint8_t> up,
                                                  std::span<const int32_t> local_blocks, const double* cost,
                                                  const double* floor, double now_s);
  // The instance with the smallest finite score (scores[i] is instance i's; `lowest` the smallest of them),
  // ties broken by `history`; none when every score is infinite. The tied are collected first (usually one),
  // so the history's weights are read only for them.
  std::optional<InstanceId> pick_lowest(std::span<const double> scores, double lowest,
                                        const PlacementHistory& history);
  // pick_lowest over prefill_scores_, or when no score is finite (a cost model that overflows, queues
  // predicted never to end) the first prefill instance up (`up` empty: all are), as choose_decode falls back:
  // its TTFT is then predicted infinite or NaN, which SLO admission rejects. schedule() checked that one is
  // up.
  InstanceId lowest_prefill_or_first_up(double lowest, std::span<const uint8_t> up);
  uint64_t next_random();
  const perf::CostModel& prefill_cost(InstanceId i) const {
    return i < prefill_costs_.size() && prefill_costs_[i] != nullptr ? *prefill_costs_[i] : cost_;
  }
  const perf::CostModel& decode_cost(InstanceId d) const {
    return d < decode_costs_.size() && decode_costs_[d] != nullptr ? *decode_costs_[d] : cost_;
  }

  const perf::CostModel& cost_;
  std::vector<const perf::CostModel*> prefill_costs_, decode_costs_;  // set_instance_cost_models
  // The one cost model of every decode instance listed in decode_costs_ (cost_ when none is), or null when
  // they differ (set_instance_cost_models).
  const perf::CostModel* uniform_decode_cost_ = &cost_;
  ConductorOptions options_;
  uint64_t rng_state_;
  uint64_t round_robin_next_ = 0;  // PrefillPolicy::kRoundRobin: the instance after the last one chosen
  OutputLengthEstimator output_estimator_;
  PlacementHistory prefill_history_;
  PlacementHistory decode_history_;
  PlacementHistory fetch_history_;  // prefill instances that served remote prefix fetches
  BusyOrder busy_order_;            // the prefill instances by busy_until, for pick_prefill_by_order
  bool busy_order_enabled_ = true;
  uint64_t busy_order_choices_ = 0;
  // Scratch reused across decisions (no allocation per decision once warm).
  kv::PrefixMatch match_;
  // By local prefix length (blocks), valid for the lengths the current decision's match has (the rest stale):
  std::vector<double> cost_by_local_;        // T_transfer + T_prefill
  std::vector<double> wait_floor_by_local_;  // the fetch's wait, or 0 (no fetch)
  // Per prefill (decode) instance: the policy's estimate (infinite: not eligible). Two, so that neither is
  // resized (and zeroed) on every decision when the pools differ in size.
  std::vector<double> prefill_scores_, decode_scores_;
  std::vector<std::pair<InstanceId, double>> others_;  // pick_prefill_by_order: instances outside the group
  std::vector<InstanceId> tied_;                       // pick_lowest: the instances with the lowest score
  DecodeChoiceLoads derived_decode_loads_;  // choose_decode: for a view that keeps none (decode_choice_loads)
};

}  // namespace crescent::conductor
