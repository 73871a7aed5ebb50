// The store's client library (paper §3.2; docs/store.md), what prefill and decode
// instances link: put, get, exists, remove and their batch forms. Metadata goes through the master (one RPC
// per call, whatever the number of keys); value bytes move between this process's memory and the segments
// holding the replicas through the transfer engine (one transfer batch per call), never through the master.
//
//   auto client = Client::create({}).value();            // finds the master at default_master_address()
//   client->put("doc-17/block-0", {{data, size}});
//   Result<uint64_t> n = client->get("doc-17/block-0", {{out, out_size}});
//
// Zero copy: buffers inside memory given to register_buffer (or from allocate_buffer) are read and written
// in place; other buffers are copied through a registered staging pool the client owns.
//
// Reads and leases: get_replica_list grants a lease of L ms; the client counts it from when it sent the
// request, and once the bytes have arrived it checks the lease again: a read that ends after the lease ran
// out fails with kLeaseExpired (the space may already hold another object) and its bytes are not valid.
// Every read path (get, batch_get, get_prefix; local or remote replica) makes that check.
//
// Errors (Status codes): kNotFound, kAlreadyExists, kLeaseExpired, kNoSpace, kInvalidArgument, kUnavailable
// (master unreachable after MasterClientOptions::max_attempts, with back-off), kDeadlineExceeded,
// kTransferFailed (every replica's transfer failed). Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kv/block_key.h"
#include "store/master_client.h"
#include "store/types.h"
#include "transfer/transfer_engine.h"

namespace crescent::store {

/// Bytes a value is read into.
struct Buffer {
  void* data = nullptr;
  uint64_t size_bytes = 0;
};

/// Bytes a value is written from.
struct ConstBuffer {
  const void* data = nullptr;
  uint64_t size_bytes = 0;
};

/// Settings of a client.
struct ClientOptions {
  MasterClientOptions master = {};
  std::string name = "";  // transfer-engine name, unique in the cluster; "" = store-client-HOST-PID-N
  std::vector<transfer::TransportKind> transports = {transfer::TransportKind::kShm,
                                                     transfer::TransportKind::kTcp};
  /// Address segment owners connect back to (tcp serves both ways); empty: this machine's address on the
  /// interface that reaches the master.
  std::string tcp_host;
  uint64_t staging_bytes = 64ull << 20;  // registered pool for unregistered buffers
  uint64_t segment_bytes = 0;            // > 0: also mount a DRAM segment of this size from this client
  std::chrono::milliseconds transfer_timeout{10000};  // per transfer batch
  /// How long a get waits for an object being loaded from an SSD tier, and a put for room being made by
  /// spills to SSD (the master answers kUnavailable for such keys meanwhile).
  std::chrono::milliseconds ssd_wait{5000};
  std::string block_key_prefix = "kv/";  // put_blocks/get_prefix keys: PREFIX + 16 hex digits
  /// Tests only: called for each key after its bytes arrived and before its lease is checked.
  std::function<void(std::string_view key)> before_lease_check_for_testing = nullptr;
};

/// Counters since the client was created.
struct ClientStats {
  uint64_t puts = 0;
  uint64_t gets = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  uint64_t staged_bytes = 0;       // bytes copied through the staging pool
  uint64_t replica_fallbacks = 0;  // reads retried on another replica after a transfer failed
  uint64_t leases_expired = 0;     // reads refused because their lease ran out
  /// Replicas a put could not write (their segment's owner was gone, or the path to it failed): the put
  /// ended without them, or started again elsewhere.
  uint64_t replicas_unwritten = 0;
};

class Client {
 public:
  /// Connects to the master, opens the transfer metadata it names, starts a transfer engine and allocates the
  /// staging pool (and mounts a segment when segment_bytes > 0). Errors from each step, naming it.
  static Result<std::unique_ptr<Client>> create(ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Registers caller memory for zero-copy puts and gets (it must stay valid until unregister_buffer).
  /// The transfer engine's errors (kAlreadyExists for an overlap).
  Status register_buffer(void* data, uint64_t size_bytes);
  Status unregister_buffer(void* data);

  /// Stores the concatenation of `value` under `key`: put_start, one transfer batch writing every replica,
  /// then put_end. A replica whose write fails (its segment's owner died) is dropped and its segment
  /// reported, so the master places nothing more there until the owner renews it: the put ends with the
  /// replicas written, and when none was it is started again on other segments (3 attempts in all).
  /// kInvalidArgument for an empty value or bad key; the master's errors (kAlreadyExists, kNoSpace, ...);
  /// kTransferFailed (no replica could be written in 3 attempts).
  Status put(std::string_view key, std::span<const ConstBuffer> value, const ReplicateConfig& config = {});
  /// Reads `key` into `out` (filled in order); returns the value's size. kInvalidArgument when `out` holds
  /// fewer bytes than the value (nothing read); kNotFound; kLeaseExpired; kTransferFailed.
  Result<uint64_t> get(std::string_view key, std::span<const Buffer> out);
  /// Reads `key` into a buffer of its size (the same read as get, lease check included).
  Result<std::vector<std::byte>> get_value(std::string_view key);
  /// Whether a complete object is stored under `key`.
  Result<bool> exists(std::string_view key);
  /// kNotFound; kFailedPrecondition while a reader holds a lease.
  Status remove(std::string_view key);
  /// Removes every object without a live lease; returns how many.
  Result<uint64_t> remove_all();

  /// N keys, one value buffer each: one put_start RPC, one transfer batch, one put_end (and one put_revoke)
  /// RPC, and again only for keys none of whose replicas could be written (as put). One Status per key; the
  /// call fails as a whole only when the master cannot be reached.
  Result<std::vector<Status>> batch_put(std::span<const std::string_view> keys,
                                        std::span<const ConstBuffer> values,
                                        const ReplicateConfig& config = {});
  /// N keys into N buffers: one get_replica_list RPC, one transfer batch (more only to retry failed
  /// replicas).
  Result<std::vector<Result<uint64_t>>> batch_get(std::span<const std::string_view> keys,
                                                  std::span<const Buffer> out);
  Result<std::vector<bool>> batch_exists(std::span<const std::string_view> keys);

  /// The key of a KV cache block: block_key_prefix + 16 lower-case hex digits.
  std::string block_key(BlockKey key) const;
  /// Stores KV cache blocks (the prefill instance's write), one buffer per block. Blocks already stored count
  /// as success (another instance computed the same prefix).
  Result<std::vector<Status>> put_blocks(std::span<const BlockKey> keys, std::span<const ConstBuffer> blocks,
                                         const ReplicateConfig& config = {});
  /// Reads the longest stored prefix of `keys` (chained prefix hashes) into `blocks`; returns how many
  /// leading blocks were read. Blocks after the first missing one are not read; the stored ones before it are
  /// read in one batch, and one that fails (transfer, lease) ends the count there (later buffers may then
  /// hold bytes all the same).
  Result<size_t> get_prefix(std::span<const BlockKey> keys, std::span<const Buffer> blocks);

  ClientStats stats() const;
  /// The connection to the master (for stats and the like).
  MasterClient& master();
  transfer::TransferEngine& engine();

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::store
