#include "cluster/conductor_core.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "common/secret.h"
#include "kv/block_key.h"

namespace crescent::cluster {

int64_t max_context_tokens(const ClusterOptions& options) {
  const ServeConfig& serve = options.config.serve;
  const int64_t capacity = decode_kv_capacity_tokens(options.config);
  int64_t limit = std::max<int64_t>(
      1, static_cast<int64_t>(std::floor(serve.max_request_kv_share * static_cast<double>(capacity))));
  if (options.model_context_tokens > 0) limit = std::min(limit, options.model_context_tokens);
  if (serve.max_model_len_tokens > 0) limit = std::min(limit, serve.max_model_len_tokens);
  return limit;
}

Status validate(const ClusterOptions& options) {
  return validate(options.config, options.block_size_tokens);
}

ConductorCore::ConductorCore(const ClusterOptions& options, InstanceLinks& links)
    : options_(options),
      links_(links),
      cost_(cost_model(options.config)),
      conductor_(cost_, conductor_options(options.config, options.config.serve.policy,
                                          options.config.serve.admission, options.block_size_tokens)),
      kv_capacity_tokens_(decode_kv_capacity_tokens(options.config)),
      state_(options.config.prefill_instances, options.config.decode_instances, options.block_size_tokens,
             kv_capacity_tokens_),
      metrics_(options.model_name),
      prefills_pending_(options.config.prefill_instances, 0) {}

InstanceId ConductorCore::add_prefill_instance() {
  prefills_pending_.push_back(0);
  return state_.add_prefill_instance();
}

InstanceId ConductorCore::add_decode_instance() {
  return state_.add_decode_instance(kv_capacity_tokens_);
}

conductor::Decision ConductorCore::place(ClusterRequest request, RequestCallbacks callbacks, uint64_t& id,
                                         double now_s) {
  // Recorded under the id it gets if accepted: an engine in this process may report on it from inside the
  // protocol's last step.
  // Unguessable (a keyed PRF of a counter, the key random per Conductor), so no id can be guessed from
  // another, and a restarted Conductor does not reuse ids that instances may still hold from its predecessor.
  uint64_t candidate = 0;
  while (candidate == 0 || requests_.contains(candidate)) candidate = request_ids_.next();
  Live& live = requests_[candidate];
  live.request = std::move(request);
  live.callbacks = std::move(callbacks);
  live.block_keys = kv::prompt_block_keys(live.request.prompt_token_ids, options_.block_size_tokens,
                                          options_.block_key_seed);
  live.submitted_s = now_s;
  live.placements = 1;
  live.summary.prompt_tokens = std::ssize(live.request.prompt_token_ids);
  const conductor::RequestInfo info{live.summary.prompt_tokens, live.block_keys, live.request.max_tokens};
  metrics_.observe_received();
  const auto decide_start = std::chrono::steady_clock::now();
  const conductor::Decision decision = cluster::place(conductor_, state_, info, candidate, now_s, *this);
  metrics_.observe_decision(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - decide_start).count());
  if (decision.rejected != conductor::RejectReason::kNone) {
    requests_.erase(candidate);
    metrics_.observe_rejection(conductor::to_string(decision.rejected));
    return decision;
  }
  id = candidate;
  return decision;
}

void ConductorCore::on_placed(const conductor::Decision& decision, uint64_t id, double now_s) {
  Live& live = requests_.at(id);
  enter_stage(id, live, RequestStage::kQueued, decision.queue_s, now_s);
  metrics_.observe_prefix(std::ssize(live.request.prompt_token_ids), decision.local_prefix_tokens,
                          decision.fetched_prefix_tokens);
  metrics_.observe_kv_bytes("prefix_fetch",
                            static_cast<double>(decision.fetched_prefix_tokens) * cost_.kv_bytes_per_token());
  live.summary.prefill_instance = decision.prefill_instance;
  live.summary.decode_instance = decision.decode_instance;
  live.predicted_prefill_s = decision.transfer_s + decision.prefill_s;
  live.placed = true;
  ++prefills_pending_[decision.prefill_instance];
}

void ConductorCore::expect(InstanceId d, uint64_t id, const conductor::RequestInfo&, double now_s) {
  links_.send_expect(d, id, requests_.at(id).request, now_s);
}

void ConductorCore::submit_prefill(InstanceId p, uint64_t id, const conductor::RequestInfo& request,
                                   const engine::EngineCore::ArrangedPrefix& prefix, InstanceId d,
                                   double now_s) {
  links_.send_prefill(p, id, requests_.at(id).request, request.block_keys, prefix, d, now_s);
}

void ConductorCore::cancel(uint64_t id, double now_s) {
  if (auto current = current_ids_.find(id); current != current_ids_.end()) id = current->second;
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  drop(id, now_s);
  erase(it);
}

void ConductorCore::erase(std::unordered_map<uint64_t, Live>::iterator it) {
  if (it->second.owner_id != 0) current_ids_.erase(it->second.owner_id);
  requests_.erase(it);
}

void ConductorCore::drop(uint64_t id, double now_s) {
  Live& live = requests_.at(id);
  release_placement(id, live, now_s);
  metrics_.observe_finished({.generation_tokens = live.summary.completion_tokens}, "abort");
}

void ConductorCore::release_placement(uint64_t id, Live& live, double now_s) {
  if (!live.placed) return;
  live.placed = false;
  const InstanceId p = live.summary.prefill_instance;
  links_.send_cancel(p, live.summary.decode_instance, id);
  if (!live.prefill_done) {
    const double remaining_s = live.prefill_started ? live.prefill_start_s + live.predicted_prefill_s - now_s
                                                    : live.predicted_prefill_s;
    state_.on_request_dropped(p, live.block_keys, remaining_s, now_s);
    if (--prefills_pending_[p] == 0) state_.on_prefill_idle(p, now_s);
  }
}

bool ConductorCore::place_again(uint64_t id, std::string_view reason, double now_s) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.placements >= options_.config.serve.max_request_placements) {
    return false;
  }
  release_placement(id, it->second, now_s);
  uint64_t next = 0;
  while (next == 0 || requests_.contains(next)) next = request_ids_.next();
  Live moved = std::move(it->second);
  requests_.erase(it);
  if (moved.owner_id == 0) moved.owner_id = id;
  ++moved.placements;
  moved.prefill_started = moved.prefill_done = false;
  moved.summary.cached_tokens = 0;
  // A stream with tokens out goes on from them: its prompt gains them and what is left is generated.
  if (const int64_t out = std::ssize(moved.output_ids); out > moved.request.output_offset) {
    ClusterRequest& r = moved.request;
    r.prompt_token_ids.insert(r.prompt_token_ids.end(), moved.output_ids.begin() + r.output_offset,
                              moved.output_ids.end());
    r.max_tokens -= out - r.output_offset;
    r.output_offset = out;
    moved.block_keys =
        kv::prompt_block_keys(r.prompt_token_ids, options_.block_size_tokens, options_.block_key_seed);
  }
  Live& live = requests_.emplace(next, std::move(moved)).first->second;
  current_ids_[live.owner_id] = next;
  conductor::RequestInfo info{std::ssize(live.request.prompt_token_ids), live.block_keys,
                              live.request.max_tokens};
  info.admitted = true;
  const conductor::Decision decision = cluster::place(conductor_, state_, info, next, now_s, *this);
  if (decision.rejected != conductor::RejectReason::kNone) {
    // Back under the id the caller knows, for it to fail.
    Live back = std::move(live);
    requests_.erase(next);
    current_ids_[back.owner_id] = id;
    if (back.owner_id == id) current_ids_.erase(id);
    requests_.emplace(id, std::move(back));
    return false;
  }
  metrics_.observe_replaced(reason);
  return true;
}

void ConductorCore::on_prefill_start(uint64_t id, int64_t hit_tokens, double now_s) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Live& live = it->second;
  live.summary.cached_tokens = hit_tokens;
  live.prefill_start_s = now_s;
  live.prefill_started = true;
  enter_stage(id, live, RequestStage::kPrefill, live.predicted_prefill_s, now_s);
  if (live.request.max_tokens > 1) {
    links_.send_kv_coming(live.summary.decode_instance, id, std::ssize(live.request.prompt_token_ids),
                          live.predicted_prefill_s);
  }
}

void ConductorCore::on_first_token(InstanceId instance, uint64_t id, int64_t first_token, double now_s,
                                   const model::TokenLogprobs* logprobs) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    state_.on_prefill_done(instance, {}, now_s);
    return;
  }
  state_.on_prefill_done(instance, it->second.block_keys, now_s);
  it->second.prefill_done = true;
  it->second.first_token = first_token;
  // Its KV may still be on its way to decode (the whole prompt's transfer at most, streamed since the start).
  enter_stage(id, it->second, RequestStage::kKvHandoff,
              cost_.kv_transfer_time_s(std::ssize(it->second.request.prompt_token_ids)), now_s);
  // Nothing else placed there is waiting: the instance is idle now, whatever its queue's prediction said
  // (a model faster than the cost model's roofline finishes early).
  if (--prefills_pending_[instance] == 0) state_.on_prefill_idle(instance, now_s);
  emit_token(id, first_token, now_s, logprobs);  // the first token comes from the prefill
  it = requests_.find(id);
  if (it != requests_.end() && it->second.request.max_tokens <= 1) finish(id, now_s, "length");
}

void ConductorCore::on_kv_shipped(uint64_t id, double now_s) {
  auto it = requests_.find(id);
  if (it == requests_.end() || !it->second.prefill_done || it->second.request.max_tokens <= 1) return;
  Live& live = it->second;
  const auto input = static_cast<int64_t>(live.request.prompt_token_ids.size());
  // Decoding may wait for a place in a batch, but a decode instance that heartbeats and stopped stepping
  // must not hang its requests: the gap since the last progress has a deadline, moved on by each token.
  const double step_s = cost_.decode_step_time_s(1, input + live.request.max_tokens);
  enter_stage(id, live, RequestStage::kDecoding, step_s, now_s);
  live.decode_window_s = live.stage_deadline_s - now_s;
  live.decode_progress_s = now_s;
  metrics_.observe_kv_bytes("prefill_to_decode", static_cast<double>(input) * cost_.kv_bytes_per_token());
  metrics_.observe_kv_exposed_transfer(now_s - live.first_token_s);
  links_.send_kv_handoff(live.summary.decode_instance, id, input, live.first_token, now_s);
}

void ConductorCore::on_tokens(std::span<const uint64_t> ids, std::span<const int64_t> tokens, double now_s,
                              std::span<const uint32_t> logprob_rows,
                              std::span<const model::TokenLogprobs> logprobs) {
  size_t row = 0;  // the next of logprob_rows
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t id = ids[i];
    const model::TokenLogprobs* token_logprobs = nullptr;
    if (row < logprob_rows.size() && row < logprobs.size() && logprob_rows[row] == i) {
      token_logprobs = &logprobs[row++];
    }
    emit_token(id, i < tokens.size() ? tokens[i] : 0, now_s, token_logprobs);
    auto it = requests_.find(id);
    // Its tokens from this placement (a stream moved here had output_offset before).
    if (it != requests_.end() && it->second.summary.completion_tokens - it->second.request.output_offset >=
                                     it->second.request.max_tokens) {
      finish(id, now_s, "length");
    }
  }
}

void ConductorCore::fail(uint64_t id, const std::string& code, const std::string& message, double now_s) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  drop(id, now_s);
  metrics_.observe_failure(code);
  RequestCallbacks callbacks = std::move(it->second.callbacks);
  erase(it);
  if (callbacks.on_error) callbacks.on_error(code, message);
}

void ConductorCore::on_prefill_down(InstanceId p, double now_s) {
  state_.on_prefill_down(p, now_s);
  // Those whose KV had not reached decode start again elsewhere (after their first token: from it on).
  scratch_ids_.clear();
  for (const auto& [id, live] : requests_) {
    if (live.summary.prefill_instance == p && live.placed &&
        (!live.prefill_done || live.stage == RequestStage::kKvHandoff)) {
      scratch_ids_.push_back(id);
    }
  }
  place_again_or_fail(scratch_ids_, "prefill_down", fmt::format("prefill instance {} went down", p), now_s);
}

void ConductorCore::on_decode_down(InstanceId d, double now_s) {
  state_.on_decode_down(d);
  // Its streams move: each is prefilled again with the tokens it had (from the caches or the pool where the
  // blocks are) and decodes elsewhere; those not yet there are placed again.
  scratch_ids_.clear();
  for (const auto& [id, live] : requests_) {
    if (live.summary.decode_instance == d && live.placed && live.request.max_tokens > 1)
      scratch_ids_.push_back(id);
  }
  place_again_or_fail(scratch_ids_, "decode_down", fmt::format("decode instance {} went down", d), now_s);
}

void ConductorCore::place_again_or_fail(std::vector<uint64_t> ids, std::string_view reason,
                                        const std::string& why, double now_s) {
  for (uint64_t id : ids) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    const int64_t placements = it->second.placements;
    if (!place_again(id, reason, now_s)) {
      fail(id, "instance_down",
           fmt::format("{}, and the request could not be placed again (placed {} of at most {} times, or no "
                       "instance could take it)",
                       why, placements, options_.config.serve.max_request_placements),
           now_s);
    }
  }
}

void ConductorCore::enter_stage(uint64_t id, Live& live, RequestStage stage, double predicted_s,
                                double now_s) {
  const ServeConfig& serve = options_.config.serve;
  live.stage = stage;
  live.stage_deadline_s =
      now_s + serve.stage_timeout_floor_s + serve.stage_timeout_factor * std::max(0.0, predicted_s);
  deadlines_.emplace(live.stage_deadline_s, id);
}

size_t ConductorCore::expire_deadlines(double now_s) {
  size_t expired = 0;
  while (!deadlines_.empty() && deadlines_.top().first <= now_s) {
    const auto [deadline_s, id] = deadlines_.top();
    deadlines_.pop();
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second.stage_deadline_s != deadline_s) continue;  // moved on, or ended
    Live& live = it->second;
    if (live.stage == RequestStage::kDecoding && live.decode_progress_s + live.decode_window_s > now_s) {
      // Tokens came since this deadline was set: one heap entry per window, not one per token.
      live.stage_deadline_s = live.decode_progress_s + live.decode_window_s;
      deadlines_.emplace(live.stage_deadline_s, id);
      continue;
    }
    const double waited_s = now_s - (live.stage == RequestStage::kQueued     ? live.submitted_s
                                     : live.stage == RequestStage::kPrefill  ? live.prefill_start_s
                                     : live.stage == RequestStage::kDecoding ? live.decode_progress_s
                                                                             : live.first_token_s);
    const InstanceId p = live.summary.prefill_instance;
    std::string code, message;
    switch (live.stage) {
      case RequestStage::kQueued:
        code = "queue_timeout";
        message = fmt::format("prefill instance {} did not start its prefill within {:.1f} s", p, waited_s);
        break;
      case RequestStage::kPrefill:
        code = "prefill_timeout";
        message = fmt::format("prefill instance {} did not finish its prefill within {:.1f} s of its start",
                              p, waited_s);
        break;
      case RequestStage::kKvHandoff:
        code = "kv_handoff_timeout";
        message = fmt::format("prefill instance {} did not hand its KV to decode instance {} within {:.1f} s",
                              p, live.summary.decode_instance, waited_s);
        break;
      case RequestStage::kDecoding:
        code = "decode_timeout";
        message = fmt::format("decode instance {} gave no token for {:.1f} s", live.summary.decode_instance,
                              waited_s);
        break;
    }
    fail(id, code, message, now_s);
    ++expired;
  }
  return expired;
}

double ConductorCore::next_deadline_s() const {
  return deadlines_.empty() ? std::numeric_limits<double>::infinity() : deadlines_.top().first;
}

double ConductorCore::stage_deadline_s(uint64_t id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return std::numeric_limits<double>::infinity();
  const Live& live = it->second;
  // Decoding's queued entry moves on lazily; the deadline itself moved with the last token.
  return live.stage == RequestStage::kDecoding ? live.decode_progress_s + live.decode_window_s
                                               : live.stage_deadline_s;
}

int64_t ConductorCore::next_mock_token(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end()
             ? 0
             : engine::mock_token(it->second.request.seed, it->second.summary.completion_tokens);
}

void ConductorCore::emit_token(uint64_t id, int64_t token, double now_s,
                               const model::TokenLogprobs* logprobs) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Live& live = it->second;
  if (live.summary.completion_tokens == 0) {
    live.first_token_s = now_s;
  } else {
    metrics_.observe_token_gap(now_s - live.last_token_s);
  }
  live.last_token_s = now_s;
  live.output_ids.push_back(token);
  live.decode_progress_s = now_s;  // its decoding deadline moves when it surfaces (expire_deadlines)
  ++live.summary.completion_tokens;
  const InstanceId p = live.summary.prefill_instance, d = live.summary.decode_instance;
  // Logprobs go to a request that asked for them only.
  std::span<const model::TokenLogprobs> token_logprobs;
  if (logprobs != nullptr && live.request.top_logprobs != model::kNoLogprobs) token_logprobs = {logprobs, 1};
  if (live.callbacks.on_tokens &&
      !live.callbacks.on_tokens(std::span<const int64_t>(&token, 1), token_logprobs)) {
    // The owner's stop (EOS, a stop string): a finished request whose instances drop the rest.
    links_.send_cancel(p, d, id);
    finish(id, now_s, "stop");
  }
}

void ConductorCore::finish(uint64_t id, double now_s, std::string_view finished_reason) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  const Live& live = it->second;
  conductor_.observe_output(live.summary.completion_tokens);
  metrics_.observe_finished({.prompt_tokens = live.summary.prompt_tokens,
                             .generation_tokens = live.summary.completion_tokens,
                             .ttft_s = live.first_token_s - live.submitted_s,
                             .e2e_s = now_s - live.submitted_s,
                             .queue_s = live.prefill_start_s - live.submitted_s,
                             .prefill_s = live.first_token_s - live.prefill_start_s,
                             .decode_s = now_s - live.first_token_s},
                            finished_reason);
  RequestCallbacks callbacks = std::move(it->second.callbacks);
  const RequestSummary summary = it->second.summary;
  erase(it);
  if (callbacks.on_done) callbacks.on_done(summary);
}

}  // namespace crescent::cluster
