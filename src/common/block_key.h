// The key of one KV cache block: a chained prefix hash, so equal keys mean equal prefixes (paper §3.2.1).
#pragma once

#include <cstdint>

namespace crescent {

/// A block's key. In Mooncake traces this is the `hash_ids` entry; live, a chained hash of the block's token
/// ids.
using BlockKey = std::uint64_t;

/// Index of a prefill or decode instance within its pool (0-based).
using InstanceId = std::uint32_t;

}  // namespace crescent
