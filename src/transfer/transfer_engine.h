// The transfer engine: batched reads and writes of registered memory between nodes (paper §3.2.2 Listing 1,
// §3.2.3). One engine per node; it registers local memory, exposes parts of it as named segments, and moves
// bytes to and from peers' segments over TCP, shared memory or UCX, chosen per peer.
//
//   auto engine = TransferEngine::create({.name = "prefill-0", .metadata = meta}).value();
//   void* kv = engine->allocate_memory(64 << 20).value();           // registered, shareable
//   engine->expose_segment("prefill-0/kv", kv, 64 << 20);
//   SegmentHandle peer = engine->open_segment("decode-3/kv").value();
//   BatchId batch = engine->allocate_batch(2).value();
//   engine->submit(batch, {{.op = TransferOp::kWrite, .local_address = kv, .segment = peer,
//                           .offset_bytes = 0, .length_bytes = 1 << 20}});
//   engine->wait(batch, std::chrono::seconds(5));                    // or poll status(batch, i)
//   engine->free_batch(batch);
//
// Thread-safety: every method may be called from any thread; requests of one batch may be submitted from
// one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/secret.h"
#include "common/status.h"
#include "transfer/metadata.h"

namespace crescent::transfer {

/// The data paths an engine can use. A peer is reached on the first kind in the initiator's preference
/// order that the target segment's owner also serves and that can reach it (shm: same host only).
enum class TransportKind { kTcp, kShm, kUcx };

/// "tcp", "shm", "ucx".
std::string_view transport_name(TransportKind kind);
/// Parses transport_name's output; kInvalidArgument naming the value otherwise.
Result<TransportKind> parse_transport(std::string_view name);

/// TCP transport settings (§3.2.3: requests are sliced and the slices spread over several paths).
struct TcpOptions {
  std::string listen_host = "127.0.0.1";  // address peers connect to
  uint16_t listen_port = 0;               // 0: an ephemeral port
  int lanes_per_peer = 2;                 // persistent connections per peer, used in parallel
  uint64_t slice_bytes = 512 << 10;       // requests are cut into slices of at most this many bytes
};

/// UCX transport settings.
struct UcxOptions {
  /// UCX transports to use (UCX_TLS syntax, e.g. "tcp" or "posix,sysv,cma,self"); empty: UCX's default
  /// (every transport the machine has, RDMA included). Set per engine (ucp_config_modify), not via the
  /// environment, so engines of one process may differ.
  std::string tls;
};

/// Failure handling. request_timeout applies to every transport; connect_timeout to tcp; retry_budget and
/// path_cooldown to tcp (per lane) and ucx (per peer); max_endpoints to the initiator side of tcp and ucx.
struct FailureOptions {
  std::chrono::milliseconds request_timeout{10000};  // a request not finished by then fails (peer down, hung)
  std::chrono::milliseconds connect_timeout{2000};   // per connection attempt
  int retry_budget = 8;  // re-sends of one slice (tcp) or operation (ucx) after its path failed
  std::chrono::milliseconds path_cooldown{1000};  // a failed lane/peer is not used again for this long
  /// Peers with open connections. Beyond it the least recently used idle peer is closed (it reconnects on
  /// next use); while every peer is busy the cap is exceeded rather than a transfer stalled. Accepted
  /// (server-side) connections are not capped.
  int max_endpoints = 256;
};

/// This machine's identity as segment descriptors carry it (SegmentDescriptor::host_id): hostname + kernel
/// boot id, equal for every process of one machine and boot, different across machines.
std::string local_host_id();

/// Settings of one engine.
struct EngineOptions {
  std::string name = "";  // unique in the cluster (claimed in the metadata service)
  std::shared_ptr<MetadataService> metadata = nullptr;  // required
  /// Transports this engine serves its segments on and uses, in order of preference.
  std::vector<TransportKind> transports = {TransportKind::kShm, TransportKind::kTcp};
  TcpOptions tcp = {};
  UcxOptions ucx = {};
  FailureOptions failure = {};
  /// The members' secret. Set: the tcp transport serves only peers that prove they hold it, and sends and
  /// reads bytes only to and from peers that do (common/member_handshake.h); shm segments are files only
  /// this user may open either way. Unset: tcp serves everyone, which only tests and benchmarks inside one
  /// process should do. (ucx has no handshake: docs/store.md, "Who may use the pool".)
  std::optional<ClusterSecret> secret = std::nullopt;
};

/// Direction of a transfer request, seen from the initiator.
enum class TransferOp {
  kRead,   // remote segment -> local memory
  kWrite,  // local memory -> remote segment
};

/// Handle of a segment opened by open_segment; valid until the engine is destroyed.
using SegmentHandle = uint32_t;

/// Handle of a batch from allocate_batch; valid until free_batch.
using BatchId = uint64_t;

/// One transfer (paper Listing 1's TransferRequest): `length_bytes` bytes between `local_address` (inside
/// memory registered with this engine) and bytes [offset_bytes, offset_bytes + length_bytes) of `segment`.
struct TransferRequest {
  TransferOp op = TransferOp::kRead;
  void* local_address = nullptr;
  SegmentHandle segment = 0;
  uint64_t offset_bytes = 0;
  uint64_t length_bytes = 0;
};

/// Progress of one submitted request.
enum class TransferState { kPending, kCompleted, kFailed };

/// State of one request; `error` says why when kFailed (e.g. "peer decode-3 unreachable: connect: ...").
struct TransferStatus {
  TransferState state = TransferState::kPending;
  std::string error;
};

/// Counts over the requests submitted to one batch.
struct BatchSummary {
  size_t submitted = 0;
  size_t completed = 0;
  size_t failed = 0;
  size_t pending() const { return submitted - completed - failed; }
};

/// Counters of one engine since its creation (monotonic).
struct EngineStats {
  uint64_t requests_completed = 0;
  uint64_t requests_failed = 0;
  uint64_t bytes_transferred = 0;        // payload bytes of completed slices, both directions
  uint64_t slices_retried = 0;           // slices re-sent after a lane failed
  uint64_t remote_accesses_refused = 0;  // accesses by peers to this engine refused (unknown segment, bounds)
  uint64_t peers_refused = 0;            // tcp connections closed unserved: the peer proved no membership
  uint64_t endpoints_evicted = 0;        // idle peer connections closed to respect max_endpoints
};

class TransferEngine {
 public:
  /// Starts an engine: claims `options.name` in the metadata service and starts each transport (TCP
  /// listens). kInvalidArgument for an empty name, no metadata, no transports or bad option values;
  /// kAlreadyExists when the name is claimed by a live engine; kUnavailable when a transport cannot start.
  static Result<std::unique_ptr<TransferEngine>> create(EngineOptions options);

  /// Fails every pending request ("engine shutting down"), withdraws its segments, releases its name,
  /// and frees memory from allocate_memory.
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  const std::string& name() const;

  /// Registers [address, address + length_bytes) for transfers. kInvalidArgument for null or zero length
  /// or an overflowing range; kAlreadyExists when it overlaps a registered region.
  Status register_memory(void* address, size_t length_bytes);
  /// Unregisters the region starting at `address`. kNotFound when none starts there; kInvalidArgument for
  /// memory from allocate_memory (use free_memory); kFailedPrecondition while a segment exposes part of it
  /// (including one being withdrawn) or requests using it are pending.
  Status unregister_memory(void* address);

  /// Allocates `length_bytes` (zeroed, page-aligned, pre-faulted) of memory peers on this host can map,
  /// registered with this engine. Segments in it are served over shm as well. Freed by free_memory or the
  /// destructor. kInvalidArgument for 0; kIoError when the OS refuses.
  Result<void*> allocate_memory(size_t length_bytes);
  /// Unregisters and frees memory from allocate_memory (same preconditions as unregister_memory).
  Status free_memory(void* address);

  /// Publishes [address, address + length_bytes), inside one registered region, as segment `name`. Blocks on
  /// the metadata service (not holding the engine's lock: transfers go on meanwhile). kInvalidArgument for
  /// zero length, a range not inside one registered region, or memory none of the engine's transports can
  /// serve (shm alone: only memory from allocate_memory); kAlreadyExists for a name taken here or by another
  /// engine; the metadata service's error otherwise (kUnavailable: etcd unreachable).
  Status expose_segment(std::string_view name, void* address, size_t length_bytes);
  /// Withdraws segment `name` from the metadata service and stops serving it; returns once no peer access to
  /// it is in progress (tcp), so its memory may then be freed. Peers that opened it before keep their handle:
  /// over tcp their requests are refused from now on; over shm and ucx (software RMA, no RDMA NIC to check
  /// rkeys) they still reach the memory, so they must drop handles of withdrawn segments (docs/transfer.md).
  /// kNotFound for a name this engine does not expose.
  Status withdraw_segment(std::string_view name);

  /// Looks `name` up in the metadata service and picks the transport to it. Blocks on the metadata
  /// service (not on the peer). Opening a segment again returns the same handle unless it was re-exposed
  /// since. kNotFound for an unknown segment; kUnavailable when no common transport can reach it.
  Result<SegmentHandle> open_segment(std::string_view name);
  /// The transport open_segment picked for `segment` (kNotFound for an unknown handle).
  Result<TransportKind> segment_transport(SegmentHandle segment) const;

  /// Allocates a batch with room for `capacity` requests (1 .. 1<<20); kInvalidArgument otherwise.
  Result<BatchId> allocate_batch(size_t capacity);
  /// Submits requests to `batch`; never blocks on the network. Each request is checked first, and the call
  /// submits none of them if one is bad: kInvalidArgument naming the request index and what is wrong
  /// (local range not registered, unknown segment handle, zero length, offset + length beyond the segment
  /// or overflowing); kOutOfRange when the batch has no room left; kNotFound for an unknown (or freed)
  /// batch. Submitted requests get indexes in submission order, from 0.
  Status submit(BatchId batch, std::span<const TransferRequest> requests);
  /// State of request `index` of `batch`. kNotFound for an unknown batch; kOutOfRange for an index that was
  /// not submitted.
  Result<TransferStatus> status(BatchId batch, size_t index) const;
  /// Blocks until every submitted request of `batch` is completed or failed, or `timeout` passes; returns
  /// the counts either way (pending() > 0 after a timeout). kNotFound for an unknown batch.
  Result<BatchSummary> wait(BatchId batch, std::chrono::milliseconds timeout);
  /// Frees a batch. kFailedPrecondition while requests are pending (wait first); kNotFound when unknown.
  Status free_batch(BatchId batch);

  EngineStats stats() const;

  /// For fault tests: abruptly closes TCP lane `lane` (0-based) towards the owner of `segment`, as a
  /// network failure would; its unfinished slices are retried on other lanes. kNotFound when that lane
  /// is not connected.
  Status break_tcp_lane_for_testing(SegmentHandle segment, int lane);

  class Impl;

 private:
  explicit TransferEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::transfer
