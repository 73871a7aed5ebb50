// Streaming statistics of a trace: arrivals, lengths, and how much of the input a prefix cache could reuse.
//
// Prefix reuse (fixed definitions, comparable across runs): a request's hit is the leading run of its block
// keys present in the cache before the request is seen; hit tokens = min(run * block_size, input_tokens); a
// hit ratio is total hit tokens / total input tokens. The ceiling uses an unbounded cache. A capacity point
// uses an LRU kv::BlockCache of max(1, floor(capacity_tokens / block_size)) blocks in which, after each
// lookup, all of the request's blocks are touched in order. Beside it, the same capacity under Belady's rule
// (optimal_hit_tokens): what an eviction policy that knew the future could reach.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
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
  /// Also the optimal (Belady) curve: keeps every request's block keys until finish() (8 bytes a key).
  bool optimal_curve = true;
};

/// Mean and nearest-rank percentiles of a length in tokens.
struct LengthStats {
  double mean = 0;
  int64_t p50 = 0;
  int64_t p99 = 0;
};

/// Prefix hit ratio of an LRU cache of one capacity, and of the optimal one.
struct CapacityHitRatio {
  std::optional<int64_t> capacity_tokens;  // std::nullopt: unbounded
  std::optional<double> hit_ratio;         // hit tokens / input tokens, in [0, 1]; none without input tokens
  /// The same capacity evicting by Belady's rule (optimal_hit_tokens); none without input tokens or when
  /// AnalyzerOptions::optimal_curve is off.
  std::optional<double> optimal_hit_ratio;
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

/// Prefix hit tokens (the definitions above) of a cache of `capacity_blocks` (>= 1) blocks that evicts by
/// Belady's rule, the offline optimum of classic caching (Belady 1966, "MIN"): after each lookup the
/// request's distinct blocks are stored first to last; when the cache is full, the block whose next request
/// is farthest away (never: farthest of all) goes, ties to the block stored last; when that block would be
/// the one being stored, it and the rest of the request are not stored (a block past a missing one can never
/// be a prefix hit). For chained keys (kv/block_key.h) a block's next request is never before its
/// predecessor's, so a chain loses its tail first, as the LRU curve's does. No online policy can know the
/// next requests, so this is what a better eviction policy could still win over LRU at that capacity.
/// Request i is keys[offsets[i], offsets[i + 1]) with input_tokens[i]; offsets has one more entry than
/// input_tokens. Time O(keys x log capacity); memory O(keys).
double optimal_hit_tokens(std::span<const BlockKey> keys, std::span<const size_t> offsets,
                          std::span<const int64_t> input_tokens, int64_t block_size_tokens,
                          int64_t capacity_blocks);

/// Accumulates TraceStats one request at a time, in arrival order. Memory: one length per request, one
/// counter per distinct block key, the LRU caches, and with optimal_curve every request's block keys.
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
  std::vector<BlockKey> all_keys_;      // with optimal_curve: every request's keys, request after request
  std::vector<size_t> key_offsets_{0};  // request i's keys start at key_offsets_[i]
  std::vector<double> cache_hit_tokens_;
  /// Every key seen so far: also the unbounded cache behind the ceiling.
  std::unordered_map<BlockKey, Reference> references_;
};

}  // namespace crescent::trace
