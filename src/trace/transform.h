// What-if traces derived from real ones (issue 23 §4): `crescent trace transform`, whose user's view, with
// examples, is docs/traces.md. Every transform here works on requests in arrival order and keeps the
// block-key contract (kv/block_key.h): equal keys mean equal prefixes, so the output's prefix structure is
// the input's wherever a transform does not say otherwise. Each one says what it keeps and what it cannot
// know: a derived trace is a plan's assumption written out, not a measurement.
//
// transform_trace() runs them in this fixed order:
//   1. merge the inputs   (open_merged_inputs: one stream in arrival order, key and session namespaces apart)
//   2. window             (window_source: arrivals in [start, end), rebased to start at 0)
//   3. copies             (CopyPlanner, copy_source: more users)
//   4. length scale       (scale_lengths)
//   5. rate scale         (scale_arrival_ms)
//   6. dense ids          (DenseKeys)
// So the window is in the merged input's time, and the rate scale divides the final times.
//
// Memory: steps 1, 2, 4, 5 stream (one request per open input). Copies read the input 2N times (a first pass
// that counts, then one pass per copy and part, merged) and hold one entry per distinct block key during the
// first pass (about 60 bytes each), the shared keys and each session id's first arrival after it. Dense ids
// hold one entry per distinct output key (about 40 bytes). Nothing holds the requests.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "kv/block_key.h"
#include "trace/request.h"
#include "trace/writer.h"

namespace crescent::trace {

/// A stream of requests in arrival order (timestamps never decrease).
class RequestSource {
 public:
  virtual ~RequestSource() = default;
  /// The next request into `out`: true when there was one, false at the end. After an error every later call
  /// returns an error. Errors (kInvalidArgument) name the input file, line and field.
  virtual Result<bool> next(Request& out) = 0;
};

/// Why a key is derived from another; each kind is a namespace of its own, so derivations never coincide.
enum class KeyDerivation : int64_t { kMergeInput = 1, kCopy = 2, kLengthScale = 3 };

/// The key `key` becomes under derivation `kind` with `index` (an input, a copy, a new block): one step of
/// the block-key recurrence, kv::chain_block_key(key, {kind, index}). A function of its arguments, so one key
/// always becomes the same key and two keys stay two (up to 64-bit hash collisions): equal prefixes stay
/// equal and different ones different.
BlockKey derive_key(BlockKey key, KeyDerivation kind, int64_t index);

/// How the inputs become one stream.
struct MergeOptions {
  int64_t block_size_tokens = 512;  // tokens per hash_ids entry (validation of every line); >= 1
  /// The inputs were keyed with the same salt (one tokenizer, one model seed): their keys stay as written, so
  /// a prefix in two inputs is one prefix. Off: input i > 0's keys become derive_key(key, kMergeInput, i).
  bool shared_keys = false;
  /// The inputs' timestamps share an epoch: time is measured from the earliest first arrival of all of them.
  /// Off: each input's time starts at its own first arrival (traces recorded apart are laid over each other).
  bool absolute_time = false;
  /// How many ways the session ids are renumbered apart after the merge (the copies): ids must stay below
  /// 2^63 after both renumberings, or the input line is an error. >= 1.
  int64_t later_session_spread = 1;
};

/// Opens `paths` (Mooncake traces, plain or gzip) and merges them into one stream in arrival order, ties to
/// the input listed first. Output timestamps are ms from the origin (MergeOptions::absolute_time).
/// Keeps: each input's requests, their order, gaps and lengths; each input's prefix structure (its keys map
/// one to one); sessions apart: input i's session id s becomes s x inputs + i.
/// Cannot know: whether users of one trace would reuse the other's prefixes (unless shared_keys says they are
/// keyed alike), nor how traces recorded at different times line up (without absolute_time, each starts at
/// 0). A single input passes through unchanged but for its timestamps, rebased to its first arrival.
/// Errors: an input that cannot be opened or read (kNotFound, kIoError), an invalid line or an input with no
/// request (kInvalidArgument), a session id too large to renumber.
Result<std::unique_ptr<RequestSource>> open_merged_inputs(const std::vector<std::string>& paths,
                                                          const MergeOptions& options);

/// Arrivals kept, in ms of the stream's time: [start_ms, end_ms); no end_ms: to the end of the trace.
struct TimeWindow {
  int64_t start_ms = 0;                // >= 0
  std::optional<int64_t> end_ms = {};  // > start_ms
};

/// The requests of `source` that arrive in `window`, their timestamps minus its start (the window's start is
/// time 0). Stops reading `source` at the first arrival at or past the window's end.
/// Keeps: every request inside, unchanged but for its timestamp; their order and gaps.
/// Cannot know: what a cache held when the window opens (a replay starts cold, so a session cut by the start
/// misses the history it would have hit), nor the turns of its sessions before the start or after the end.
std::unique_ptr<RequestSource> window_source(std::unique_ptr<RequestSource> source, TimeWindow window);

/// Which blocks the copies keep, i.e. still share with every other copy: blocks that at least `min_sessions`
/// sessions, or `min_percent` % of all sessions, refer to. A request without a session id is a session of its
/// own. Neither set: 2 sessions when every request has a session id, otherwise 1% of the requests and at
/// least 2 (a block shared by requests may be one conversation's history or many users' common text: without
/// session ids, only blocks that a good share of all requests use are taken to be the latter).
struct SharedThreshold {
  std::optional<int64_t> min_sessions = {};  // >= 1
  std::optional<double> min_percent = {};    // in (0, 100]
};

/// What --copies decided on a first pass over the trace (CopyPlanner).
struct CopyPlan {
  int64_t copies = 1;     // >= 1; copy 0 is the trace itself
  int64_t period_ms = 1;  // copy c starts offset_ms(c) later; what would start past the period wraps to 0
  std::unordered_set<BlockKey> shared_keys;
  /// The first arrival of each session id in the first pass's trace (ids as that trace numbers them).
  std::unordered_map<int64_t, int64_t> session_first_arrival_ms;
  // Where the plan came from, for reports.
  int64_t sessions = 0;        // distinct session ids + requests without one
  bool by_session_ids = true;  // every request had a session id
  int64_t min_sessions = 0;    // the threshold applied: a block of >= this many sessions is shared
  int64_t distinct_keys = 0;   // in the first pass's trace

  /// Copy `copy`'s delay: round(copy x period_ms / copies). REQUIRES: 0 <= copy < copies.
  int64_t offset_ms(int64_t copy) const;
  /// Whether copy `copy` of `request` (a request of the first pass's trace) moves back by one period: its
  /// session's first arrival (its own arrival without a session id) plus the offset is at or past the period.
  bool wraps(const Request& request, int64_t copy) const;
};

/// Counts, over one pass of a trace in arrival order, what a CopyPlan needs: how many sessions refer to each
/// block key (exactly: a key seen again in a session already counted is not counted again), each session's
/// first arrival, the last arrival. Memory: one entry per distinct key (about 70 bytes), per session id, and
/// per (key, session id) beyond a key's first session.
class CopyPlanner {
 public:
  /// Accounts for the next request.
  void add(const Request& request);
  /// Requests added so far.
  int64_t requests() const { return requests_; }
  /// The plan for `copies` (>= 1) copies spread over `period_ms` (none: the last arrival + 1 ms), blocks
  /// shared by `threshold`. Errors (kInvalidArgument): no request was added; a threshold out of range.
  Result<CopyPlan> finish(int64_t copies, const SharedThreshold& threshold, std::optional<int64_t> period_ms);

 private:
  // Sessions are ids, or -1 - the request's index for a request without one (a session seen once).
  struct KeySessions {
    int64_t first_session = 0;  // the first session that referred to the key
    int64_t last_session = 0;   // the last one
    int64_t sessions = 0;       // distinct sessions that did
  };
  struct PairHash {
    size_t operator()(const std::pair<BlockKey, int64_t>& p) const;
  };

  std::unordered_map<BlockKey, KeySessions> keys_;
  /// (key, session id) pairs counted beyond each key's first session: only keys that sessions with ids
  /// share have them.
  std::unordered_set<std::pair<BlockKey, int64_t>, PairHash> later_sessions_;
  std::unordered_map<int64_t, int64_t> session_first_arrival_ms_;  // sessions with ids only
  int64_t requests_ = 0;
  int64_t requests_without_session_ = 0;
  int64_t last_arrival_ms_ = 0;
};

/// Copy `copy` of `request` (of the trace the plan was made on), for more users of the same kind:
/// - keys: copy 0 keeps them; copy c > 0 keeps the leading run of shared keys and derives every key from the
///   first unshared one on (derive_key(key, kCopy, c)), since a block after a copy's own block is the copy's
///   own too (chained keys). So within a copy equal prefixes stay equal, and copies share only shared blocks;
/// - session id s becomes s x copies + c (none stays none);
/// - arrival: + offset_ms(c), minus period_ms when plan.wraps(): a session moves whole, keeping its gaps.
/// token_ids are dropped when a key changes (they would no longer give the keys).
/// Keeps: each copy's sessions, their requests, lengths, gaps and prefix structure; blocks shared by the
/// threshold's sessions (system prompts, common documents) shared by all copies.
/// Cannot know: who the new users are. Their traffic is the old users' again, shifted in time; blocks below
/// the threshold (a document two users happened to share) are not shared with the copies; the arrival
/// pattern (bursts, daily cycles) is averaged over the shifts, at copies x the rate.
Request copy_request(const Request& request, int64_t copy, const CopyPlan& plan);

/// Copy `copy` of the requests of `source` whose plan.wraps() is `wrapped` (copy_request): in arrival order,
/// as each of the two parts is. `plan` must outlive the source.
std::unique_ptr<RequestSource> copy_source(std::unique_ptr<RequestSource> source, const CopyPlan& plan,
                                           int64_t copy, bool wrapped);

/// One stream in arrival order from streams in arrival order; ties go to the stream listed first.
std::unique_ptr<RequestSource> merge_sources(std::vector<std::unique_ptr<RequestSource>> sources);

/// Factors on prompt and output lengths (> 0; 1: unchanged).
struct LengthScale {
  double input = 1;
  double output = 1;
};

/// `request` with input_tokens x scale.input and output_tokens x scale.output (rounded to nearest, at least
/// 1). New prompt blocks: new block j (its last token e = min((j + 1) x B, new input) - 1) stands for the old
/// prefix up to old token ceil((e + 1) / scale.input) - 1, i.e. up to old block i (at most the last); its key
/// is derive_key(old key i, kLengthScale, j). Two prompts sharing k old blocks share floor(k x scale.input)
/// new ones: hit tokens scale with the length, and the chain holds. token_ids are dropped when the prompt
/// changes. Nothing changes for a factor of 1.
/// Keeps: the prefix structure at block granularity, each length in proportion, arrivals.
/// Cannot know: the longer (shorter) text itself, so sharing finer than an old block (two prompts that
/// diverge inside a block) is lost at the new length, and a session's next prompt does not grow by the
/// scaled output of the turn before (its history is scaled as it was).
/// Errors (kInvalidArgument): a scaled length past 2^53 tokens or whose line would pass kMaxLineBytes.
Status scale_lengths(Request& request, const LengthScale& scale, int64_t block_size_tokens);

/// `timestamp_ms` / `rate_scale` (> 0), rounded to nearest: X times the arrival rate.
/// Keeps: the order of arrivals and every key (rounding to ms is monotone, so order and ties are kept).
/// Cannot know: whether users would really send faster; the gaps inside a session (the user's think time)
/// shrink as well, which brings a session's reuse closer in time (more of it fits in a given cache) than more
/// users at the same pace would (that is --copies).
/// Errors (kInvalidArgument): a result past 2^53 ms.
Result<int64_t> scale_arrival_ms(int64_t timestamp_ms, double rate_scale);

/// Renumbers block keys densely (0, 1, 2, ...) in the order they are first seen, as the released traces are.
/// A one-to-one map, so the prefix structure is unchanged. Memory: one entry per distinct key.
class DenseKeys {
 public:
  /// The dense id of `key`: a new one when `key` was not seen before.
  BlockKey map(BlockKey key);
  size_t size() const { return ids_.size(); }

 private:
  std::unordered_map<BlockKey, BlockKey> ids_;
};

/// The whole pipeline (the order above).
struct TransformOptions {
  MergeOptions merge;
  std::optional<TimeWindow> window;
  int64_t copies = 1;  // >= 1
  SharedThreshold shared;
  LengthScale length;
  double rate_scale = 1;  // > 0
  bool dense_ids = false;
};

/// A CopyPlan in numbers, for reports.
struct CopySummary {
  int64_t sessions = 0;        // CopyPlan::sessions
  bool by_session_ids = true;  // CopyPlan::by_session_ids
  int64_t min_sessions = 0;    // the threshold applied
  int64_t shared_keys = 0;     // keys every copy keeps
  int64_t distinct_keys = 0;   // keys of the trace copied
  int64_t period_ms = 0;       // CopyPlan::period_ms
};

/// What transform_trace() did.
struct TransformReport {
  int64_t requests_in = 0;            // after the merge and the window (one copy)
  int64_t requests_out = 0;           // written
  double span_s = 0;                  // the output's last arrival (its time starts at 0)
  std::optional<CopySummary> copies;  // with copies > 1
};

/// Runs the pipeline over `inputs` and appends the result to `out` (not committed). Errors: the inputs'
/// (open_merged_inputs), options out of range, a window with no arrival, and the steps' (kInvalidArgument).
Result<TransformReport> transform_trace(const std::vector<std::string>& inputs,
                                        const TransformOptions& options, TraceWriter& out);

}  // namespace crescent::trace
