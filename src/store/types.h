// Vocabulary shared by the store's master, nodes and clients (paper §3.2;
// docs/store.md): keys, replica locations, how a put is replicated and pinned.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace crescent::store {

/// Keys are byte strings of 1 .. kMaxKeyBytes bytes (any bytes, NUL included).
inline constexpr size_t kMaxKeyBytes = 1024;

/// kInvalidArgument for an empty key or one longer than kMaxKeyBytes (the message gives its length).
Status validate_key(std::string_view key);

/// Where a replica's bytes are kept: a DRAM segment (read by transfer), or a node's SSD file.
enum class ReplicaTier : uint8_t { kDram, kSsd };

/// "dram" or "ssd".
std::string_view tier_name(ReplicaTier tier);

/// How eviction treats an object (docs/store.md, "Design"): kSoft keeps it unless nothing else can be freed,
/// until its TTL (MasterOptions::soft_pin_ttl) passes; kHard never lets it be evicted (remove still works).
enum class PinKind : uint8_t { kNone, kSoft, kHard };

/// "none", "soft", "hard"; parse_pin reads them back (kNotFound listing the valid names otherwise).
std::string_view pin_name(PinKind pin);
Result<PinKind> parse_pin(std::string_view name);

/// How the master picks the segments of a new object's replicas (always distinct segments):
/// kRandom: uniformly among segments with room; kMostFree: the segments with the most free bytes first;
/// kLocalFirst: the writer's preferred segment, then segments on the writer's host, then random.
enum class AllocationStrategy : uint8_t { kRandom, kMostFree, kLocalFirst };

/// "random", "most-free", "local-first"; parse_strategy reads them back (kNotFound listing the valid names
/// otherwise).
std::string_view strategy_name(AllocationStrategy strategy);
Result<AllocationStrategy> parse_strategy(std::string_view name);

/// How one put is stored.
struct ReplicateConfig {
  uint32_t replica_num = 1;            // replicas on distinct segments, >= 1
  std::string preferred_segment = "";  // segment for the first replica when it has room ("" = none)
  PinKind pin = PinKind::kNone;
};

/// Where one replica's bytes are: `size_bytes` bytes at `offset_bytes` of transfer-engine segment `segment`
/// (owned by the engine on host `host_id`).
struct ReplicaLocation {
  std::string segment;
  std::string host_id;
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;
  ReplicaTier tier = ReplicaTier::kDram;
};

}  // namespace crescent::store
