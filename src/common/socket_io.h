// Blocking TCP socket I/O with deadlines, shared by the transfer engine's tcp transport and the store's
// control RPC: every wait is a poll() bounded by a deadline and woken by a stop eventfd, so a hung peer is
// noticed at the deadline and a shutting-down server never waits on the network. Sockets are non-blocking;
// these calls loop over partial sends and receives.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "common/status.h"

namespace crescent::net {

using Clock = std::chrono::steady_clock;
/// A deadline that never passes.
inline constexpr Clock::time_point kNoDeadline = Clock::time_point::max();

/// Writes `value` little-endian into out[0, sizeof(T)).
template <typename T>
void put_le(std::byte* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out[i] = static_cast<std::byte>(static_cast<uint64_t>(value) >> (8 * i));
}

/// Reads a little-endian T from in[0, sizeof(T)).
template <typename T>
T get_le(const std::byte* in) {
  uint64_t value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return static_cast<T>(value);
}

/// How a blocking socket operation ended.
struct Io {
  enum Code { kOk, kClosed, kError, kTimeout, kStopped };
  Code code = kOk;
  int error = 0;  // errno for kError
  bool ok() const { return code == kOk; }
};

/// Waits until `fd` is ready for `events` (or has an error: the next syscall reports it), `deadline` passes
/// (kTimeout), or `stop_fd` (an eventfd, -1 for none) becomes readable (kStopped).
Io wait_fd(int fd, short events, Clock::time_point deadline, int stop_fd);
/// Drops the first `sent` bytes of iov[0, count): whole entries are skipped (`iov` and `count` move past
/// them), a partly sent one is trimmed in place. REQUIRES: `sent` <= the entries' total length.
void advance_iov(iovec*& iov, int& count, size_t sent);
/// Sends every byte of `iov` (modified in place), MSG_NOSIGNAL.
Io send_all(int fd, iovec* iov, int iov_count, Clock::time_point deadline, int stop_fd);
/// Sends data[0, length).
Io send_bytes(int fd, const void* data, size_t length, Clock::time_point deadline, int stop_fd);
/// Receives exactly `length` bytes into `data`; kClosed when the peer closes first.
Io recv_all(int fd, void* data, size_t length, Clock::time_point deadline, int stop_fd);
/// Receives the `length` bytes of a frame's start on a server connection: waits for the first byte without a
/// deadline (the connection may idle between requests), for the rest at most `stall`.
Io recv_frame_start(int fd, std::byte* data, size_t length, std::chrono::milliseconds stall, int stop_fd);
/// What went wrong, for error messages: "connection closed by the peer during <during>", "<during>: <errno
/// text>", "no progress during <during> before the request deadline (<stall> ms timeout)".
std::string describe(const Io& io, std::string_view during, std::chrono::milliseconds stall);

/// Sets TCP_NODELAY: a small frame must not wait for Nagle's algorithm.
void set_nodelay(int fd);

/// A TCP port free on every local address now, or 0 when none could be had. It is drawn at random from
/// 20000 up to the kernel's ephemeral range, so a port-0 listener or an outgoing connection cannot take it
/// before the caller's process binds it (another process picking ports by hand still could: it is
/// released, not held). Falls back to a kernel-chosen port when that range is too small.
uint16_t free_tcp_port();

/// "host:port", or "[host]:port" for an IPv6 literal.
std::string endpoint_key(const std::string& host, int port);

/// Splits "host:port" or "[v6]:port"; kInvalidArgument naming `address` when there is no port or it is not
/// in 0..65535.
Result<std::pair<std::string, int>> split_host_port(std::string_view address);

/// A resolved socket address.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
};
/// Resolves host:port (numeric port) for connecting; kUnavailable with the resolver's message.
Result<SocketAddress> resolve_tcp(const std::string& host, int port);

/// Whether `host` names every local address ("", "0.0.0.0", "::", "*"): bindable, but no address a peer can
/// reach.
bool is_wildcard_host(std::string_view host);

/// This machine's address (numeric) on the interface its packets to host:port leave by: the address a peer
/// there reaches it on (127.0.0.1 when the peer is on this machine's loopback). Sends nothing (a UDP
/// socket's connect only picks the route). kUnavailable when host does not resolve or no route leads there.
Result<std::string> local_address_toward(const std::string& host, int port);

/// The address of a URL's host and port ("http://HOST:PORT/...", "tcp://HOST:PORT", or "HOST:PORT"), port
/// 80 for an http URL without one. kInvalidArgument naming `url` when it has no host.
Result<std::pair<std::string, int>> url_host_port(std::string_view url);

/// A ZeroMQ endpoint to bind: "tcp://host:0" becomes "tcp://host:*" (ZeroMQ's any-port form); others as
/// given.
std::string zmq_bindable(const std::string& endpoint);

/// A listening socket (non-blocking, close-on-exec, SO_REUSEADDR) and the port it bound.
struct Listener {
  int fd = -1;
  int port = 0;
};
/// Binds and listens on host:port (empty host: every address; port 0: a free port). `configure` runs on the
/// socket before bind (accepted sockets inherit its options). kUnavailable naming the endpoint on failure.
Result<Listener> listen_tcp(const std::string& host, int port,
                            const std::function<void(int)>& configure = {});

/// The outcome of connect_tcp: fd >= 0 on success; otherwise `io` says how it ended (kTimeout, kStopped,
/// kError) and `error` says why ("connect: Connection refused").
struct Connected {
  int fd = -1;
  Io io;
  std::string error;
};
/// Opens a non-blocking, close-on-exec TCP connection to `address` by `deadline`. `configure` runs on the
/// socket before connect (window scaling is negotiated in the handshake).
Connected connect_tcp(const SocketAddress& address, Clock::time_point deadline, int stop_fd,
                      const std::function<void(int)>& configure = {});

/// Accepts connections on a listening socket and serves each on a thread of its own (servers with few,
/// long-lived connections: the transfer engine's tcp target, the store's control RPC). Accepted sockets are
/// non-blocking, close-on-exec, TCP_NODELAY. Beyond kMaxConnections open at once, or when a thread cannot be
/// started, a new connection is closed at once (its peer sees the connection end).
class ConnectionServer {
 public:
  /// Serves one connection until it ends or `stop_fd` fires; the server closes `fd` afterwards.
  using Serve = std::function<void(int fd)>;
  static constexpr size_t kMaxConnections = 4096;

  ConnectionServer() = default;
  /// join() if still running.
  ~ConnectionServer();
  ConnectionServer(const ConnectionServer&) = delete;
  ConnectionServer& operator=(const ConnectionServer&) = delete;

  /// Starts the accepting thread on `listen_fd` (not owned). `stop_fd` (an eventfd, not owned) stops it when
  /// readable; `serve` must return when it does too.
  void start(int listen_fd, int stop_fd, Serve serve);
  /// Waits for the accepting thread and every connection's thread. Call after making stop_fd readable.
  void join();

 private:
  struct Connection {
    int fd = -1;
    std::thread thread;
    bool finished = false;  // guarded by mu_
  };
  void accept_loop();

  int listen_fd_ = -1;
  int stop_fd_ = -1;
  Serve serve_;
  std::thread acceptor_;
  std::mutex mu_;
  std::list<Connection> connections_;  // guarded by mu_
};

}  // namespace crescent::net
