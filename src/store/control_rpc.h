// The store's control RPC: request/reply frames carrying serialized messages (store.proto) over TCP between
// the master and its clients and nodes. Value bytes never travel here; they move through the transfer engine.
//
// Why not gRPC (docs/store.md, "Control protocol"): on this project's 2-core machine gRPC 1.51 spent ~58 µs
// of CPU per unary call (client + server, measured with `crescent bench store`), capping metadata operations
// at ~35,000/s against issue 9's goal of 50,000/s; these frames cost a read and a write on each side.
//
// Wire format, integers little-endian:
//   request (16 bytes): u32 magic "CRSM" | u16 version 1 | u16 method | u32 call id | u32 body bytes  + body
//   reply   (16 bytes): u32 magic        | u16 version 1 | u16 code   | u32 call id | u32 body bytes  + body
// `code` is a crescent::StatusCode: 0 with the reply message as body, otherwise the error text as body. One
// call at a time per connection; the reply repeats the request's call id. A frame that is not ours (magic,
// version, body over kMaxControlBodyBytes) closes the connection; an unknown method or a body its handler
// cannot parse gets an error reply and the connection stays usable.
//
// Members only: with a member key (derived from the cluster secret), each connection starts with the
// handshake of common/member_handshake.h before any frame; a peer that fails it is closed unserved (server)
// or refused with kPermissionDenied (client).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/member_handshake.h"
#include "common/secret.h"
#include "common/status.h"

namespace crescent::store {

/// The key members prove on the store's control connections, derived from the cluster secret; nullopt
/// without one (no handshake).
std::optional<net::MemberKey> store_member_key(const std::optional<ClusterSecret>& secret);

/// Largest request or reply body (a node's re-mount lists every object it holds).
inline constexpr uint32_t kMaxControlBodyBytes = 1u << 30;

/// Answers one request: its method id and body → the reply body, or an error sent as its code and message.
/// Called on the connection's thread; must be thread-safe.
using ControlHandler = std::function<Result<std::string>(uint16_t method, std::string_view body)>;

/// Serves control RPCs: a listener thread and one thread per connection (as the transfer engine's tcp
/// target does: connections are few and long-lived, one per client thread in flight at most).
class ControlServer {
 public:
  /// Listens on "host:port" (port 0: a free one). kInvalidArgument for a malformed address; kUnavailable when
  /// it cannot be bound. `members`: serve only clients that prove they hold this key (nullopt: everyone).
  /// `stall`: how long a started frame (or the handshake) may take to arrive, and a reply to be sent.
  static Result<std::unique_ptr<ControlServer>> start(
      std::string_view listen_address, ControlHandler handler,
      std::optional<net::MemberKey> members = std::nullopt,
      std::chrono::milliseconds stall = std::chrono::seconds(10));
  /// Stops accepting, closes every connection (a call in its handler finishes first) and joins the threads.
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  /// The port bound.
  int port() const;
  /// Connections closed unserved because their client did not prove membership, so far.
  uint64_t clients_refused() const;

  class Impl;

 private:
  explicit ControlServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Calls one ControlServer at "host:port" over a pool of connections: a call takes an idle connection (one
/// the server closed is noticed and dropped) or opens one, and gives it back after a complete reply.
/// Thread-safe.
class ControlChannel {
 public:
  /// No I/O here: the address is resolved and connected on the first call. `max_idle_connections` >= 1.
  /// `member`: prove membership with this key on every new connection, and call only a server that proves
  /// it too (nullopt: no handshake, for a server without one).
  ControlChannel(std::string address, int max_idle_connections,
                 std::optional<net::MemberKey> member = std::nullopt);
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  const std::string& address() const;

  /// Sends `request` as `method` and returns the reply body by `deadline`. Errors: kUnavailable when the
  /// server cannot be reached (connect refused or timed out) or the connection fails before the reply,
  /// kPermissionDenied when the server is not a member (or does not take this channel for one),
  /// kDeadlineExceeded when the request was sent and no complete reply came in time, kInternal for a reply
  /// that is not ours, and any error the server answered (with its message). `may_have_run` (optional) is set
  /// when the whole request reached the connection and no reply came back: the server may have carried it
  /// out, so only a call that is safe to repeat should be retried.
  Result<std::string> call(uint16_t method, std::string_view request,
                           std::chrono::steady_clock::time_point deadline, bool* may_have_run = nullptr);

 private:
  class Pool;
  std::unique_ptr<Pool> pool_;
};

}  // namespace crescent::store
