// Streaming statistics of a trace: arrivals, lengths, and how much of the input a prefix cache could reuse.
//
// Prefix reuse (fixed definitions, comparable across runs): a request's hit is the leading run of its block
// keys present in the cache before the request is seen; hit tokens = min(run * block_size, input_tokens); a
// hit ratio is total hit tokens / total input tokens. The ceiling uses an unbounded cache. A capacity point
// uses an LRU kv::BlockCache of max(1, floor(capacity_tokens / block_size)) blocks in which, after each
// lookup, all of the request's blocks are touched in order. Beside it, the same capacity under Belady's rule
// (optimal_hit_tokens): what an eviction policy that knew the future could reach.
//
// Where the ceiling's hits come from (fixed definitions too). A hit of `run` blocks covers blocks 0 .. run-1
// of the request; block j holds min(block_size, input_tokens - j * block_size) of its tokens, so a hit's
// tokens are the sum over its blocks.
// - Prefix roots. A request's root is its first block key (for chained keys: its first block of tokens,
//   such as a system prompt, a document or a conversation's opening), or with AnalyzerOptions::root_blocks =
//   D its D-th key (the prefix of its first D blocks; its last key when it has fewer), for traces whose
//   requests all start alike; a request without block keys has none. Per root: its requests; its reused
//   tokens (the ceiling's hit tokens of those requests) and their share of all the ceiling's hit tokens; its
//   common blocks, the longest prefix of block keys that all its requests have (at least 1 when root_blocks
//   is 1; chained keys share everything before the root too), and the reused tokens that lie within them
//   (what the prefix every request of the root starts with gives, as against what its requests share with
//   only some of the others further down); and its deepest hit, the longest ceiling hit of one of its
//   requests, in blocks. Roots are ranked by reused tokens, ties by smaller key; roots without reused tokens
//   are counted but not listed.
// - Sessions. A block key's origin is the session_id of the first request that holds it (none when that
//   request has no session_id). A hit block of a request with session S is within the session when its origin
//   is S, across sessions when its origin is another session, and unattributed when the request or the origin
//   has no session. The three add up to the ceiling's hit tokens. Origin, not the session that used the block
//   last: whose content is reused does not depend on how sessions interleave.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
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
  int top_roots = 10;       // how many prefix roots to report, most reused tokens first
  int64_t root_blocks = 1;  // a request's prefix root is its key at index min(root_blocks, keys) - 1; >= 1
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

/// A prefix root and the reuse of its requests (the definitions above).
struct PrefixRoot {
  BlockKey key = 0;                 // the first block key of its requests (their root_blocks-th)
  int64_t requests = 0;             // requests whose root is `key`
  double reused_tokens = 0;         // the ceiling's hit tokens of those requests
  double reused_share = 0;          // reused_tokens / the ceiling's hit tokens of all requests
  int64_t common_blocks = 0;        // leading blocks all its requests have (>= 1 when root_blocks is 1)
  double common_reused_tokens = 0;  // of reused_tokens, those within the common blocks
  int64_t deepest_hit_blocks = 0;   // the longest ceiling hit of one of its requests, in blocks
};

/// The ceiling's hit tokens split by the sessions of the requests and of the blocks' origins (the definitions
/// above). A share of nothing (no input tokens, no hit tokens) is std::nullopt.
struct SessionReuse {
  int64_t sessions = 0;               // distinct session ids
  int64_t requests_with_session = 0;  // requests that have a session_id
  double within_tokens = 0;           // hit tokens of blocks whose origin is the request's own session
  double across_tokens = 0;           // hit tokens of blocks whose origin is another session
  double unattributed_tokens = 0;     // hit tokens where the request or the block's origin has no session
  std::optional<double> within_input_share;         // within_tokens / input tokens
  std::optional<double> across_input_share;         // across_tokens / input tokens
  std::optional<double> within_reused_share;        // within_tokens / the ceiling's hit tokens
  std::optional<double> across_reused_share;        // across_tokens / the ceiling's hit tokens
  std::optional<double> unattributed_input_share;   // unattributed_tokens / input tokens
  std::optional<double> unattributed_reused_share;  // unattributed_tokens / the ceiling's hit tokens
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
  double reused_tokens = 0;                  // hit tokens of an unbounded cache (the ceiling's numerator)
  /// One per AnalyzerOptions::capacities_tokens, in the same order.
  std::vector<CapacityHitRatio> hit_ratio_by_capacity;
  /// Most references first, ties by smaller key.
  std::vector<HotBlock> hottest_blocks;
  int64_t distinct_roots = 0;    // prefix roots of all requests
  int64_t roots_with_reuse = 0;  // of those, roots whose requests have reused tokens
  /// The AnalyzerOptions::top_roots roots with the most reused tokens (only roots with some), ties by
  /// smaller key.
  std::vector<PrefixRoot> top_roots;
  /// std::nullopt when no request has a session_id.
  std::optional<SessionReuse> sessions;
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
/// counter and origin session per distinct block key, one entry per prefix root with its common blocks' keys
/// (16 bytes a block), one per session, the LRU caches, and with optimal_curve every request's block keys.
class TraceAnalyzer {
 public:
  /// REQUIRES: options.block_size_tokens >= 1, options.root_blocks >= 1 and every capacity >= 1.
  explicit TraceAnalyzer(AnalyzerOptions options);

  /// Accounts for the next request.
  void add(const Request& request);
  /// The statistics of the requests added so far (may be called again after more add()s).
  TraceStats finish();

 private:
  static constexpr int64_t kNoSession = -1;  // session ids are >= 0

  struct Reference {
    int64_t requests = 0;
    /// Index of the last request counted, so that a key repeated within a request counts once.
    int64_t last_request = -1;
    int64_t origin_session = kNoSession;  // the session of the first request holding the key
  };

  struct Root {
    int64_t requests = 0;
    double reused_tokens = 0;
    int64_t deepest_hit_blocks = 0;
    std::vector<BlockKey> common_keys;      // the leading keys all its requests have
    std::vector<double> common_hit_tokens;  // per common block: the ceiling's hit tokens in it
  };

  // Tokens of `request` covered by a prefix hit of `run` blocks.
  int64_t hit_tokens(const Request& request, int64_t run) const;
  // Tokens of `request` in its block `block` (0-based): block_size, fewer for the last, 0 past the input.
  int64_t block_hit_tokens(const Request& request, int64_t block) const;
  // Accounts for `request` (with block keys), whose ceiling hit is `run` blocks of `request_hit_tokens`, in
  // its prefix root.
  void add_to_root(const Request& request, int64_t run, double request_hit_tokens);

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
  std::unordered_map<BlockKey, Root> roots_;  // by root key
  std::unordered_set<int64_t> sessions_;
  int64_t requests_with_session_ = 0;
  double within_session_tokens_ = 0;
  double across_sessions_tokens_ = 0;
  double unattributed_tokens_ = 0;
};

}  // namespace crescent::trace
