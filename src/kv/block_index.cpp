#include "kv/block_index.h"

#include <algorithm>

namespace crescent::kv {
namespace {

// Keys looked up this far ahead are prefetched: the index is megabytes, so each lookup would otherwise wait
// on memory alone.
constexpr int64_t kMatchPrefetchAhead = 8;

}  // namespace

void BlockIndex::add(BlockKey key, InstanceId holder) {
  auto& list = *holders_.try_emplace(key, {}).first;
  if (std::find(list.begin(), list.end(), holder) != list.end()) return;
  list.push_back(holder);
  ++replicas_;
}

void BlockIndex::remove(BlockKey key, InstanceId holder) {
  auto* list = holders_.find(key);
  if (list == nullptr) return;
  auto pos = std::find(list->begin(), list->end(), holder);
  if (pos == list->end()) return;
  *pos = list->back();
  list->pop_back();
  --replicas_;
  if (list->empty()) holders_.erase(key);
}

void BlockIndex::apply(InstanceId holder, const TouchEvents& events) {
  for (BlockKey key : events.evicted) remove(key, holder);
  for (BlockKey key : events.stored) add(key, holder);
}

std::span<const InstanceId> BlockIndex::holders(BlockKey key) const {
  const auto* list = holders_.find(key);
  if (list == nullptr) return {};
  return {list->data(), list->size()};
}

void BlockIndex::match_prefix(std::span<const BlockKey> keys, PrefixMatch& out) const {
  out.matches.clear();
  out.best_blocks = 0;
  out.best_instance = 0;
  if (keys.empty()) return;
  // `alive_` holds the instances whose run is unbroken so far; an instance leaving it at block i matched i
  // blocks. Each step stamps the block's holders, then filters `alive_` by stamp: O(alive + holders) per
  // block.
  auto first = holders(keys[0]);
  alive_.assign(first.begin(), first.end());
  int64_t i = 1;
  for (; i < static_cast<int64_t>(keys.size()) && !alive_.empty(); ++i) {
    if (i + kMatchPrefetchAhead < static_cast<int64_t>(keys.size())) prefetch(keys[i + kMatchPrefetchAhead]);
    ++stamp_now_;
    for (InstanceId inst : holders(keys[i])) {
      if (inst >= stamp_.size()) stamp_.resize(inst + 1, 0);
      stamp_[inst] = stamp_now_;
    }
    next_alive_.clear();
    for (InstanceId inst : alive_) {
      if (inst < stamp_.size() && stamp_[inst] == stamp_now_) {
        next_alive_.push_back(inst);
      } else {
        out.matches.emplace_back(inst, i);
      }
    }
    alive_.swap(next_alive_);
  }
  for (InstanceId inst : alive_) out.matches.emplace_back(inst, i);
  for (const auto& [inst, run] : out.matches) {
    if (run > out.best_blocks || (run == out.best_blocks && inst < out.best_instance)) {
      out.best_blocks = run;
      out.best_instance = inst;
    }
  }
}

}  // namespace crescent::kv
