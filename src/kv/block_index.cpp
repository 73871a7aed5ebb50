#include "kv/block_index.h"

#include <algorithm>
#include <limits>

namespace crescent::kv {
namespace {

// Keys looked up this far ahead are prefetched: the index is megabytes, so each lookup would otherwise wait
// on memory alone.
constexpr auto kMatchPrefetchAhead = static_cast<int64_t>(BlockIndex::kMatchPrefetchAheadKeys);

// A first key with this many holders or more has its runs kept for the next match (a copy of run_blocks,
// where writing fewer holders' runs costs less than that copy).
constexpr size_t kKeepFirstRunsFromHolders = 64;

// Sets runs[i] = 1 for each holder i, growing `runs` (with zeros) to cover the largest id.
void write_first_runs(std::span<const InstanceId> holders, std::vector<int32_t>& runs) {
  for (InstanceId inst : holders) {
    if (inst >= runs.size()) runs.resize(static_cast<size_t>(inst) + 1, 0);
    runs[inst] = 1;
  }
}

}  // namespace

void BlockIndex::add(BlockKey key, InstanceId holder) {
  auto& list = *holders_.try_emplace(key, {}).first;
  if (std::find(list.begin(), list.end(), holder) != list.end()) return;
  key_changed(key);
  list.push_back(holder);
  ++replicas_;
}

void BlockIndex::remove(BlockKey key, InstanceId holder) {
  auto* list = holders_.find(key);
  if (list == nullptr) return;
  auto pos = std::find(list->begin(), list->end(), holder);
  if (pos == list->end()) return;
  key_changed(key);
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
  out.reaching.clear();
  out.best_blocks = 0;
  out.best_instance = 0;
  out.best_holders.clear();
  // An instance whose run_blocks is j after step j - 1 holds keys 0..j-1; holding key j too makes it j + 1.
  // Step j touches the holders of key j only, and the walk ends at the first key that extends nobody's run.
  const auto n = static_cast<int64_t>(keys.size());
  if (n == 0) std::fill(out.run_blocks.begin(), out.run_blocks.end(), 0);
  std::span<const InstanceId> last;  // holders of the last key that extended a run
  prefetch_match(keys);
  for (int64_t j = 0; j < n; ++j) {
    if (j + kMatchPrefetchAhead < n) prefetch(keys[j + kMatchPrefetchAhead]);
    const auto holders_j = holders(keys[j]);
    int64_t extended = 0;
    if (j == 0) {  // every holder starts a run (a key's holders are distinct)
      if (holders_j.size() < kKeepFirstRunsFromHolders) {
        std::fill(out.run_blocks.begin(), out.run_blocks.end(), 0);
        write_first_runs(holders_j, out.run_blocks);
      } else {
        if (first_runs_.empty() || first_key_ != keys[0]) {
          first_key_ = keys[0];
          first_runs_.assign(out.run_blocks.size(), 0);
          write_first_runs(holders_j, first_runs_);  // not empty: it now covers the holders' ids
        }
        if (out.run_blocks.size() < first_runs_.size()) out.run_blocks.resize(first_runs_.size());
        std::copy(first_runs_.begin(), first_runs_.end(), out.run_blocks.begin());
        std::fill(out.run_blocks.begin() + static_cast<ptrdiff_t>(first_runs_.size()), out.run_blocks.end(),
                  0);
      }
      extended = static_cast<int64_t>(holders_j.size());
    } else {
      for (InstanceId inst : holders_j) {
        // Only instances that held key 0 (all within run_blocks) can have a run to extend.
        if (inst < out.run_blocks.size() && out.run_blocks[inst] == j) {
          out.run_blocks[inst] = static_cast<int32_t>(j + 1);
          ++extended;
        }
      }
    }
    if (extended == 0) break;
    out.reaching.push_back(extended);
    last = holders_j;
  }
  out.best_blocks = static_cast<int64_t>(out.reaching.size());
  if (out.best_blocks == 0) return;
  out.best_instance = std::numeric_limits<InstanceId>::max();
  for (InstanceId inst : last) {
    if (out.blocks_of(inst) != out.best_blocks) continue;
    out.best_holders.push_back(inst);
    out.best_instance = std::min(out.best_instance, inst);
  }
}

std::vector<std::pair<InstanceId, int64_t>> PrefixMatch::matches() const {
  std::vector<std::pair<InstanceId, int64_t>> out;
  for (size_t i = 0; i < run_blocks.size(); ++i) {
    if (run_blocks[i] > 0) out.emplace_back(static_cast<InstanceId>(i), run_blocks[i]);
  }
  return out;
}

}  // namespace crescent::kv
