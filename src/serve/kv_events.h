// KV cache events in vLLM's wire format (docs/serving.md), so crescent's instances and any KV-aware router
// that reads vLLM (Dynamo, llm-d) understand each other, and the Conductor's ClusterState is fed from them.
//   PUB socket:    multipart [topic, sequence number (8 bytes, big-endian), payload]
//   ROUTER socket: a DEALER sends ["", start sequence (8 bytes, big-endian)]; the publisher answers each
//                  buffered batch from there as ["", seq, payload], then ["", -1 (8 bytes), ""]
//   payload:       msgpack [timestamp (float seconds), [event, ...], data_parallel_rank or nil]
//   event:         ["BlockStored", block_hashes, parent_block_hash or nil, token_ids, block_size, lora_id or
//   nil,
//                   medium or nil] | ["BlockRemoved", block_hashes, medium or nil] | ["AllBlocksCleared"]
// ZeroMQ through Debian's cppzmq, msgpack through msgpack-cxx.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/instance_id.h"
#include "common/secret.h"
#include "common/status.h"
#include "kv/block_key.h"

namespace crescent::conductor {
class ClusterState;
}

namespace crescent::serve {

/// One KV cache event.
struct KvEvent {
  enum class Kind { kStored, kRemoved, kAllCleared };
  Kind kind = Kind::kStored;
  std::vector<BlockKey> block_hashes;         // stored / removed blocks, in prefix order
  std::optional<BlockKey> parent_block_hash;  // stored: the block before the first (nil: none)
  std::vector<int64_t> token_ids;             // stored: the blocks' tokens (may be empty)
  int64_t block_size = 0;                     // stored: tokens per block
  std::optional<std::string> medium;          // tier, e.g. "GPU", "CPU" (nil: unspecified)
};

/// Events an instance published together.
struct KvEventBatch {
  double timestamp_s = 0;  // Unix seconds
  std::vector<KvEvent> events;
  std::optional<int64_t> data_parallel_rank;
};

/// The msgpack payload of `batch`.
std::string encode_kv_event_batch(const KvEventBatch& batch);
/// Parses a payload; kInvalidArgument naming what is malformed (not msgpack, not an array of 2-3 elements, an
/// unknown event tag, a field of the wrong type). Extra trailing fields are ignored (newer vLLM versions add
/// some), and hashes sent as bytes (newer vLLM) become their first 8 bytes, big-endian.
Result<KvEventBatch> decode_kv_event_batch(std::string_view payload);

/// Applies `batch`'s events, published by prefill instance `instance`, to `state` (stored blocks readable
/// from `now_s`).
void apply_kv_events(const KvEventBatch& batch, InstanceId instance, conductor::ClusterState& state,
                     double now_s);

/// Publishes batches on a PUB socket and answers replay requests from a buffer of the last batches.
class KvEventPublisher {
 public:
  /// Binds `endpoint` and `replay_endpoint` (e.g. "tcp://127.0.0.1:5557"; port 0 or "*" picks one). With
  /// `secret`, both are members-only (members_only.h): only subscribers holding it connect. kUnavailable
  /// naming the endpoint when it cannot be bound.
  static Result<std::unique_ptr<KvEventPublisher>> start(const std::string& endpoint,
                                                         const std::string& replay_endpoint,
                                                         std::string topic = "",
                                                         size_t buffer_batches = 10'000,
                                                         const ClusterSecret* secret = nullptr);
  ~KvEventPublisher();
  /// The endpoints as bound (with their ports).
  const std::string& endpoint() const;
  const std::string& replay_endpoint() const;
  /// Sends `batch` with the next sequence number (from 0) and keeps it for replay; returns the number.
  /// Thread-safe.
  uint64_t publish(const KvEventBatch& batch);

  class Impl;

 private:
  explicit KvEventPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Receives one publisher's batches in sequence order, filling gaps from its replay socket.
class KvEventSubscriber {
 public:
  /// Connects to a publisher's endpoints (ZeroMQ connects lazily: an absent publisher is not an error; an
  /// empty `replay_endpoint`: the publisher has no replay socket, and a gap is reported at once). With
  /// `secret`, as a member of a members-only publisher (a crescent instance); without, in the clear (an
  /// engine's publisher, as vLLM binds it).
  static Result<std::unique_ptr<KvEventSubscriber>> connect(const std::string& endpoint,
                                                            const std::string& replay_endpoint,
                                                            std::string topic = "",
                                                            const ClusterSecret* secret = nullptr);
  ~KvEventSubscriber();

  /// Waits up to `timeout` for batches and hands each to `on_batch` in sequence order, from sequence 0. A
  /// batch arriving after a gap first has the gap replayed; when the publisher no longer holds the missing
  /// batches, `on_gap(first_missing, next_available)` is called (the caller must then forget this instance's
  /// blocks: they may be stale) and delivery resumes. A sequence number below the next expected one means
  /// the publisher restarted (its numbering starts over): on_gap(expected, that number) is called, with
  /// next_available below first_missing, and delivery starts again from 0 (what precedes that number is
  /// replayed). Malformed messages are counted and skipped.
  void poll(std::chrono::milliseconds timeout,
            const std::function<void(uint64_t, const KvEventBatch&)>& on_batch,
            const std::function<void(uint64_t, uint64_t)>& on_gap);
  /// Asks the replay socket at once for every batch it holds from the next expected one on, and hands them
  /// over as poll() does (a gap before the oldest it holds: on_gap). poll() alone learns of batches published
  /// before it connected only when a later one arrives; a subscriber that must know the publisher's state now
  /// (a Conductor after its start, waiting for an instance's full cache report) calls this, and again if the
  /// answer did not come. Waits up to 250 ms for the answer; nothing without a replay socket.
  void catch_up(const std::function<void(uint64_t, const KvEventBatch&)>& on_batch,
                const std::function<void(uint64_t, uint64_t)>& on_gap);
  /// Messages skipped as malformed so far.
  uint64_t malformed() const;
  /// Batches recovered through the replay socket so far (they had been missed on the PUB socket).
  uint64_t replayed() const;

  class Impl;

 private:
  explicit KvEventSubscriber(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::serve
