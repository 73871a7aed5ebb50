#include "conductor/conductor.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <limits>
#include <optional>

#include "common/name_table.h"

namespace crescent::conductor {
namespace {

constexpr NameTable<PrefillPolicy, 5> kPolicies{"prefill policy",
                                                {{
                                                    {"random", PrefillPolicy::kRandom},
                                                    {"round-robin", PrefillPolicy::kRoundRobin},
                                                    {"least-loaded", PrefillPolicy::kLeastLoaded},
                                                    {"cache-aware", PrefillPolicy::kCacheAware},
                                                    {"global-cache-aware", PrefillPolicy::kGlobalCacheAware},
                                                }}};

constexpr NameTable<Admission, 4> kAdmissions{"admission policy",
                                              {{
                                                  {"none", Admission::kNone},
                                                  {"slo", Admission::kSlo},
                                                  {"early", Admission::kEarly},
                                                  {"predictive", Admission::kPredictive},
                                              }}};

}  // namespace

Result<PrefillPolicy> parse_prefill_policy(std::string_view name) {
  return kPolicies.parse(name);
}
std::string_view to_string(PrefillPolicy policy) {
  return kPolicies.name(policy);
}
std::vector<std::string> prefill_policy_names() {
  return kPolicies.names();
}

Result<Admission> parse_admission(std::string_view name) {
  return kAdmissions.parse(name);
}
std::string_view to_string(Admission admission) {
  return kAdmissions.name(admission);
}
std::vector<std::string> admission_names() {
  return kAdmissions.names();
}

std::string_view to_string(RejectReason reason) {
  switch (reason) {
    case RejectReason::kNone:
      return "none";
    case RejectReason::kTtft:
      return "ttft";
    case RejectReason::kTbt:
      return "tbt";
    case RejectReason::kDecodeCapacity:
      return "decode-capacity";
    case RejectReason::kContextLength:
      return "context-length";
    case RejectReason::kNoInstance:
      return "no-instance";
  }
  return "?";
}

Conductor::Conductor(const perf::CostModel& cost_model, ConductorOptions options)
    : cost_(cost_model),
      options_(options),
      rng_state_(options.seed),
      output_estimator_(options.expected_output_prior_tokens) {}

void Conductor::set_instance_cost_models(std::vector<const perf::CostModel*> prefill,
                                         std::vector<const perf::CostModel*> decode) {
  prefill_costs_ = std::move(prefill);
  decode_costs_ = std::move(decode);
  // One model for every listed instance (null: cost_), or none.
  auto model = [&](const perf::CostModel* cost) { return cost != nullptr ? cost : &cost_; };
  uniform_decode_cost_ = decode_costs_.empty() ? &cost_ : model(decode_costs_.front());
  for (const perf::CostModel* cost : decode_costs_) {
    if (model(cost) != uniform_decode_cost_) uniform_decode_cost_ = nullptr;
  }
}

// splitmix64: a tiny, well-distributed generator whose output is the same on every platform (unlike
// std::uniform_int_distribution), which keeps simulations byte-identical for a seed.
uint64_t Conductor::next_random() {
  uint64_t z = (rng_state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Transfer and prefill times of running `request` with `prefix_blocks` of its prompt reused, `local_blocks`
// of them already on `instance` (Algorithm 1 lines 6-13; the queue is the caller's).
Conductor::PrefillChoice Conductor::evaluate(InstanceId instance, int64_t local_blocks, int64_t prefix_blocks,
                                             const RequestInfo& request, double queue_s) const {
  const int64_t n = request.input_tokens;
  const int64_t block = options_.block_size_tokens;
  const int64_t local_tokens = std::min(local_blocks * block, n);
  const int64_t prefix_tokens = std::min(prefix_blocks * block, n);
  // The last prompt token is always recomputed: its logits give the first output token.
  const int64_t new_tokens = std::max<int64_t>(1, n - prefix_tokens);
  PrefillChoice c;
  c.instance = instance;
  c.local_blocks = local_blocks;
  c.fetched_blocks = prefix_blocks - local_blocks;
  const perf::CostModel& cost = prefill_cost(instance);
  c.transfer_s = cost.kv_transfer_time_s(prefix_tokens - local_tokens) +
                 (options_.prefix_cache_in_hbm ? 0.0 : cost.kv_load_time_s(prefix_tokens));
  c.queue_s = queue_s;
  // The prefill instance's iterations (engine::MockExecutor): compute-bound for realistic sizes, but each
  // reads the weights once, which is what a prompt whose prefix is all reused costs.
  c.prefill_s = cost.prefill_iterations_time_s(new_tokens, std::max<int64_t>(0, n - new_tokens),
                                               options_.prefill_chunk_tokens);
  return c;
}

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// The busy order (busy_order.h) serves pools of at least this many prefill instances, when at most one in
// this many has a local prefix length other than the most common one: below, the loop costs little.
constexpr uint32_t kBusyOrderMinInstances = 64;
constexpr uint32_t kBusyOrderMaxOthersShare = 8;

// The lowest of `scores`, kept as eight running minima: one would be a chain of dependent compares, four
// cycles each, across a thousand instances.
double lowest_of(std::span<const double> scores) {
  constexpr uint32_t kLanes = 8;
  std::array<double, kLanes> lane;
  lane.fill(kInfinity);
  const auto count = static_cast<uint32_t>(scores.size());
  uint32_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (uint32_t l = 0; l < kLanes; ++l) lane[l] = scores[i + l] < lane[l] ? scores[i + l] : lane[l];
  }
  for (; i < count; ++i) lane[0] = scores[i] < lane[0] ? scores[i] : lane[0];
  double lowest = kInfinity;
  for (const double m : lane) lowest = m < lowest ? m : lowest;
  return lowest;
}

// Sets scores[i] = score(i) for every i and returns the lowest. Two loops: the first vectorizes where
// `score` is arithmetic without branches (the decode choice's).
template <typename ScoreFn>
double fill_scores(std::span<double> scores, ScoreFn score) {
  double* const out = scores.data();
  const auto count = static_cast<uint32_t>(scores.size());
  for (uint32_t i = 0; i < count; ++i) out[i] = score(i);
  return lowest_of(scores);
}

}  // namespace

// Two passes: the lowest score, then the tie-break among the instances that have it.
std::optional<InstanceId> Conductor::pick_lowest(std::span<const double> scores, double lowest,
                                                 const PlacementHistory& history) {
  if (lowest == kInfinity) return std::nullopt;
  tied_.clear();
  for (InstanceId i = 0; i < scores.size(); ++i) {
    if (scores[i] == lowest) tied_.push_back(i);
  }
  return tied_.size() == 1 ? tied_.front() : history.pick(tied_);
}

InstanceId Conductor::lowest_prefill_or_first_up(double lowest, std::span<const uint8_t> up) {
  if (const auto best = pick_lowest(prefill_scores_, lowest, prefill_history_)) return *best;
  InstanceId first = 0;
  while (first + 1 < up.size() && up[first] == 0) ++first;
  return first;
}

double Conductor::fetch_wait_s(const ClusterView& cluster, const RequestInfo& request, double now_s) const {
  if (match_.best_blocks == 0) return 0;
  const auto best_prefix = request.block_keys.first(static_cast<size_t>(match_.best_blocks));
  double soonest_s = std::numeric_limits<double>::infinity();
  for (const InstanceId inst : match_.best_holders) {
    soonest_s = std::min(soonest_s, cluster.prefix_ready_s(inst, best_prefix, soonest_s));
    if (soonest_s <= now_s) return 0;
  }
  return soonest_s - now_s;
}

InstanceId Conductor::choose_fetch_source(const ClusterView& cluster, const RequestInfo& request) const {
  const auto best_prefix = request.block_keys.first(static_cast<size_t>(match_.best_blocks));
  InstanceId best = 0;
  double best_ready_s = std::numeric_limits<double>::infinity();
  for (const InstanceId inst : match_.best_holders) {
    const double ready_s = cluster.prefix_ready_s(inst, best_prefix, best_ready_s);
    if (ready_s < best_ready_s || (ready_s == best_ready_s && fetch_history_.prefer(inst, best))) {
      best = inst;
      best_ready_s = ready_s;
    }
  }
  return best;
}

Conductor::PrefillChoice Conductor::choose_prefill(const ClusterView& cluster, const RequestInfo& request,
                                                   double now_s) {
  const auto busy_until = cluster.prefill_busy_until_s();
  const auto up = cluster.prefill_up_flags();
  const auto instances = static_cast<uint32_t>(busy_until.size());
  // An instance that is down scores infinity, which pick_lowest skips.
  auto queue_s = [&](InstanceId i) {
    return up.empty() || up[i] != 0 ? std::max(0.0, busy_until[i] - now_s) : kInfinity;
  };

  // Each instance's local prefix (Algorithm 1's instance.prefix_len), dense for the loops below.
  if (match_.run_blocks.size() < instances) match_.run_blocks.resize(instances, 0);
  cluster.block_index().match_prefix(request.block_keys, match_);
  const std::span<const int32_t> local_blocks(match_.run_blocks.data(), instances);
  prefill_scores_.resize(instances);

  switch (options_.policy) {
    case PrefillPolicy::kRandom: {
      auto i = static_cast<InstanceId>(next_random() % instances);
      while (!cluster.prefill_up(i)) i = (i + 1) % instances;  // schedule() checked that one is up
      return evaluate(i, local_blocks[i], local_blocks[i], request, queue_s(i));
    }
    case PrefillPolicy::kRoundRobin: {
      auto i = static_cast<InstanceId>(round_robin_next_++ % instances);
      while (!cluster.prefill_up(i)) i = static_cast<InstanceId>(round_robin_next_++ % instances);
      return evaluate(i, local_blocks[i], local_blocks[i], request, queue_s(i));
    }
    case PrefillPolicy::kLeastLoaded: {
      // std::max(x, 0.0), not queue_s's std::max(0.0, x): the same order, and the compiler makes it a max
      // instruction, not a branch that mispredicts across idle and busy instances (in the loop below).
      if (busy_order_enabled_ && instances >= kBusyOrderMinInstances &&
          busy_order_.sync(busy_until, up, prefill_history_, cluster.prefill_changes())) {
        const auto best =
            busy_order_.best([](InstanceId) { return true; },
                             [&](double busy) { return std::max(busy - now_s, 0.0); }, prefill_history_);
        if (best) {
          ++busy_order_choices_;
          const InstanceId i = best->instance;
          return evaluate(i, local_blocks[i], local_blocks[i], request, queue_s(i));
        }
      }
      const double lowest =
          up.empty() ? fill_scores(prefill_scores_,
                                   [&](InstanceId i) { return std::max(busy_until[i] - now_s, 0.0); })
                     : fill_scores(prefill_scores_, [&](InstanceId i) {
                         return up[i] != 0 ? std::max(busy_until[i] - now_s, 0.0) : kInfinity;
                       });
      const InstanceId best = lowest_prefill_or_first_up(lowest, up);
      return evaluate(best, local_blocks[best], local_blocks[best], request, queue_s(best));
    }
    case PrefillPolicy::kCacheAware:
    case PrefillPolicy::kGlobalCacheAware:
      break;
  }

  // Algorithm 1: for each instance, reuse its local prefix or (global policy) fetch the best prefix when
  // best_len / local_len > kvcache_balancing_threshold; TTFT = T_queue + T_transfer + T_prefill; keep the
  // smallest. A fetch cannot start before its source has computed the prefix, so its wait overlaps the queue.
  const bool global = options_.policy == PrefillPolicy::kGlobalCacheAware;
  const int64_t best_blocks = match_.best_blocks;
  const double fetch_wait = global ? fetch_wait_s(cluster, request, now_s) : 0.0;
  // The fetch's source, for the choice made (one that fetches).
  auto with_source = [&](PrefillChoice choice) {
    if (choice.fetched_blocks > 0) choice.fetch_from = choose_fetch_source(cluster, request);
    return choice;
  };
  auto fetches = [&](int64_t local) {
    return global && best_blocks > local &&
           (local == 0 || static_cast<double>(best_blocks) / static_cast<double>(local) >
                              options_.kvcache_balancing_threshold);
  };
  auto wait_s = [&](InstanceId i) {
    return fetches(local_blocks[i]) ? std::max(queue_s(i), fetch_wait) : queue_s(i);
  };

  double lowest = kInfinity;
  if (!prefill_costs_.empty()) {  // instances not alike: each its own estimate
    lowest = fill_scores(prefill_scores_, [&](InstanceId i) {
      const int64_t local = local_blocks[i];
      const PrefillChoice e = evaluate(i, local, fetches(local) ? best_blocks : local, request, 0.0);
      return wait_s(i) + (e.transfer_s + e.prefill_s);
    });
  } else {
    // T_transfer + T_prefill depends on the instance only through its local prefix length, and a request
    // sees few distinct lengths: computed once per length that occurs, with the floor under the queue (0,
    // or the fetch's wait when it fetches). The loop over instances is then a max and an add each:
    // max(busy - now, floor) is wait_s(), max(max(0, busy - now), wait), as the fetch's wait is >= 0.
    // Written for the lengths that occur, the only ones read: the tables only grow, never cleared.
    if (cost_by_local_.size() <= static_cast<size_t>(best_blocks)) {
      cost_by_local_.resize(static_cast<size_t>(best_blocks) + 1);
      wait_floor_by_local_.resize(static_cast<size_t>(best_blocks) + 1);
    }
    for (int64_t local = 0; local <= best_blocks; ++local) {
      const bool occurs =
          local == 0 || local == best_blocks ||
          match_.reaching[static_cast<size_t>(local - 1)] > match_.reaching[static_cast<size_t>(local)];
      if (!occurs) continue;
      const bool fetch = fetches(local);
      const PrefillChoice e = evaluate(0, local, fetch ? best_blocks : local, request, 0.0);
      cost_by_local_[static_cast<size_t>(local)] = e.transfer_s + e.prefill_s;
      wait_floor_by_local_[static_cast<size_t>(local)] = fetch ? fetch_wait : 0.0;
    }
    const double* cost = cost_by_local_.data();
    const double* floor = wait_floor_by_local_.data();
    if (auto best = pick_prefill_by_order(cluster, request.block_keys, busy_until, up, local_blocks, cost,
                                          floor, now_s)) {
      ++busy_order_choices_;
      const int64_t local = local_blocks[*best];
      return with_source(
          evaluate(*best, local, fetches(local) ? best_blocks : local, request, wait_s(*best)));
    }
    if (up.empty()) {
      lowest = fill_scores(prefill_scores_, [&](InstanceId i) {
        const int32_t local = local_blocks[i];
        return std::max(busy_until[i] - now_s, floor[local]) + cost[local];
      });
    } else {
      lowest = fill_scores(prefill_scores_, [&](InstanceId i) {
        const int32_t local = local_blocks[i];
        return std::max(up[i] != 0 ? busy_until[i] - now_s : kInfinity, floor[local]) + cost[local];
      });
    }
  }

  const InstanceId best = lowest_prefill_or_first_up(lowest, up);
  const int64_t local = local_blocks[best];
  return with_source(evaluate(best, local, fetches(local) ? best_blocks : local, request, wait_s(best)));
}

std::optional<InstanceId> Conductor::pick_prefill_by_order(
    const ClusterView& cluster, std::span<const BlockKey> keys, std::span<const double> busy_until,
    std::span<const uint8_t> up, std::span<const int32_t> local_blocks, const double* cost,
    const double* floor, double now_s) {
  const auto instances = static_cast<uint32_t>(busy_until.size());
  // Holder ids at or past the pool's size would be counted in reaching: the loop then decides.
  if (!busy_order_enabled_ || instances < kBusyOrderMinInstances || match_.run_blocks.size() != instances) {
    return std::nullopt;
  }
  // The most common local length (the group), from the match's counts: instances - reaching[0] have none,
  // reaching[L - 1] - reaching[L] have L blocks.
  const int64_t best_blocks = match_.best_blocks;
  const auto& reaching = match_.reaching;
  int32_t group = 0;
  int64_t group_size = instances - (best_blocks > 0 ? reaching[0] : 0);
  for (int64_t length = 1; length <= best_blocks; ++length) {
    const auto i = static_cast<size_t>(length);
    const int64_t size = reaching[i - 1] - (length < best_blocks ? reaching[i] : 0);
    if (size > group_size) {
      group = static_cast<int32_t>(length);
      group_size = size;
    }
  }
  // The others are scored one by one: worth it only while they are few.
  const uint32_t max_others = instances / kBusyOrderMaxOthersShare;
  if (instances - group_size > max_others) return std::nullopt;
  others_.clear();
  auto add_other = [&](InstanceId i) {
    const int32_t local = local_blocks[i];
    others_.emplace_back(
        i,
        std::max(up.empty() || up[i] != 0 ? busy_until[i] - now_s : kInfinity, floor[local]) + cost[local]);
  };
  if (group == 0 || reaching[static_cast<size_t>(group) - 1] == instances) {
    // No instance has a shorter run, so the others are those with a longer one: they hold the key after the
    // group's run (and every key before it).
    if (group < best_blocks) {
      for (const InstanceId i : cluster.block_index().holders(keys[static_cast<size_t>(group)])) {
        if (i < instances && local_blocks[i] > group) add_other(i);
      }
    }
  } else {
    for (InstanceId i = 0; i < instances; ++i) {
      if (local_blocks[i] == group) continue;
      if (others_.size() == max_others) return std::nullopt;
      add_other(i);
    }
  }
  if (!busy_order_.sync(busy_until, up, prefill_history_, cluster.prefill_changes())) return std::nullopt;
  // The loops' expression exactly, for an instance that is up.
  const double group_floor = floor[group];
  const double group_cost = cost[group];
  const auto in_group = busy_order_.best(
      [&](InstanceId i) { return local_blocks[i] == group; },
      [&](double busy) { return std::max(busy - now_s, group_floor) + group_cost; }, prefill_history_);
  double lowest = in_group ? in_group->score : kInfinity;
  for (const auto& [i, score] : others_) lowest = std::min(lowest, score);
  if (lowest == kInfinity) return std::nullopt;
  std::optional<InstanceId> best;
  if (in_group && in_group->score == lowest) best = in_group->instance;
  for (const auto& [i, score] : others_) {
    if (score == lowest && (!best || prefill_history_.prefer(i, *best))) best = i;
  }
  return best;
}

// Decode instance with the smallest predicted TBT once this request joins (Algorithm 1 line 17), preferring
// instances whose HBM can hold its KV (prompt + max output) on top of everything already reserved, waiting or
// incoming. Waiting and incoming requests count as joined. `fits` is false when no instance has room now.
// Ties go to the instance with the fewest recent placements, then round robin (decode_history_.prefer).
//
// Scored in one pass by fill_scores (an instance without room, or down, scores infinity), then picked by
// pick_lowest: a loop keeping the best candidate so far is a chain of dependent compares across the pool, and
// this runs for every request over hundreds of instances. The loop reads the view's DecodeChoiceLoads (three
// doubles an instance, kept as loads change), not its DecodeLoads (ten integers).
InstanceId Conductor::choose_decode(const ClusterView& cluster, const RequestInfo& request,
                                    double& predicted_tbt_s, bool& fits) {
  const auto up = cluster.decode_up_flags();
  const auto instances = cluster.decode_instance_count();
  const DecodeChoiceLoads* loads = cluster.decode_choice_loads();
  if (loads == nullptr) {
    derived_decode_loads_.set_all(cluster.decode_loads(), up);
    loads = &derived_decode_loads_;
  }
  assert(loads->room_tokens().size() >= instances);
  // The loop's inputs by value: its stores of scores would otherwise make it read them again each time.
  const double* const batch_of = loads->batch_requests().data();
  const double* const context_of = loads->context_tokens().data();
  const double* const room_of = loads->room_tokens().data();
  const uint8_t* const up_flag = up.empty() ? nullptr : up.data();
  const auto need = static_cast<double>(request.input_tokens + request.max_output_tokens);
  const auto input_tokens = static_cast<double>(request.input_tokens);
  auto is_up = [up_flag](InstanceId d) { return up_flag == nullptr || up_flag[d] != 0; };
  // An instance down has no room.
  auto has_room = [room_of, need](InstanceId d) { return need <= room_of[d]; };
  // The request joins the batch: one request and its prompt more.
  auto score_with = [batch_of, context_of, input_tokens](const auto& cost, InstanceId d) {
    return cost.busy_time_s(batch_of[d] + 1, context_of[d] + input_tokens);
  };
  // Scores of the instances that compete (with room, or up when `room` is false); the lowest.
  auto fill = [&](bool room) {
    decode_scores_.resize(instances);
    // Instances past those listed are timed by cost_.
    if (uniform_decode_cost_ != nullptr &&
        (uniform_decode_cost_ == &cost_ || instances <= decode_costs_.size())) {
      const perf::CostModel::DecodeStepCost cost = uniform_decode_cost_->decode_step_cost();
      if (room) {
        // The score computed whether or not the instance has room, so the loop has no branch.
        return fill_scores(decode_scores_, [=](InstanceId d) {
          const double score = score_with(cost, d);
          return has_room(d) ? score : kInfinity;
        });
      }
      return fill_scores(decode_scores_,
                         [=](InstanceId d) { return is_up(d) ? score_with(cost, d) : kInfinity; });
    }
    return fill_scores(decode_scores_, [&](InstanceId d) {
      return (room ? has_room(d) : is_up(d)) ? score_with(decode_cost(d).decode_step_cost(), d) : kInfinity;
    });
  };
  // Only instances with room compete, unless none has any. A finite score means one has.
  double lowest = fill(true);
  fits = lowest != kInfinity;
  for (InstanceId d = 0; !fits && d < instances; ++d) fits = has_room(d);
  if (!fits) lowest = fill(false);
  predicted_tbt_s = lowest;
  if (lowest == kInfinity) {
    // Every score infinite or NaN (a cost model gone wrong): the first that competes, its TBT predicted
    // infinite (which SLO admission rejects). schedule() checked that some decode instance is up.
    for (InstanceId d = 0; d < instances; ++d) {
      if (fits ? has_room(d) : is_up(d)) return d;
    }
    return 0;
  }
  return *pick_lowest(decode_scores_, lowest, decode_history_);
}

// Largest HBM KV capacity of any decode instance: a request needing more can never run.
static int64_t max_decode_capacity_tokens(const ClusterView& cluster) {
  const auto loads = cluster.decode_loads();
  const auto up = cluster.decode_up_flags();
  int64_t capacity = 0;
  for (InstanceId d = 0; d < loads.size(); ++d) {
    if (up.empty() || up[d] != 0) capacity = std::max(capacity, loads[d].kv_capacity_tokens);
  }
  return capacity;
}

// Early rejection's judgement of the decode pool (arXiv §7.2, §7.4): the decode instance that can hold this
// request's KV (prompt + expected output) and step within the TBT SLO with the lowest predicted step time, or
// none. kEarly judges the load there now (running and waiting requests). kPredictive judges the load
// predicted `horizon_s` from now: requests already placed there (incoming) will have joined, and running
// requests expected to finish by then will have left. Running requests are taken as uniformly spread over a
// decode lifetime of expected-output steps, so a share min(1, horizon / lifetime) of them leaves.
//
// The horizon is the time until this request's prefill *starts*, not ends: HBM freed while its own prefill
// runs is taken first by requests placed after it whose shorter prefills finish earlier. Counting departures
// up to its prefill's end admits long prompts on room that will not be there (measured in
// docs/experiments.md: on a decode-bound cluster that horizon rejected 2.3x more requests: 2,581 against
// 1,100).
std::optional<InstanceId> Conductor::decode_instance_for(const ClusterView& cluster,
                                                         const RequestInfo& request, double horizon_s,
                                                         double& predicted_tbt_s) {
  const double expected_output = output_estimator_.expected_tokens();
  const double need = static_cast<double>(request.input_tokens) + expected_output;
  const bool predictive = options_.admission == Admission::kPredictive;
  const auto loads = cluster.decode_loads();
  const auto up = cluster.decode_up_flags();
  const auto instances = static_cast<uint32_t>(loads.size());
  decode_scores_.resize(instances);
  const double lowest = fill_scores(decode_scores_, [&](InstanceId i) {
    if (!up.empty() && up[i] == 0) return kInfinity;
    const kv::DecodeLoad& load = loads[i];
    double stay = 1.0;  // share of the running requests still there at the horizon
    if (predictive && load.running.requests > 0) {
      const double step_s =
          decode_cost(i).decode_step_time_s(load.running.requests, load.running.context_tokens);
      stay = 1.0 - std::min(1.0, horizon_s / (expected_output * step_s));
    }
    const kv::DecodeGroup joined = predictive ? load.incoming : kv::DecodeGroup{};
    const double kv = stay * static_cast<double>(load.running.kv_tokens) +
                      static_cast<double>(load.waiting.kv_tokens + joined.kv_tokens);
    if (kv + need > static_cast<double>(load.kv_capacity_tokens)) return kInfinity;
    const double requests = stay * static_cast<double>(load.running.requests) +
                            static_cast<double>(load.waiting.requests + joined.requests) + 1;
    const double context =
        stay * static_cast<double>(load.running.context_tokens) +
        static_cast<double>(load.waiting.context_tokens + joined.context_tokens + request.input_tokens);
    const double tbt_s = decode_cost(i).decode_step_time_s(static_cast<int64_t>(std::ceil(requests)),
                                                           static_cast<int64_t>(std::ceil(context)));
    return tbt_s <= options_.tbt_slo_s ? tbt_s : kInfinity;
  });
  const std::optional<InstanceId> best = pick_lowest(decode_scores_, lowest, decode_history_);
  if (best) predicted_tbt_s = decode_scores_[*best];
  return best;
}

Decision Conductor::schedule(const ClusterView& cluster, const RequestInfo& request, double now_s) {
  Decision d;
  auto any_up = [](std::span<const uint8_t> up, uint32_t instances) {
    return instances > 0 &&
           (up.empty() || std::any_of(up.begin(), up.end(), [](uint8_t f) { return f != 0; }));
  };
  if (!any_up(cluster.prefill_up_flags(), cluster.prefill_instance_count()) ||
      !any_up(cluster.decode_up_flags(), cluster.decode_instance_count())) {
    d.rejected = RejectReason::kNoInstance;
    return d;
  }
  // The prefix match's first lookups start now: the index is megabytes, and the checks and the decode
  // choice (which does not depend on the prefill's) run while they arrive.
  cluster.block_index().prefetch_match(request.block_keys);
  const int64_t capacity = max_decode_capacity_tokens(cluster);
  if (request.input_tokens > capacity || request.max_output_tokens > capacity - request.input_tokens) {
    d.rejected = RejectReason::kContextLength;
    return d;
  }
  d.decode_instance = choose_decode(cluster, request, d.predicted_tbt_s, d.decode_has_room);
  PrefillChoice p = choose_prefill(cluster, request, now_s);
  const int64_t n = request.input_tokens;
  const int64_t block = options_.block_size_tokens;
  d.prefill_instance = p.instance;
  d.local_prefix_tokens = std::min(p.local_blocks * block, n);
  d.fetched_prefix_tokens = std::min((p.local_blocks + p.fetched_blocks) * block, n) - d.local_prefix_tokens;
  d.fetch_from = p.fetch_from;
  d.prefill_tokens = std::max<int64_t>(1, n - d.prefix_tokens());
  d.transfer_s = p.transfer_s;
  d.queue_s = p.queue_s;
  d.prefill_s = p.prefill_s;
  d.ttft_s = p.queue_s + p.transfer_s + p.prefill_s;
  switch (request.admitted ? Admission::kNone : options_.admission) {
    case Admission::kNone:
      break;
    // Written !(t <= slo), not t > slo: a time that is NaN (a cost model gone wrong) is rejected too.
    case Admission::kSlo:
      if (!(d.ttft_s <= options_.ttft_slo_s)) {
        d.rejected = RejectReason::kTtft;
      } else if (!(d.predicted_tbt_s <= options_.tbt_slo_s)) {
        d.rejected = RejectReason::kTbt;
      }
      break;
    case Admission::kEarly:
    case Admission::kPredictive: {
      if (!(d.ttft_s <= options_.ttft_slo_s)) {
        d.rejected = RejectReason::kTtft;
        break;
      }
      // The request goes to the decode instance the judgement found room on.
      double tbt_s = 0;
      if (auto instance = decode_instance_for(cluster, request, d.queue_s, tbt_s)) {
        d.decode_instance = *instance;
        d.predicted_tbt_s = tbt_s;
      } else {
        d.rejected = RejectReason::kDecodeCapacity;
      }
      break;
    }
  }
  if (d.rejected == RejectReason::kNone) {
    prefill_history_.record(d.prefill_instance, now_s);
    decode_history_.record(d.decode_instance, now_s);
    if (d.fetched_prefix_tokens > 0) fetch_history_.record(d.fetch_from, now_s);
  }
  return d;
}

}  // namespace crescent::conductor
