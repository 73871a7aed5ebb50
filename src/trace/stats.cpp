#include "trace/stats.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "common/percentile.h"

namespace crescent::trace {
namespace {

std::optional<LengthStats> length_stats(std::vector<int64_t>& values) {
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

}  // namespace

TraceAnalyzer::TraceAnalyzer(AnalyzerOptions options) : options_(std::move(options)) {
  assert(options_.block_size_tokens >= 1);
  for (const std::optional<int64_t>& capacity : options_.capacities_tokens) {
    assert(!capacity || *capacity >= 1);
    caches_.emplace_back(capacity ? std::max<int64_t>(1, *capacity / options_.block_size_tokens)
                                  : kv::BlockCache::kUnbounded);
  }
  cache_hit_tokens_.assign(caches_.size(), 0);
}

int64_t TraceAnalyzer::hit_tokens(const Request& request, int64_t run) const {
  // min(run * block_size, input_tokens), without overflow: the product exceeds the input iff
  // run > input / block_size.
  const int64_t block_size = options_.block_size_tokens;
  return run > request.input_tokens / block_size ? request.input_tokens : run * block_size;
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
  size_t ceiling_run = 0;
  while (ceiling_run < keys.size() && references_.count(keys[ceiling_run])) ++ceiling_run;
  ceiling_hit_tokens_ += static_cast<double>(hit_tokens(request, static_cast<int64_t>(ceiling_run)));
  for (BlockKey key : keys) {
    Reference& reference = references_[key];
    if (reference.last_request == index) continue;
    reference.last_request = index;
    ++reference.requests;
  }

  for (size_t i = 0; i < caches_.size(); ++i) {
    cache_hit_tokens_[i] += static_cast<double>(hit_tokens(request, caches_[i].prefix_match_blocks(keys)));
    caches_[i].touch(keys, /*pin=*/false);
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
    stats.hit_ratio_by_capacity.push_back({options_.capacities_tokens[i], ratio(cache_hit_tokens_[i])});
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
  return stats;
}

}  // namespace crescent::trace
