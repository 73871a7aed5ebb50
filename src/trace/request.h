// One request of a Mooncake-format trace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kv/block_key.h"

namespace crescent::trace {

/// One line of a Mooncake JSONL trace, validated (see trace/reader.h for the rules).
struct Request {
  int64_t timestamp_ms = 0;   // arrival (`timestamp`), ms: since the trace start, or any epoch (Unix ms)
  int64_t input_tokens = 0;   // prompt length (`input_length`)
  int64_t output_tokens = 0;  // generated tokens, including the first one (`output_length`)
  /// One key per block of the prompt (`hash_ids`): ceil(input_tokens / block_size) entries.
  std::vector<BlockKey> block_keys;
  /// The session (conversation, user) the request belongs to (`session_id`, optional): requests of one session
  /// share it. Written by `crescent trace import`; the released Mooncake traces have none.
  std::optional<int64_t> session_id = std::nullopt;
  /// The prompt's token ids (`token_ids`, optional, input_tokens of them), kept by `trace import --keep-tokens`
  /// so the trace can be re-keyed at another block size; empty when the trace has none or they were not read.
  std::vector<int64_t> token_ids = {};
  int64_t line = 0;  // 1-based line of the trace file it was read from (0 when not read from a file)
};

/// When `trace`[i] arrives, in seconds (of virtual time in a simulation, after the start of a replay): time
/// is measured from the first request's arrival (so traces with Unix-epoch timestamps run as if shifted to
/// start at 0) and divided by `time_scale`. REQUIRES: i < trace.size().
inline double arrival_time_s(std::span<const trace::Request> trace, size_t i, double time_scale) {
  return static_cast<double>(trace[i].timestamp_ms - trace.front().timestamp_ms) / 1000.0 / time_scale;
}

}  // namespace crescent::trace
