// Internal to the transfer library: what the engine core hands a transport, and what a transport gives back.
// The core validates requests, keeps batches and segment tables; a transport only moves bytes of requests
// already known to be inside registered memory and inside the target segment's published length.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "transfer/metadata.h"
#include "transfer/transfer_engine.h"

namespace crescent::transfer::internal {

using Clock = std::chrono::steady_clock;

/// Engine-wide counters, updated by the core and the transports.
struct Counters {
  std::atomic<uint64_t> requests_completed{0};
  std::atomic<uint64_t> requests_failed{0};
  std::atomic<uint64_t> bytes_transferred{0};
  std::atomic<uint64_t> slices_retried{0};
  std::atomic<uint64_t> remote_accesses_refused{0};
  std::atomic<uint64_t> endpoints_evicted{0};
  std::atomic<uint64_t> peers_refused{0};
};

class Batch;

/// Completion state of one submitted request. A transport cuts the request into `parts` pieces (slices), says
/// how many with expect_parts before starting any, and reports each with part_done; the request completes
/// when every part succeeded, fails with the first failure's reason once every part has reported.
class RequestState {
 public:
  /// Set by the core before the request reaches a transport.
  void reset(Batch* batch, std::atomic<int64_t>* region_in_flight, Counters* counters);
  /// REQUIRES: called once, before the first part_done; parts >= 1.
  void expect_parts(uint32_t parts) { parts_left_.store(parts, std::memory_order_relaxed); }
  /// One part finished, moving `bytes` payload bytes (counted only when ok). Thread-safe.
  void part_done(const Status& status, uint64_t bytes);
  TransferStatus status() const;

 private:
  std::atomic<int> state_{static_cast<int>(TransferState::kPending)};
  std::atomic<uint32_t> parts_left_{1};
  std::atomic<bool> failed_{false};
  mutable std::mutex error_mu_;
  std::string error_;
  Batch* batch_ = nullptr;
  std::atomic<int64_t>* region_in_flight_ = nullptr;
  Counters* counters_ = nullptr;
};

/// A request as a transport sees it: checked, with its deadline.
struct TransportRequest {
  TransferOp op = TransferOp::kRead;
  std::byte* local = nullptr;  // inside registered memory
  uint64_t offset_bytes = 0;   // inside the target segment: offset + length <= its length
  uint64_t length_bytes = 0;   // > 0
  Clock::time_point deadline;  // fail the request (kDeadlineExceeded) if not finished by then
  RequestState* state = nullptr;
};

/// A segment this engine exposes, as the transports serving it see it.
struct LocalSegment {
  uint64_t id = 0;  // unique in this engine, never reused; peers name the segment by it on the wire
  std::string name;
  std::byte* base = nullptr;
  uint64_t length_bytes = 0;
  int memfd = -1;                   // memory from allocate_memory: its memfd (shareable), else -1
  uint64_t memfd_offset_bytes = 0;  // offset of `base` in that memfd
};

/// The segments this engine serves, shared with the transports' servers, which check every remote access
/// against it. Accesses hold a shared lock for their duration, so a segment withdrawn (and its memory
/// freed) is never touched afterwards.
class SegmentTable {
 public:
  /// Checked accesses to the segments under one shared lock: the segments it hands out stay alive (and
  /// remove() waits) while it is held, so a server may check many requests of a pipelined window at once.
  class View {
   public:
    /// Bytes [offset, offset + length) of segment `id`, or kNotFound / kOutOfRange / kInvalidArgument with
    /// a message a peer can be sent (unknown segment id, zero length, range beyond the segment).
    Result<std::byte*> range(uint64_t id, uint64_t offset_bytes, uint64_t length_bytes) const;
    /// Lets remove() proceed; the pointers handed out must not be used afterwards.
    void release() { lock_ = {}; }
    bool held() const { return lock_.owns_lock(); }

   private:
    friend class SegmentTable;
    std::shared_lock<std::shared_mutex> lock_;
    const SegmentTable* table_ = nullptr;
  };

  void add(const LocalSegment& segment);
  /// Removes `id`; waits for every View held to be released.
  void remove(uint64_t id);
  /// Takes the shared lock (waiting while a remove() is in progress).
  View view() const;

 private:
  mutable std::shared_mutex mu_;
  std::unordered_map<uint64_t, LocalSegment> segments_;
};

/// What a transport is given at construction.
struct TransportContext {
  std::string engine_name;
  std::string host_id;
  const EngineOptions* options = nullptr;  // outlives the transport
  SegmentTable* segments = nullptr;        // outlives the transport
  Counters* counters = nullptr;            // outlives the transport
};

/// A path to one remote segment over one transport.
class RemoteSegment {
 public:
  virtual ~RemoteSegment() = default;
  /// Starts moving `request`; never blocks on the network. Reports through request.state.
  virtual void submit(const TransportRequest& request) = 0;
  /// See TransferEngine::break_tcp_lane_for_testing.
  virtual Status break_lane_for_testing(int lane) {
    (void)lane;
    return Status::not_found("this transport has no lanes");
  }
};

/// One data path kind (tcp, shm, ucx).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual TransportKind kind() const = 0;
  /// Starts serving `segment` to peers and sets `entry` (its descriptor's transports[kind]) to what they
  /// need to reach it; leaves `entry` null when this transport cannot serve it (shm: not shareable memory).
  virtual Status expose(const LocalSegment& segment, nlohmann::json& entry) = 0;
  /// Stops serving `segment` (called before its memory may be freed).
  virtual void withdraw(const LocalSegment& segment) = 0;
  /// A path to the remote segment of `descriptor` (whose transports[kind] is present); kUnavailable when
  /// this transport cannot reach it (shm on another host). May block on local set-up, not on the peer.
  virtual Result<std::shared_ptr<RemoteSegment>> open(const SegmentDescriptor& descriptor) = 0;
  /// Stops threads and fails every request still pending ("engine shutting down"). Called once, before
  /// destruction.
  virtual void shutdown() = 0;
};

/// Factories, one per transport (tcp_transport.cpp, shm_transport.cpp, ucx_transport.cpp).
Result<std::unique_ptr<Transport>> make_tcp_transport(const TransportContext& context);
Result<std::unique_ptr<Transport>> make_shm_transport(const TransportContext& context);
Result<std::unique_ptr<Transport>> make_ucx_transport(const TransportContext& context);

}  // namespace crescent::transfer::internal
