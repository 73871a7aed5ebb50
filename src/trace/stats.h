// Streaming statistics of a trace: arrivals, lengths, and how much of the input a prefix cache could reuse.
//
// Prefix reuse (fixed definitions, comparable across runs): a request's hit is the leading run of its block
// keys present in the cache before the request is seen; hit tokens = min(run * block_size, input_tokens); a
// hit ratio is total hit tokens / total input tokens. The ceiling uses an unbounded cache. A capacity point
// uses an LRU kv::BlockCache of max(1, floor(capacity_tokens / block_size)) blocks in which, after each
// lookup, all of the request's blocks are touched in order.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kv/block_cache.h"
#include "kv/block_key.h"
#include "trace/request.h"

namespace crescent::trace {

/// What TraceAnalyzer computes.
struct AnalyzerOptions {
  int64_t block_size_tokens = 512;  // tokens per block key; must be >= 1
  /// LRU cache capacities in tokens (each >= 1), std::nullopt for unbounded; reported in this order.
  std::vector<std::optional<int64_t>> capacities_tokens = {1'000'000, 3'000'000, 10'000'000, 50'000'000,
                                                           std::nullopt};
  int hottest_blocks = 10;  // how many of the most referenced blocks to report
};

/// Mean and nearest-rank percentiles of a length in tokens.
struct LengthStats {
  double mean = 0;
  int64_t p50 = 0;
  int64_t p99 = 0;
};

/// Prefix hit ratio of an LRU cache of one capacity.
struct CapacityHitRatio {
  std::optional<int64_t> capacity_tokens;  // std::nullopt: unbounded
  std::optional<double> hit_ratio;         // hit tokens / input tokens, in [0, 1]; none without input tokens
};

/// A block key and how many requests contain it.
struct HotBlock {
  BlockKey key = 0;
  int64_t references = 0;    // requests whose block_keys contain the key
  double request_share = 0;  // references / requests
};

/// Statistics of the requests added to a TraceAnalyzer. A statistic over nothing (lengths of no requests, a
/// rate over a zero span, a ratio of no input tokens) is std::nullopt, never 0.
struct TraceStats {
  int64_t requests = 0;
  double span_s = 0;                         // latest minus earliest arrival (0 for < 2 requests)
  std::optional<double> arrival_rate_per_s;  // requests / span_s; none when span_s is 0
  std::optional<LengthStats> input_tokens;   // none without requests
  std::optional<LengthStats> output_tokens;  // none without requests
  std::optional<double> reuse_ceiling;       // hit ratio of an unbounded cache
  /// One per AnalyzerOptions::capacities_tokens, in the same order.
  std::vector<CapacityHitRatio> hit_ratio_by_capacity;
  /// Most references first, ties by smaller key.
  std::vector<HotBlock> hottest_blocks;
};

/// Accumulates TraceStats one request at a time, in arrival order. Memory: one length per request, one
/// counter per distinct block key, and the LRU caches.
class TraceAnalyzer {
 public:
  /// REQUIRES: options.block_size_tokens >= 1 and every capacity >= 1.
  explicit TraceAnalyzer(AnalyzerOptions options);

  /// Accounts for the next request.
  void add(const Request& request);
  /// The statistics of the requests added so far (may be called again after more add()s).
  TraceStats finish();

 private:
  struct Reference {
    int64_t requests = 0;
    /// Index of the last request counted, so that a key repeated within a request counts once.
    int64_t last_request = -1;
  };

  // Tokens of `request` covered by a prefix hit of `run` blocks.
  int64_t hit_tokens(const Request& request, int64_t run) const;

  AnalyzerOptions options_;
  std::vector<int64_t> input_tokens_;
  std::vector<int64_t> output_tokens_;
  int64_t earliest_timestamp_ms_ = 0;
  int64_t latest_timestamp_ms_ = 0;
  double input_tokens_total_ = 0;  // double: exact for any real trace, cannot overflow
  double ceiling_hit_tokens_ = 0;
  std::vector<kv::BlockCache> caches_;  // one per capacity
  std::vector<double> cache_hit_tokens_;
  /// Every key seen so far: also the unbounded cache behind the ceiling.
  std::unordered_map<BlockKey, Reference> references_;
};

}  // namespace crescent::trace
