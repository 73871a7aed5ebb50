#include "trace/stats.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "common/percentile.h"

namespace crescent::trace {
namespace {

std::optional<LengthStats> length_stats(std::vector<int64_t> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  LengthStats stats;
  double total = 0;
  for (int64_t v : values) total += static_cast<double>(v);
  stats.mean = total / static_cast<double>(values.size());
  stats.p50 = nearest_rank(values, 50);
  stats.p99 = nearest_rank(values, 99);
  return stats;
}

// min(run * block_size, input_tokens), without overflow: the product exceeds the input iff
// run > input / block_size.
int64_t prefix_hit_tokens(int64_t input_tokens, int64_t block_size, int64_t run) {
  return run > input_tokens / block_size ? input_tokens : run * block_size;
}

}  // namespace

double optimal_hit_tokens(std::span<const BlockKey> keys, std::span<const size_t> offsets,
                          std::span<const int64_t> input_tokens, int64_t block_size_tokens,
                          int64_t capacity_blocks) {
  assert(offsets.size() == input_tokens.size() + 1 && capacity_blocks >= 1);
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  const auto requests = static_cast<int64_t>(input_tokens.size());
  // next_request[k]: the next request after the one holding keys[k] that holds the same key, or kNever. A
  // key repeated within a request is handled at its first place only (the loop below skips the others).
  std::vector<int64_t> next_request(keys.size(), kNever);
  {
    std::unordered_map<BlockKey, int64_t> next_holder;  // key -> the earliest request after r holding it
    for (int64_t r = requests - 1; r >= 0; --r) {
      for (size_t k = offsets[r]; k < offsets[r + 1]; ++k) {
        if (auto it = next_holder.find(keys[k]); it != next_holder.end()) next_request[k] = it->second;
      }
      for (size_t k = offsets[r]; k < offsets[r + 1]; ++k) next_holder[keys[k]] = r;
    }
  }
  // Cached blocks ordered by (next request, order stored): the last is evicted first.
  using Entry = std::tuple<int64_t, int64_t, BlockKey>;
  std::set<Entry> by_next;
  std::unordered_map<BlockKey, Entry> cached;
  int64_t stored = 0;
  double hit = 0;
  std::unordered_map<BlockKey, int64_t> in_request;  // keys of the current request already handled
  for (int64_t r = 0; r < requests; ++r) {
    int64_t run = 0;
    for (size_t k = offsets[r]; k < offsets[r + 1] && cached.count(keys[k]); ++k) ++run;
    hit += static_cast<double>(prefix_hit_tokens(input_tokens[r], block_size_tokens, run));
    in_request.clear();
    for (size_t k = offsets[r]; k < offsets[r + 1]; ++k) {
      const BlockKey key = keys[k];
      if (!in_request.emplace(key, 0).second) continue;  // repeated within the request
      const Entry entry{next_request[k], stored++, key};
      if (auto it = cached.find(key); it != cached.end()) {
        by_next.erase(it->second);
        it->second = entry;
        by_next.insert(entry);
        continue;
      }
      if (static_cast<int64_t>(cached.size()) >= capacity_blocks) {
        const Entry farthest = *by_next.rbegin();
        if (std::get<0>(farthest) <= std::get<0>(entry)) break;  // this block goes first: store no more
        by_next.erase(std::prev(by_next.end()));
        cached.erase(std::get<2>(farthest));
      }
      cached.emplace(key, entry);
      by_next.insert(entry);
    }
  }
  return hit;
}

TraceAnalyzer::TraceAnalyzer(AnalyzerOptions options) : options_(std::move(options)) {
  assert(options_.block_size_tokens >= 1 && options_.root_blocks >= 1);
  for (const std::optional<int64_t>& capacity : options_.capacities_tokens) {
    assert(!capacity || *capacity >= 1);
    caches_.emplace_back(capacity ? std::max<int64_t>(1, *capacity / options_.block_size_tokens)
                                  : kv::BlockCache::kUnbounded);
  }
  cache_hit_tokens_.assign(caches_.size(), 0);
}

int64_t TraceAnalyzer::hit_tokens(const Request& request, int64_t run) const {
  return prefix_hit_tokens(request.input_tokens, options_.block_size_tokens, run);
}

int64_t TraceAnalyzer::block_hit_tokens(const Request& request, int64_t block) const {
  return hit_tokens(request, block + 1) - hit_tokens(request, block);
}

void TraceAnalyzer::add_to_root(const Request& request, int64_t run, double request_hit_tokens) {
  const std::vector<BlockKey>& keys = request.block_keys;
  const auto depth =
      static_cast<size_t>(std::min<int64_t>(options_.root_blocks, static_cast<int64_t>(keys.size())));
  Root& root = roots_[keys[depth - 1]];
  if (root.requests == 0) {
    root.common_keys = keys;
    root.common_hit_tokens.assign(keys.size(), 0);
  } else {
    // The common prefix can only shrink: to where this request's keys leave it.
    const size_t common = static_cast<size_t>(
        std::mismatch(root.common_keys.begin(), root.common_keys.end(), keys.begin(), keys.end()).first -
        root.common_keys.begin());
    root.common_keys.resize(common);
    root.common_hit_tokens.resize(common);
  }
  ++root.requests;
  root.reused_tokens += request_hit_tokens;
  root.deepest_hit_blocks = std::max(root.deepest_hit_blocks, run);
  const int64_t common_hit = std::min(run, static_cast<int64_t>(root.common_hit_tokens.size()));
  for (int64_t j = 0; j < common_hit; ++j) {
    root.common_hit_tokens[static_cast<size_t>(j)] += static_cast<double>(block_hit_tokens(request, j));
  }
}

void TraceAnalyzer::add(const Request& request) {
  const auto index = static_cast<int64_t>(input_tokens_.size());
  if (index == 0) earliest_timestamp_ms_ = latest_timestamp_ms_ = request.timestamp_ms;
  earliest_timestamp_ms_ = std::min(earliest_timestamp_ms_, request.timestamp_ms);
  latest_timestamp_ms_ = std::max(latest_timestamp_ms_, request.timestamp_ms);
  input_tokens_.push_back(request.input_tokens);
  output_tokens_.push_back(request.output_tokens);
  input_tokens_total_ += static_cast<double>(request.input_tokens);

  const std::vector<BlockKey>& keys = request.block_keys;
  const int64_t session = request.session_id.value_or(kNoSession);
  if (request.session_id) {
    ++requests_with_session_;
    sessions_.insert(*request.session_id);
  }
  // The ceiling's hit, block by block: each hit block's tokens go to the session split by its origin.
  size_t ceiling_run = 0;
  for (; ceiling_run < keys.size(); ++ceiling_run) {
    const auto it = references_.find(keys[ceiling_run]);
    if (it == references_.end()) break;
    const auto block_tokens =
        static_cast<double>(block_hit_tokens(request, static_cast<int64_t>(ceiling_run)));
    const int64_t origin = it->second.origin_session;
    if (session == kNoSession || origin == kNoSession) {
      unattributed_tokens_ += block_tokens;
    } else if (origin == session) {
      within_session_tokens_ += block_tokens;
    } else {
      across_sessions_tokens_ += block_tokens;
    }
  }
  const auto run = static_cast<int64_t>(ceiling_run);
  const auto request_hit_tokens = static_cast<double>(hit_tokens(request, run));
  ceiling_hit_tokens_ += request_hit_tokens;
  for (BlockKey key : keys) {
    auto [it, inserted] = references_.try_emplace(key);
    Reference& reference = it->second;
    if (inserted) reference.origin_session = session;
    if (reference.last_request == index) continue;
    reference.last_request = index;
    ++reference.requests;
  }
  if (!keys.empty()) add_to_root(request, run, request_hit_tokens);

  for (size_t i = 0; i < caches_.size(); ++i) {
    cache_hit_tokens_[i] += static_cast<double>(hit_tokens(request, caches_[i].prefix_match_blocks(keys)));
    caches_[i].touch(keys, /*pin=*/false);
  }
  if (options_.optimal_curve) {
    all_keys_.insert(all_keys_.end(), keys.begin(), keys.end());
    key_offsets_.push_back(all_keys_.size());
  }
}

TraceStats TraceAnalyzer::finish() {
  TraceStats stats;
  stats.requests = static_cast<int64_t>(input_tokens_.size());
  stats.span_s = static_cast<double>(latest_timestamp_ms_ - earliest_timestamp_ms_) / 1000.0;
  if (stats.span_s > 0) stats.arrival_rate_per_s = static_cast<double>(stats.requests) / stats.span_s;
  stats.input_tokens = length_stats(input_tokens_);
  stats.output_tokens = length_stats(output_tokens_);

  auto ratio = [&](double tokens) {
    return input_tokens_total_ > 0 ? std::optional<double>(tokens / input_tokens_total_) : std::nullopt;
  };
  stats.reuse_ceiling = ratio(ceiling_hit_tokens_);
  for (size_t i = 0; i < caches_.size(); ++i) {
    CapacityHitRatio point{options_.capacities_tokens[i], ratio(cache_hit_tokens_[i]), std::nullopt};
    if (options_.optimal_curve) {
      const std::optional<int64_t>& capacity = options_.capacities_tokens[i];
      point.optimal_hit_ratio =
          capacity ? ratio(optimal_hit_tokens(all_keys_, key_offsets_, input_tokens_, options_.block_size_tokens,
                                              std::max<int64_t>(1, *capacity / options_.block_size_tokens)))
                   : stats.reuse_ceiling;  // unbounded: nothing is ever evicted
    }
    stats.hit_ratio_by_capacity.push_back(point);
  }

  for (const auto& [key, reference] : references_) {
    stats.hottest_blocks.push_back({key, reference.requests, 0});
  }
  auto hotter = [](const HotBlock& a, const HotBlock& b) {
    return a.references != b.references ? a.references > b.references : a.key < b.key;
  };
  const size_t top =
      std::min(stats.hottest_blocks.size(), static_cast<size_t>(std::max(0, options_.hottest_blocks)));
  std::partial_sort(stats.hottest_blocks.begin(), stats.hottest_blocks.begin() + static_cast<ptrdiff_t>(top),
                    stats.hottest_blocks.end(), hotter);
  stats.hottest_blocks.resize(top);
  for (HotBlock& block : stats.hottest_blocks) {
    block.request_share = static_cast<double>(block.references) / static_cast<double>(stats.requests);
  }

  stats.reused_tokens = ceiling_hit_tokens_;
  stats.distinct_roots = static_cast<int64_t>(roots_.size());
  std::vector<std::pair<BlockKey, const Root*>> reused;  // the roots with reused tokens
  for (const auto& [key, root] : roots_) {
    if (root.reused_tokens > 0) reused.emplace_back(key, &root);
  }
  stats.roots_with_reuse = static_cast<int64_t>(reused.size());
  auto more_reused = [](const auto& a, const auto& b) {
    return a.second->reused_tokens != b.second->reused_tokens
               ? a.second->reused_tokens > b.second->reused_tokens
               : a.first < b.first;
  };
  const size_t top_roots = std::min(reused.size(), static_cast<size_t>(std::max(0, options_.top_roots)));
  std::partial_sort(reused.begin(), reused.begin() + static_cast<ptrdiff_t>(top_roots), reused.end(),
                    more_reused);
  for (size_t i = 0; i < top_roots; ++i) {
    const Root& root = *reused[i].second;
    double common_reused_tokens = 0;
    for (double tokens : root.common_hit_tokens) common_reused_tokens += tokens;
    stats.top_roots.push_back({.key = reused[i].first,
                               .requests = root.requests,
                               .reused_tokens = root.reused_tokens,
                               .reused_share = root.reused_tokens / ceiling_hit_tokens_,
                               .common_blocks = static_cast<int64_t>(root.common_keys.size()),
                               .common_reused_tokens = common_reused_tokens,
                               .deepest_hit_blocks = root.deepest_hit_blocks});
  }

  if (requests_with_session_ > 0) {
    auto reused_ratio = [&](double tokens) {
      return ceiling_hit_tokens_ > 0 ? std::optional<double>(tokens / ceiling_hit_tokens_) : std::nullopt;
    };
    stats.sessions = SessionReuse{.sessions = static_cast<int64_t>(sessions_.size()),
                                  .requests_with_session = requests_with_session_,
                                  .within_tokens = within_session_tokens_,
                                  .across_tokens = across_sessions_tokens_,
                                  .unattributed_tokens = unattributed_tokens_,
                                  .within_input_share = ratio(within_session_tokens_),
                                  .across_input_share = ratio(across_sessions_tokens_),
                                  .within_reused_share = reused_ratio(within_session_tokens_),
                                  .across_reused_share = reused_ratio(across_sessions_tokens_),
                                  .unattributed_input_share = ratio(unattributed_tokens_),
                                  .unattributed_reused_share = reused_ratio(unattributed_tokens_)};
  }
  return stats;
}

}  // namespace crescent::trace
