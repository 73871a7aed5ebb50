#include "conductor/cluster_state.h"

#include <algorithm>
#include <ranges>

namespace crescent::conductor {

ClusterState::ClusterState(uint32_t prefill_instances, uint32_t decode_instances, int64_t block_size_tokens,
                           int64_t decode_kv_capacity_tokens)
    : block_size_tokens_(block_size_tokens),
      busy_until_s_(prefill_instances, 0.0),
      decode_(decode_instances),
      prefill_up_(prefill_instances, true),
      decode_up_(decode_instances, true),
      ready_s_(prefill_instances) {
  for (kv::DecodeLoad& d : decode_) d.kv_capacity_tokens = decode_kv_capacity_tokens;
  decode_choice_.set_all(decode_, decode_up_);
}

void ClusterState::reserve_prefix_cache_blocks(InstanceId instance, int64_t blocks) {
  if (reserved_blocks_.size() <= instance) reserved_blocks_.resize(instance + 1, 0);
  if (blocks <= reserved_blocks_[instance]) return;
  ready_s_[instance].reserve(static_cast<size_t>(blocks));
  index_reserved_blocks_ += blocks - reserved_blocks_[instance];
  reserved_blocks_[instance] = blocks;
  index_.reserve(index_reserved_blocks_);
}

InstanceId ClusterState::add_prefill_instance() {
  busy_until_s_.push_back(0.0);
  prefill_up_.push_back(false);
  ready_s_.emplace_back();
  prefill_changes_.note(static_cast<InstanceId>(busy_until_s_.size() - 1));
  return static_cast<InstanceId>(busy_until_s_.size() - 1);
}

InstanceId ClusterState::add_decode_instance(int64_t kv_capacity_tokens) {
  kv::DecodeLoad& load = decode_.emplace_back();
  load.kv_capacity_tokens = kv_capacity_tokens;
  decode_up_.push_back(false);
  const auto d = static_cast<InstanceId>(decode_.size() - 1);
  decode_changed(d);
  return d;
}

double ClusterState::prefix_ready_s(InstanceId holder, std::span<const BlockKey> keys,
                                    double stop_above_s) const {
  // The latest of the keys' times, whatever the order: a max of doubles is exact.
  double ready_s = 0;
  const auto& ready = ready_s_[holder];
  kv::for_each_prefetched(
      std::views::reverse(keys),
      [&](BlockKey k) {
        if (const CachedBlock* block = ready.find(k)) ready_s = std::max(ready_s, block->ready_s);
        return ready_s <= stop_above_s;
      },
      ready);
  return ready_s;
}

PrefillTimeline ClusterState::on_request_placed(const RequestInfo& request, const Decision& decision,
                                                double now_s) {
  // A remote prefix is read from its holder once the holder has computed it.
  double fetch_ready_s = 0;
  if (decision.fetched_prefix_tokens > 0) {
    const int64_t block = block_size_tokens_;
    const auto first = static_cast<size_t>(decision.local_prefix_tokens / block);
    const auto end = static_cast<size_t>((decision.prefix_tokens() + block - 1) / block);
    fetch_ready_s = prefix_ready_s(decision.fetch_from, request.block_keys.subspan(first, end - first));
  }
  // FIFO with predicted service times: the start and end of this prefill are known now.
  PrefillTimeline t;
  t.prefix_ready_s = fetch_ready_s;
  t.start_s = std::max({now_s, busy_until_s_[decision.prefill_instance], fetch_ready_s});
  t.compute_start_s = t.start_s + decision.transfer_s;
  t.done_s = t.compute_start_s + decision.prefill_s;
  set_busy_until(decision.prefill_instance, t.done_s);
  // Algorithm 1's "update the cache": the prompt's blocks will be on the chosen instance, readable once its
  // prefill is done, and later requests may be placed on them before the instance's own KV events say so.
  auto& ready = ready_s_[decision.prefill_instance];
  kv::for_each_prefetched(
      request.block_keys.first(std::min(request.block_keys.size(), request.reused_later_blocks)),
      [&](BlockKey k) {
        auto [block, added] = ready.try_emplace(k, CachedBlock{t.done_s});
        if (added) index_.add(k, decision.prefill_instance);
        if (!block->stored) ++block->placements;
      },
      ready, index_);
  if (request.max_output_tokens > 1) {
    kv::DecodeGroup& incoming = decode_[decision.decode_instance].incoming;
    incoming.requests += 1;
    incoming.context_tokens += request.input_tokens;
    incoming.kv_tokens += request.input_tokens + request.max_output_tokens;
    decode_changed(decision.decode_instance);
  }
  return t;
}

void ClusterState::on_kv_event(InstanceId instance, std::span<const BlockKey> stored,
                               std::span<const BlockKey> removed, double ready_s) {
  auto& ready = ready_s_[instance];
  kv::for_each_prefetched(
      removed,
      [&](BlockKey k) {
        index_.remove(k, instance);
        ready.erase(k);
      },
      ready, index_);
  kv::for_each_prefetched(
      stored,
      [&](BlockKey k) {
        // A block placed earlier keeps its predicted ready time: an instance stores a block (and says so)
        // when its prefill starts, before the block is computed. A block the ready map had (placed, or
        // stored before) is indexed already.
        auto [block, added] = ready.try_emplace(k, CachedBlock{ready_s});
        if (added) {
          index_.add(k, instance);
        } else {
          block->ready_s = std::max(block->ready_s, ready_s);
        }
        block->stored = true;
      },
      ready);
}

void ClusterState::release_placement(InstanceId instance, std::span<const BlockKey> block_keys) {
  auto& ready = ready_s_[instance];
  kv::for_each_prefetched(
      block_keys,
      [&](BlockKey k) {
        if (CachedBlock* block = ready.find(k); block != nullptr && !block->stored)
          release(instance, k, *block);
      },
      ready);
}

void ClusterState::on_kv_cleared(InstanceId instance) {
  auto& ready = ready_s_[instance];
  ready.for_each([&](BlockKey key, const CachedBlock&) { index_.remove(key, instance); });
  ready.clear();
}

void ClusterState::on_prefill_down(InstanceId instance, double now_s) {
  prefill_up_[instance] = false;
  on_kv_cleared(instance);
  set_busy_until(instance, now_s);  // logs the flag's change too
}

void ClusterState::on_decode_down(InstanceId d) {
  decode_up_[d] = false;
  const int64_t capacity = decode_[d].kv_capacity_tokens;
  decode_[d] = kv::DecodeLoad{};
  decode_[d].kv_capacity_tokens = capacity;
  decode_changed(d);
}

void ClusterState::on_prefill_computed(InstanceId instance, std::span<const BlockKey> block_keys,
                                       double now_s) {
  set_busy_until(instance, std::max(busy_until_s_[instance], now_s));
  // The blocks it stored are computed now, however long their placement predicted.
  auto& ready = ready_s_[instance];
  kv::for_each_prefetched(
      block_keys,
      [&](BlockKey k) {
        if (CachedBlock* block = ready.find(k); block != nullptr && block->stored) computed(*block, now_s);
      },
      ready);
}

void ClusterState::on_prefill_done(InstanceId instance, std::span<const BlockKey> block_keys, double now_s) {
  set_busy_until(instance, std::max(busy_until_s_[instance], now_s));
  // on_prefill_computed, then on_placement_settled, in one pass: the first changes only stored blocks, the
  // second only blocks not stored.
  auto& ready = ready_s_[instance];
  kv::for_each_prefetched(
      block_keys,
      [&](BlockKey k) {
        CachedBlock* block = ready.find(k);
        if (block == nullptr) return;
        if (block->stored) {
          computed(*block, now_s);
        } else {
          release(instance, k, *block);
        }
      },
      ready);
}

}  // namespace crescent::conductor
