// One request of a Mooncake-format trace.
#pragma once

#include <cstdint>
#include <vector>

#include "common/block_key.h"

namespace crescent::trace {

/// One line of a Mooncake JSONL trace, validated (see trace/reader.h for the rules).
struct Request {
  int64_t timestamp_ms = 0;   // arrival (`timestamp`), ms: since the trace start, or any epoch (Unix ms)
  int64_t input_tokens = 0;   // prompt length (`input_length`)
  int64_t output_tokens = 0;  // generated tokens, including the first one (`output_length`)
  /// One key per block of the prompt (`hash_ids`): ceil(input_tokens / block_size) entries.
  std::vector<BlockKey> block_keys;
  int64_t line = 0;  // 1-based line of the trace file it was read from (0 when not read from a file)
};

}  // namespace crescent::trace
