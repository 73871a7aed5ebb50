#include "engine/engine_core.h"

#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <limits>
#include <utility>

namespace crescent::engine {

int64_t mock_token(uint64_t seed, int64_t index) {
  const uint64_t pair[2] = {seed, static_cast<uint64_t>(index)};
  const uint64_t h = XXH3_64bits(pair, sizeof(pair));
  const uint64_t letter = h % 32;
  return letter < 26 ? 'a' + static_cast<int64_t>(letter) : ' ';
}

EngineCore::EngineCore(const EngineOptions& options, Executor& executor, EngineListener& listener)
    : executor_(executor), options_(options), listener_(listener) {
  if (options.prefix_cache) {
    cache_.emplace(std::max<int64_t>(1, options.kv_capacity_tokens / options.block_size_tokens));
    executor_.use_prefix_cache(&*cache_);
  }
}

void EngineCore::add(kv::DecodeGroup& group, const Record& r, int sign) {
  group.requests += sign;
  group.context_tokens += sign * r.input_tokens;
  group.kv_tokens += sign * (r.input_tokens + r.output_tokens);
}

void EngineCore::submit_prompt(RequestId id, int64_t input_tokens, int64_t output_tokens,
                               std::span<const BlockKey> block_keys, double now_s) {
  submit_prompt(id, input_tokens, output_tokens, block_keys, now_s, ArrangedPrefix{});
}

void EngineCore::submit_prompt(RequestId id, int64_t input_tokens, int64_t output_tokens,
                               std::span<const BlockKey> block_keys, double now_s, ArrangedPrefix prefix,
                               size_t keyed_blocks) {
  assert(input_tokens >= 1 && output_tokens >= 1 && !records_.contains(id));
  Record& r = records_[id];
  r.arranged = prefix;
  r.input_tokens = input_tokens;
  r.output_tokens = output_tokens;
  r.decode_steps = output_tokens - 1;
  if (cache_) r.block_keys.assign(block_keys.begin(), block_keys.end());
  r.keyed_blocks = keyed_blocks;
  // A prefill instance takes a prompt's blocks into its DRAM cache when the prompt is queued, pinned until
  // its prefill ends (Algorithm 1's cache update, as ClusterState indexes them): the prefix it will reuse
  // cannot be evicted while it waits, and the blocks it will compute are there for the prompts queued behind
  // it. What it will reuse is counted at admission (computed_prefix_tokens), once the prompts ahead of it
  // have computed theirs.
  now_s_ = std::max(now_s_, now_s);
  if (cache_ && options_.prefix_in_dram) take_cached_prefix(id, r, now_s);
  r.where = Record::Where::kQueued;
  waiting_prompts_.push_back(id);
  steady_decode_ = false;
  ++outstanding_;
  if (!busy_) start_iteration(now_s);
}

void EngineCore::expect(RequestId id, int64_t input_tokens, int64_t output_tokens, double now_s) {
  assert(output_tokens >= 2 && !records_.contains(id));
  Record& r = records_[id];
  r.input_tokens = input_tokens;
  r.output_tokens = output_tokens;
  r.decode_steps = output_tokens - 1;
  add(incoming_, r, +1);
  if (options_.kv_transfer_timeout_s > 0) set_kv_deadline(id, now_s + options_.kv_transfer_timeout_s);
}

bool EngineCore::set_kv_deadline(RequestId id, double deadline_s) {
  auto it = records_.find(id);
  if (it == records_.end() || it->second.where != Record::Where::kIncoming) return false;
  it->second.kv_deadline_s = deadline_s;
  if (deadline_s != std::numeric_limits<double>::infinity()) kv_deadlines_.emplace(deadline_s, id);
  return true;
}

bool EngineCore::submit_decode(RequestId id, double first_token_s, double now_s) {
  auto it = records_.find(id);
  if (it == records_.end() || it->second.where != Record::Where::kIncoming) return false;
  Record& r = it->second;
  r.first_token_s = first_token_s;
  r.where = Record::Where::kWaitingDecode;
  add(incoming_, r, -1);
  add(waiting_decode_load_, r, +1);
  waiting_decode_.push_back(id);
  steady_decode_ = false;
  ++outstanding_;
  if (!busy_) start_iteration(now_s);
  return true;
}

void EngineCore::advance_until(double t_s) {
  if (t_s != std::numeric_limits<double>::infinity()) now_s_ = std::max(now_s_, t_s);
  // Reservations whose KV never came.
  while (!kv_deadlines_.empty() && kv_deadlines_.top().first <= t_s) {
    const auto [deadline_s, id] = kv_deadlines_.top();
    kv_deadlines_.pop();
    auto it = records_.find(id);
    if (it == records_.end() || it->second.where != Record::Where::kIncoming ||
        it->second.kv_deadline_s != deadline_s) {
      continue;  // arrived, cancelled, or its deadline moved
    }
    add(incoming_, it->second, -1);
    records_.erase(it);
    listener_.on_kv_timeout(id, deadline_s);
    executor_.release(id);
  }
  while (busy_ && end_s_ <= t_s) {
    if (steady_decode_ && next_leave_step_ > log_.next_step()) {
      // What finish_iteration and start_iteration would do for a step no request joins or leaves after
      // (the simulator's decode instances run ~100 of them per request): the same sums, the same order.
      assert(decode_only_step() && plan_.decode_requests == running_.requests);
      ++iterations_;
      ++decode_steps_;
      ++fast_decode_steps_;
      log_.append(end_s_);
      running_.context_tokens += running_.requests;
      plan_.decode_context_tokens = running_.context_tokens;
      end_s_ += executor_.run_iteration_s(plan_);
      continue;
    }
    finish_iteration(end_s_);
    start_iteration(end_s_);
  }
}

// Whether the iteration under way only decodes and, unless a request leaves after it, the next would be the
// same batch with one more token each: no prompt is waiting or prefilling, no request waits to join or was
// cancelled, the executor needs no ids (a plan names them when it does) and the listener no tokens.
bool EngineCore::decode_only_step() const {
  const bool only_decode =
      busy_ && plan_.decode_requests > 0 && !plan_.prefill_request && plan_.decode_ids.empty();
  assert(!only_decode || plan_.prefill_tokens + plan_.load_tokens == 0);
  return only_decode && !prefilling_ && waiting_prompts_.empty() && waiting_decode_.empty() &&
         !decoding_finished_ && !options_.report_tokens;
}

// Looks up `id`'s blocks in the prefix cache and pins them there (absent ones are stored), evicting what no
// longer fits; the listener hears what was stored and removed. Returns the cached prefix, in tokens.
int64_t EngineCore::take_cached_prefix(RequestId id, Record& r, double now_s) {
  const int64_t block = options_.block_size_tokens;
  touch_events_.clear();
  cache_->touch(r.block_keys, /*pin=*/true, &touch_events_, r.keyed_blocks);
  const int64_t hit_tokens = std::min(touch_events_.hit_blocks * block, r.input_tokens);
  r.pinned = touch_events_.pinned;
  r.unkeyed = touch_events_.pinned_unkeyed;
  // A DRAM cache's unkeyed blocks are not looked at again (computed_prefix_tokens would find none cached).
  if (options_.prefix_in_dram) r.block_keys.resize(std::min(r.block_keys.size(), touch_events_.unkeyed_from));
  if (!options_.prefix_in_dram) {
    const int64_t unpinned_blocks = cache_->size_blocks() - cache_->pinned_blocks();
    const int64_t over_tokens = reserved_kv_tokens_ + unpinned_blocks * block - options_.kv_capacity_tokens;
    if (over_tokens > 0) cache_->evict_unpinned((over_tokens + block - 1) / block, &touch_events_);
  }
  // A DRAM cache stores blocks before they are computed: this prompt will compute the ones it stored.
  if (options_.prefix_in_dram) {
    r.owned = touch_events_.stored;
    for (BlockKey k : r.owned) *pending_.try_emplace(k, id).first = id;
  }
  // Blocks it could not keep are reported as removed: whoever indexed them for this prompt's placement
  // (ClusterState) must not count on them. A DRAM cache also reports the blocks it already held as stored:
  // a listener that forgot them (a restarted Conductor, a gap in its KV events) learns them again.
  auto& removed = touch_events_.evicted;
  removed.insert(removed.end(), touch_events_.skipped.begin(), touch_events_.skipped.end());
  const std::vector<BlockKey>& stored = options_.prefix_in_dram ? touch_events_.pinned : touch_events_.stored;
  if (!removed.empty()) executor_.on_blocks_removed(removed);
  if (!stored.empty() || !removed.empty()) listener_.on_kv_event(stored, removed, now_s);
  return hit_tokens;
}

int64_t EngineCore::adopt_prefix(std::span<const BlockKey> keys) {
  if (!cache_ || keys.empty()) return 0;
  touch_events_.clear();
  cache_->touch(keys, /*pin=*/false, &touch_events_);
  auto& removed = touch_events_.evicted;
  removed.insert(removed.end(), touch_events_.skipped.begin(), touch_events_.skipped.end());
  if (!removed.empty()) executor_.on_blocks_removed(removed);
  listener_.on_kv_event(touch_events_.stored, removed, now_s_);
  return static_cast<int64_t>(
      std::count_if(keys.begin(), keys.end(), [&](BlockKey k) { return cache_->contains(k); }));
}

// With a DRAM cache, at admission: the leading blocks of `id`'s prompt whose KV exists (the prompts ahead in
// the FIFO have finished, so a block still pending belongs to this prompt, to one queued behind it that
// stored what this one had no room for, or to one that was cancelled: this prompt then computes it). Returns
// tokens.
int64_t EngineCore::computed_prefix_tokens(RequestId id, Record& r) {
  int64_t blocks = 0;
  bool run = true;
  for (BlockKey k : r.block_keys) {
    RequestId* owner = pending_.find(k);
    if (owner != nullptr && *owner != id && !records_.contains(*owner)) {
      *owner = id;  // its owner was cancelled
      r.owned.push_back(k);
    }
    if (run && cache_->contains(k) && owner == nullptr) {
      ++blocks;
    } else {
      run = false;
    }
  }
  return std::min(blocks * options_.block_size_tokens, r.input_tokens);
}

// A DRAM cache's blocks `id` stored but never computed (it was cancelled): those nobody else uses leave the
// cache, and the listener hears they are removed; the others stay pending, for the prompt that uses them.
void EngineCore::drop_uncomputed(RequestId id, Record& r) {
  std::vector<BlockKey> removed;
  for (BlockKey k : r.owned) {
    const RequestId* owner = pending_.find(k);
    if (owner == nullptr || *owner != id) continue;
    if (cache_->erase_unpinned(k)) {
      pending_.erase(k);
      removed.push_back(k);
    }
  }
  std::vector<BlockKey>().swap(r.owned);
  if (removed.empty()) return;
  executor_.on_blocks_removed(removed);
  listener_.on_kv_event({}, removed, now_s_);
}

// A DRAM cache's blocks `id` computed are no longer pending.
void EngineCore::mark_computed(RequestId id, Record& r) {
  kv::for_each_prefetched(
      r.owned,
      [&](BlockKey k) {
        if (const RequestId* owner = pending_.find(k); owner != nullptr && *owner == id) pending_.erase(k);
      },
      pending_);
  std::vector<BlockKey>().swap(r.owned);
}

// Reserves HBM for a prompt and starts its prefill at `now_s` if it fits; false (nothing changed) if not.
// HBM accounting: capacity = reserved KV of admitted requests, prompt + max output each, + with a prefix
// cache, cached blocks no admitted request uses (unpinned). Those are evictable, so a request fits when
// reserved + its need <= capacity; once it is admitted, unpinned blocks are evicted LRU first until
// reserved + unpinned * block <= capacity. A cached block two admitted requests share is counted in both
// reservations (conservative: vLLM shares it). A prefix cache in DRAM (prefix_in_dram) is not where the
// prompt computes: nothing is reserved in it, and the prompt's blocks were taken into it when it was queued.
bool EngineCore::admit_prompt(RequestId id, Record& r, double now_s) {
  const int64_t need = r.input_tokens + r.output_tokens;
  if (!options_.prefix_in_dram && reserved_kv_tokens_ + need > options_.kv_capacity_tokens) return false;
  reserved_kv_tokens_ += need;
  if (cache_) {
    r.cached_prefix_tokens =
        options_.prefix_in_dram ? computed_prefix_tokens(id, r) : take_cached_prefix(id, r, now_s);
  }
  const int64_t hit_tokens =
      std::min(std::max(r.cached_prefix_tokens, r.arranged.reused_tokens), r.input_tokens);
  // The last prompt token is always recomputed: its logits give the first output token (as the Conductor).
  r.prefill_tokens = std::max<int64_t>(1, r.input_tokens - hit_tokens);
  r.reused_tokens = std::max<int64_t>(0, r.input_tokens - r.prefill_tokens);
  if (options_.prefix_in_dram) r.load_tokens = hit_tokens;
  r.where = Record::Where::kPrefilling;
  listener_.on_prefill_start(id, now_s,
                             {.hit_tokens = hit_tokens,
                              .local_hit_tokens = r.cached_prefix_tokens,
                              .prefill_tokens = r.prefill_tokens,
                              .reused_tokens = r.reused_tokens});
  return true;
}

// Moves requests whose KV arrived into the batch while their KV (prompt + full output) fits in HBM.
void EngineCore::admit_decodes() {
  while (!waiting_decode_.empty()) {
    const RequestId id = waiting_decode_.front();
    Record& r = records_.at(id);
    const int64_t need = r.input_tokens + r.output_tokens;
    if (reserved_kv_tokens_ + need > options_.kv_capacity_tokens) break;
    waiting_decode_.pop_front();
    reserved_kv_tokens_ += need;
    add(waiting_decode_load_, r, -1);
    join_batch(id, r);
  }
}

void EngineCore::join_batch(RequestId id, Record& r) {
  r.where = Record::Where::kDecoding;
  add(running_, r, +1);
  r.join_step = log_.next_step();
  leaving_.emplace(r.join_step + r.decode_steps - 1, id);
  leaving_changed();
  decoding_.push_back({id, &r, r.join_step});
}

void EngineCore::start_iteration(double start_s) {
  steady_decode_ = false;
  admit_decodes();
  if (!prefilling_ && !waiting_prompts_.empty()) {
    const RequestId id = waiting_prompts_.front();
    Record& r = records_.at(id);
    if (r.arranged.ready_s > start_s && running_.requests == 0) {
      // Its fetched prefix is still being computed at the source: wait for it (FIFO: so does everyone).
      plan_ = IterationPlan{};
      busy_ = true;
      end_s_ = r.arranged.ready_s;
      return;
    }
    if (r.arranged.ready_s <= start_s && admit_prompt(id, r, start_s)) {
      prefilling_ = id;
      waiting_prompts_.pop_front();
    }
  }
  const bool chunked = options_.chunk_tokens > 0;
  plan_ = IterationPlan{};
  if (prefilling_) {
    const Record& r = records_.at(*prefilling_);
    const int64_t left = r.prefill_tokens - r.prefill_done_tokens;
    // Chunked prefill spends its token budget on decodes first, one token each; the prompt gets the rest.
    plan_.prefill_request = prefilling_;
    plan_.prefill_tokens =
        chunked ? std::min(left, std::max<int64_t>(0, options_.chunk_tokens - running_.requests)) : left;
    plan_.prefill_prefix_tokens = r.reused_tokens + r.prefill_done_tokens;
    if (r.prefill_done_tokens == 0) {
      plan_.load_tokens = r.load_tokens;
      plan_.fetch_tokens = std::min(r.arranged.fetched_tokens, r.load_tokens);
    }
  }
  if (running_.requests > 0 && (chunked || plan_.prefill_tokens == 0)) {
    plan_.decode_requests = running_.requests;
    plan_.decode_context_tokens = running_.context_tokens;
    if (executor_.needs_request_ids()) {
      decode_ids_.clear();
      for (const Decoding& d : decoding_) {
        if (!d.record->finished) decode_ids_.push_back(d.id);
      }
      plan_.decode_ids = decode_ids_;
    }
  }
  busy_ = !plan_.empty();
  if (busy_) end_s_ = start_s + executor_.run_iteration_s(plan_);
  steady_decode_ = decode_only_step();
}

void EngineCore::finish_iteration(double end_s) {
  if (plan_.empty()) return;  // a wait for a fetched prefix, not an iteration
  ++iterations_;
  if (plan_.decode_requests > 0) {
    ++decode_steps_;
    const int64_t step = log_.next_step();
    log_.append(end_s);
    running_.context_tokens += running_.requests;
    if (options_.report_tokens) {
      token_ids_.clear();
      for (const Decoding& d : decoding_) {
        if (!d.record->finished) token_ids_.push_back(d.id);
      }
      listener_.on_tokens(token_ids_, end_s);
    }
    while (!leaving_.empty() && leaving_.top().first <= step) {
      const RequestId id = leaving_.top().second;
      leaving_.pop();
      leaving_changed();
      auto it = records_.find(id);
      if (it == records_.end() || it->second.finished) continue;  // cancelled
      leave_batch(id, step, end_s);
    }
    if (decoding_finished_) {  // else the front is as it was: no record read per step
      while (!decoding_.empty() && decoding_.front().record->finished) {
        records_.erase(decoding_.front().id);
        decoding_.pop_front();
      }
      decoding_finished_ = false;
    }
    log_.trim_before(decoding_.empty() ? log_.next_step() : decoding_.front().join_step);
  }
  if (plan_.prefill_tokens > 0 && prefilling_ == plan_.prefill_request) {  // not cancelled meanwhile
    const RequestId id = *prefilling_;
    Record& r = records_.at(id);
    r.prefill_done_tokens += plan_.prefill_tokens;
    if (r.prefill_done_tokens < r.prefill_tokens) {
      listener_.on_prefill_chunk(id, r.reused_tokens + r.prefill_done_tokens, end_s);
    } else {
      prefilling_.reset();
      if (options_.prefix_in_dram) mark_computed(id, r);
      r.first_token_s = end_s;
      listener_.on_first_token(id, end_s);
      if (r.decode_steps == 0) {
        finish(id, r, end_s, std::nullopt);
      } else {
        join_batch(id, r);
      }
    }
  }
}

double EngineCore::next_event_s() const {
  double next = busy_ ? end_s_ : std::numeric_limits<double>::infinity();
  if (!kv_deadlines_.empty()) next = std::min(next, kv_deadlines_.top().first);  // maybe stale: wakes early
  return next;
}

void EngineCore::cancel_all() {
  std::vector<RequestId> ids;
  ids.reserve(records_.size());
  for (const auto& [id, record] : records_) ids.push_back(id);
  for (RequestId id : ids) cancel(id);
}

void EngineCore::cancel(RequestId id) {
  auto it = records_.find(id);
  if (it == records_.end() || it->second.finished) return;
  Record& r = it->second;
  steady_decode_ = false;
  switch (r.where) {
    case Record::Where::kIncoming:
      add(incoming_, r, -1);
      records_.erase(it);
      executor_.release(id);
      return;
    case Record::Where::kQueued:
      std::erase(waiting_prompts_, id);
      if (cache_) {
        // A DRAM prefix cache pinned it when it was queued; its unkeyed blocks were never computed.
        cache_->erase(std::exchange(r.unkeyed, {}));
        cache_->unpin(r.pinned);
        drop_uncomputed(id, r);
      }
      --outstanding_;
      records_.erase(it);
      executor_.release(id);
      return;
    case Record::Where::kWaitingDecode:
      std::erase(waiting_decode_, id);
      add(waiting_decode_load_, r, -1);
      --outstanding_;
      records_.erase(it);
      executor_.release(id);
      return;
    case Record::Where::kPrefilling:
      // The iteration under way may be computing its prompt: it finishes, and its result is dropped.
      prefilling_.reset();
      break;
    case Record::Where::kDecoding:
      running_.requests -= 1;
      running_.context_tokens -= r.input_tokens + (log_.next_step() - r.join_step);
      running_.kv_tokens -= r.input_tokens + r.output_tokens;
      break;
  }
  reserved_kv_tokens_ -= r.input_tokens + r.output_tokens;
  if (cache_) {
    // A DRAM cache's blocks this prompt has not computed leave it (drop_uncomputed, below, for the keyed).
    if (r.where == Record::Where::kPrefilling && options_.prefix_in_dram)
      cache_->erase(std::exchange(r.unkeyed, {}));
    cache_->unpin(r.pinned, std::exchange(r.unkeyed, {}));
  }
  --outstanding_;
  executor_.release(id);
  if (r.where == Record::Where::kPrefilling) {
    if (cache_) drop_uncomputed(id, r);
    records_.erase(it);
  } else {
    r.finished = true;  // erased once it reaches the front of decoding_; its leaving_ entry is skipped
    decoding_finished_ = true;
    std::vector<BlockKey>().swap(r.pinned);
    std::vector<BlockKey>().swap(r.block_keys);
  }
}

void EngineCore::leave_batch(RequestId id, int64_t step, double now_s) {
  Record& r = records_.at(id);
  running_.requests -= 1;
  running_.context_tokens -= r.input_tokens + r.decode_steps;
  running_.kv_tokens -= r.input_tokens + r.output_tokens;
  finish(id, r, now_s, log_.gaps(r.first_token_s, r.join_step, step));
}

void EngineCore::finish(RequestId id, Record& r, double now_s, const std::optional<StepLog::Gaps>& gaps) {
  reserved_kv_tokens_ -= r.input_tokens + r.output_tokens;
  if (cache_) cache_->unpin(r.pinned, std::exchange(r.unkeyed, {}));
  --outstanding_;
  listener_.on_finished(id, now_s, gaps);
  executor_.release(id);
  if (r.decode_steps == 0) {
    records_.erase(id);  // never in decoding_
  } else {
    r.finished = true;  // erased once it reaches the front of decoding_
    decoding_finished_ = true;
    std::vector<BlockKey>().swap(r.pinned);
    std::vector<BlockKey>().swap(r.block_keys);
  }
}

}  // namespace crescent::engine
