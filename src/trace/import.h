// From request logs to a Mooncake-format trace (issue 23 §3; docs/traces.md, "crescent trace import"): the
// keying half. A log reader (trace/log_import.h) turns each logged request into token ids; TraceImporter keys
// their blocks, puts the requests in arrival order and writes them.
//
// Block keys: the project's one recurrence (kv/block_key.h) over each full block of token ids, then the
// trailing partial block's (kv::shipped_block_keys: ceil(n / B) keys, as a trace's hash_ids), chained from a
// seed made of a secret salt, so that nobody holding the trace can test a guessed prompt against it (the salt
// is never written). Then, by default, the keys are renumbered 0, 1, 2, ... in first-seen order, as the
// released traces are. A request whose log holds only lengths (no text) gets keys of its own: such a trace
// carries no reuse.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "trace/request.h"
#include "trace/writer.h"

namespace crescent::trace {

/// One request as a log records it, before it is keyed.
struct LoggedRequest {
  int64_t timestamp_ms = 0;                 // arrival, ms since any epoch (Unix ms for wall-clock logs)
  int64_t input_tokens = 0;                 // prompt length, >= 1; token_ids.size() when the ids are known
  std::vector<int64_t> token_ids = {};      // the prompt as the model reads it; empty for a lengths-only log
  int64_t output_tokens = 0;                // generated tokens, >= 1
  std::optional<std::string> session = {};  // the log's name of the session (conversation, user), if any
  std::string where = {};                   // "file:line" of the record, for messages
};

/// How TraceImporter keys and writes.
struct ImportOptions {
  int64_t block_size_tokens = 512;  // tokens per block key, >= 1
  std::string salt = {};            // secret seed material (any bytes; empty is allowed but not secret)
  bool dense_ids = true;     // renumber keys in first-seen order (else the salted 64-bit keys, comparable
                             // between imports that share the salt)
  bool keep_tokens = false;  // also write each request's token_ids (re-keying at other block sizes)
};

/// What an import produced.
struct ImportReport {
  int64_t requests = 0;
  int64_t lengths_only_requests = 0;  // requests without token ids (keys of their own)
  int64_t sessions = 0;               // distinct session names written
  int64_t distinct_blocks = 0;        // distinct keys written
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t first_timestamp_ms = 0;  // of the earliest request: output timestamps are relative to it
};

/// Keys logged requests and writes them to `out` in arrival order. Requests may come out of order: each is
/// held (its block keys, not its tokens unless keep_tokens) until release_before() passes its arrival.
/// Memory: the held requests, one entry per distinct key of prompts with token ids, one per distinct session
/// name; lengths-only requests' keys are not remembered.
class TraceImporter {
 public:
  /// REQUIRES: options.block_size_tokens >= 1. `out` outlives the importer.
  TraceImporter(ImportOptions options, TraceWriter& out);

  /// Takes one request. Errors (kInvalidArgument, starting with request.where): a request that arrives
  /// before one already written (it came after release_before() passed its time), input/output tokens < 1,
  /// token ids that disagree with input_tokens, more blocks than a trace line can hold (kMaxLineBytes / 2).
  Status add(LoggedRequest request);
  /// Writes every held request that arrives before `timestamp_ms`, in arrival order (ties: in the order
  /// added). Errors: the writer's.
  Status release_before(int64_t timestamp_ms);
  /// Writes every held request. Errors: the writer's.
  Status finish();
  /// The arrival before which requests were written; add() refuses earlier ones.
  std::optional<int64_t> released_until_ms() const { return released_until_ms_; }
  const ImportReport& report() const { return report_; }

 private:
  struct Held {
    int64_t timestamp_ms;
    int64_t sequence;  // order of add(): ties keep it
    Request request;
    std::optional<std::string> session;
    bool lengths_only;  // keys of its own: numbered without the map
    bool operator>(const Held& other) const {
      return timestamp_ms != other.timestamp_ms ? timestamp_ms > other.timestamp_ms
                                                : sequence > other.sequence;
    }
  };
  Status write(Held& held);
  Held pop_earliest();

  ImportOptions options_;
  TraceWriter& out_;
  BlockKey seed_;           // the salt's hash: the chain's seed
  BlockKey unique_seed_;    // seed of lengths-only requests' keys
  std::vector<Held> held_;  // a min-heap by arrival (std::greater)
  int64_t sequence_ = 0;
  std::optional<int64_t> released_until_ms_;
  std::optional<int64_t> first_timestamp_ms_;
  std::unordered_map<BlockKey, BlockKey> dense_;  // salted key -> dense id (raw keys: -> 0, to count them)
  BlockKey next_dense_id_ = 0;
  std::unordered_map<std::string, int64_t> sessions_;  // session name -> dense id
  ImportReport report_;
};

}  // namespace crescent::trace
