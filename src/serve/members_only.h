// Members-only ZeroMQ sockets (docs/serving.md, "Who may talk to what"): every control and KV-event socket
// of a cluster speaks CURVE (encrypted, authenticated) with keys derived from the cluster secret, and a ZAP
// handler admits a client only when it proves it holds the members' key. A process without the secret
// cannot connect, read what goes over the wire, or pass for an instance.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <zmq.hpp>

#include "common/secret.h"
#include "common/status.h"

namespace crescent::serve {

/// The ZAP handler of one ZeroMQ context: every CURVE server socket of the context asks it about each
/// client, and it admits those holding the members' key pair (ClusterSecret::curve_key_pair("zmq-member"));
/// others are refused (and counted). One per context that binds members-only servers; it must outlive
/// them (destroy it after closing its context's sockets).
class MembersOnly {
 public:
  /// Binds "inproc://zeromq.zap.01" in `context` (which must outlive this) and starts answering.
  static Result<std::unique_ptr<MembersOnly>> start(zmq::context_t& context, const ClusterSecret& secret);
  ~MembersOnly();
  MembersOnly(const MembersOnly&) = delete;
  MembersOnly& operator=(const MembersOnly&) = delete;

  /// Clients refused so far (a wrong key, or no CURVE at all).
  uint64_t refused() const { return refused_.load(); }

 private:
  MembersOnly(zmq::context_t& context, const ClusterSecret& secret);
  void run();

  zmq::socket_t handler_;
  std::array<uint8_t, 32> member_public_key_{};
  std::atomic<uint64_t> refused_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

/// Makes `socket` a members-only CURVE server (call before bind): its context needs a MembersOnly.
void make_member_server(zmq::socket_t& socket, const ClusterSecret& secret);
/// Makes `socket` a member's CURVE client of a members-only server (call before connect).
void make_member_client(zmq::socket_t& socket, const ClusterSecret& secret);

}  // namespace crescent::serve
