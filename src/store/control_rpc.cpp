#include "store/control_rpc.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/socket_io.h"

namespace crescent::store {
namespace {

using net::Clock;
using net::Io;

constexpr uint32_t kMagic = 0x4d535243;  // bytes "CRSM" on the wire
constexpr uint16_t kVersion = 1;
constexpr size_t kHeaderBytes = 16;
// A body is received in pieces of at most this much, so a header claiming a huge body costs memory only as
// its bytes actually arrive.
constexpr size_t kBodyChunkBytes = 1 << 20;
// A caller alone on its channel polls the socket this long for its reply before it sleeps in poll(): on
// this project's 2-core VM waking a sleeping thread is a large part of a metadata call's round trip. Not
// with other calls in flight, where polling would take CPU from the threads doing work; nor on the server,
// for the same reason (docs/benchmarks.md, "Metadata calls from one thread").
constexpr auto kPollBeforeSleeping = std::chrono::microseconds(25);

/// Returns once `fd` has bytes to read (or is closed or failed), or `budget` has passed.
void poll_briefly(int fd, std::chrono::microseconds budget) {
  const auto until = Clock::now() + budget;
  do {
    char byte = 0;
    const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
  } while (Clock::now() < until);
}

/// A request or reply header; `kind` is the method of a request and the status code of a reply.
struct Header {
  uint16_t kind = 0;
  uint32_t call_id = 0;
  uint32_t body_bytes = 0;

  void encode(std::byte* out) const {
    net::put_le<uint32_t>(out, kMagic);
    net::put_le<uint16_t>(out + 4, kVersion);
    net::put_le<uint16_t>(out + 6, kind);
    net::put_le<uint32_t>(out + 8, call_id);
    net::put_le<uint32_t>(out + 12, body_bytes);
  }
  /// False when the frame is not ours: the stream cannot be trusted.
  bool decode(const std::byte* in) {
    if (net::get_le<uint32_t>(in) != kMagic || net::get_le<uint16_t>(in + 4) != kVersion) return false;
    kind = net::get_le<uint16_t>(in + 6);
    call_id = net::get_le<uint32_t>(in + 8);
    body_bytes = net::get_le<uint32_t>(in + 12);
    return body_bytes <= kMaxControlBodyBytes;
  }
};

/// Receives a body of `bytes` into `out`, growing it as the bytes arrive.
Io recv_body(int fd, uint32_t bytes, std::string& out, Clock::time_point deadline, int stop_fd) {
  out.clear();
  while (out.size() < bytes) {
    const size_t have = out.size();
    const size_t next = std::min<size_t>(bytes - have, kBodyChunkBytes);
    out.resize(have + next);
    if (Io io = net::recv_all(fd, out.data() + have, next, deadline, stop_fd); !io.ok()) return io;
  }
  return {};
}

/// Sends a header and its body in one sendmsg.
Io send_frame(int fd, const Header& header, std::string_view body, Clock::time_point deadline, int stop_fd) {
  std::byte bytes[kHeaderBytes];
  header.encode(bytes);
  iovec iov[2] = {{.iov_base = bytes, .iov_len = sizeof(bytes)},
                  {.iov_base = const_cast<char*>(body.data()), .iov_len = body.size()}};
  return net::send_all(fd, iov, body.empty() ? 1 : 2, deadline, stop_fd);
}

}  // namespace

std::optional<net::MemberKey> store_member_key(const std::optional<ClusterSecret>& secret) {
  if (!secret) return std::nullopt;
  return secret->derive("store-control");
}

// ---- Server ---------------------------------------------------------------------------------------------

class ControlServer::Impl {
 public:
  ControlHandler handler;
  std::optional<net::MemberKey> members;
  std::chrono::milliseconds stall{0};
  std::atomic<uint64_t> refused{0};
  int listen_fd = -1;
  int stop_fd = -1;
  int port = 0;
  net::ConnectionServer server;  // a thread per connection

  ~Impl() {
    if (stop_fd >= 0) {
      const uint64_t one = 1;
      (void)!::write(stop_fd, &one, sizeof(one));  // wakes every poll of every thread, for good
    }
    server.join();
    if (listen_fd >= 0) ::close(listen_fd);
    if (stop_fd >= 0) ::close(stop_fd);
  }

  void serve(int fd) {
    if (members) {
      const Status member =
          net::member_handshake(fd, net::HandshakeSide::kServer, *members, Clock::now() + stall, stop_fd);
      if (!member.ok()) {
        refused.fetch_add(1, std::memory_order_relaxed);
        return;  // closed unserved
      }
    }
    std::byte header_bytes[kHeaderBytes];
    std::string body;
    for (;;) {
      // An idle connection waits for its next request without a deadline; a started frame must complete.
      if (!net::recv_frame_start(fd, header_bytes, sizeof(header_bytes), stall, stop_fd).ok()) break;
      Header request;
      if (!request.decode(header_bytes)) break;  // not our protocol
      const auto deadline = Clock::now() + stall;
      if (!recv_body(fd, request.body_bytes, body, deadline, stop_fd).ok()) break;
      Result<std::string> answer = handler(request.kind, body);
      Header reply{.kind = 0, .call_id = request.call_id, .body_bytes = 0};
      const Status error = answer.status();  // a copy: the reply body may point into it
      std::string_view reply_body;
      if (answer.ok()) {
        reply_body = *answer;
      } else {
        reply.kind = static_cast<uint16_t>(error.code());
        reply_body = error.message();
      }
      if (reply_body.size() > kMaxControlBodyBytes) {
        reply.kind = static_cast<uint16_t>(StatusCode::kInternal);
        reply_body = "reply larger than the control protocol's 1 GiB frame limit";
      }
      reply.body_bytes = static_cast<uint32_t>(reply_body.size());
      if (!send_frame(fd, reply, reply_body, Clock::now() + stall, stop_fd).ok()) break;
      if (body.capacity() > kBodyChunkBytes) std::string().swap(body);  // a large one-off (a re-mount's list)
    }
  }
};

Result<std::unique_ptr<ControlServer>> ControlServer::start(std::string_view listen_address,
                                                            ControlHandler handler,
                                                            std::optional<net::MemberKey> members,
                                                            std::chrono::milliseconds stall) {
  auto host_port = net::split_host_port(listen_address);
  if (!host_port.ok()) return host_port.status();
  auto impl = std::make_unique<Impl>();
  impl->handler = std::move(handler);
  impl->members = members;
  impl->stall = stall;
  impl->stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->stop_fd < 0) return Status::unavailable(fmt::format("eventfd: {}", std::strerror(errno)));
  Result<net::Listener> listener = net::listen_tcp(host_port->first, host_port->second);
  if (!listener.ok()) return listener.status();
  impl->listen_fd = listener->fd;
  impl->port = listener->port;
  Impl* raw = impl.get();
  impl->server.start(impl->listen_fd, impl->stop_fd, [raw](int fd) { raw->serve(fd); });
  return std::unique_ptr<ControlServer>(new ControlServer(std::move(impl)));
}

ControlServer::ControlServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ControlServer::~ControlServer() = default;
int ControlServer::port() const {
  return impl_->port;
}
uint64_t ControlServer::clients_refused() const {
  return impl_->refused.load(std::memory_order_relaxed);
}

// ---- Client ---------------------------------------------------------------------------------------------

class ControlChannel::Pool {
 public:
  Pool(std::string address, int max_idle, std::optional<net::MemberKey> member)
      : address_(std::move(address)), max_idle_(max_idle), member_(member) {}
  ~Pool() {
    for (int fd : idle_) ::close(fd);
  }

  const std::string& address() const { return address_; }

  /// An idle connection the server has not closed, or a new one.
  Result<int> take(Clock::time_point deadline) {
    {
      std::lock_guard lock(mu_);
      while (!idle_.empty()) {
        const int fd = idle_.back();
        idle_.pop_back();
        char byte = 0;
        const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return fd;  // open and quiet: usable
        ::close(fd);  // closed by the server (restart, failover) or out of step
      }
    }
    std::optional<net::SocketAddress> resolved;
    {
      std::lock_guard lock(mu_);
      resolved = resolved_;
    }
    if (!resolved) {
      auto host_port = net::split_host_port(address_);
      if (!host_port.ok()) return host_port.status();
      Result<net::SocketAddress> found = net::resolve_tcp(host_port->first, host_port->second);
      if (!found.ok()) return found.status();
      resolved = *found;
      std::lock_guard lock(mu_);
      resolved_ = resolved;
    }
    net::Connected connected = net::connect_tcp(*resolved, deadline, -1, net::set_nodelay);
    if (connected.fd >= 0) {
      if (!member_) return connected.fd;
      const Status member =
          net::member_handshake(connected.fd, net::HandshakeSide::kClient, *member_, deadline, -1);
      if (member.ok()) return connected.fd;
      ::close(connected.fd);
      // Nothing of the call was sent: it has not run.
      if (member.code() == StatusCode::kPermissionDenied)
        return Status::permission_denied(fmt::format(
            "{} (the store's members share the cluster secret: --cluster-secret-file)", member.message()));
      return member;
    }
    std::lock_guard lock(mu_);
    resolved_.reset();  // resolved again next time: the name may point elsewhere now
    // Nothing was sent: unavailable (worth retrying), also when the connect timed out.
    return Status::unavailable(connected.error);
  }

  /// Keeps `fd` for the next call, or closes it when enough are idle.
  void give_back(int fd) {
    {
      std::lock_guard lock(mu_);
      if (idle_.size() < static_cast<size_t>(max_idle_)) {
        idle_.push_back(fd);
        return;
      }
    }
    ::close(fd);
  }

  uint32_t next_call_id() { return call_ids_.fetch_add(1, std::memory_order_relaxed); }

  /// Counts a call in flight for as long as the returned guard lives; `now` includes it.
  struct InFlight {
    std::atomic<int>* count;
    int now;
    ~InFlight() { count->fetch_sub(1, std::memory_order_relaxed); }
  };
  InFlight enter() { return InFlight{&in_flight_, in_flight_.fetch_add(1, std::memory_order_relaxed) + 1}; }

 private:
  const std::string address_;
  const int max_idle_;
  const std::optional<net::MemberKey> member_;
  std::mutex mu_;
  std::vector<int> idle_;                       // guarded by mu_
  std::optional<net::SocketAddress> resolved_;  // guarded by mu_
  std::atomic<uint32_t> call_ids_{1};
  std::atomic<int> in_flight_{0};
};

ControlChannel::ControlChannel(std::string address, int max_idle_connections,
                               std::optional<net::MemberKey> member)
    : pool_(std::make_unique<Pool>(std::move(address), std::max(1, max_idle_connections), member)) {}
ControlChannel::~ControlChannel() = default;
const std::string& ControlChannel::address() const {
  return pool_->address();
}

Result<std::string> ControlChannel::call(uint16_t method, std::string_view request,
                                         std::chrono::steady_clock::time_point deadline, bool* may_have_run) {
  if (may_have_run != nullptr) *may_have_run = false;
  if (request.size() > kMaxControlBodyBytes) {
    return Status::invalid_argument(
        fmt::format("request of {} bytes exceeds the control protocol's 1 GiB frame limit", request.size()));
  }
  const Pool::InFlight in_flight = pool_->enter();
  Result<int> taken = pool_->take(deadline);
  if (!taken.ok()) return taken.status();
  const int fd = *taken;
  const std::chrono::milliseconds no_stall{0};  // describe() only names a stall for kTimeout
  auto fail = [&](const Io& io, std::string_view during) -> Status {
    ::close(fd);
    if (io.code == Io::kTimeout) return Status::deadline_exceeded(fmt::format("no reply by the deadline"));
    return Status::unavailable(net::describe(io, during, no_stall));
  };
  const Header header{
      .kind = method, .call_id = pool_->next_call_id(), .body_bytes = static_cast<uint32_t>(request.size())};
  // A frame that did not arrive whole is never carried out: the server waits for all of it.
  if (Io io = send_frame(fd, header, request, deadline, -1); !io.ok()) return fail(io, "sending the request");
  if (may_have_run != nullptr) *may_have_run = true;
  if (in_flight.now == 1) poll_briefly(fd, kPollBeforeSleeping);
  std::byte reply_bytes[kHeaderBytes];
  if (Io io = net::recv_all(fd, reply_bytes, sizeof(reply_bytes), deadline, -1); !io.ok()) {
    return fail(io, "waiting for the reply");
  }
  Header reply;
  if (!reply.decode(reply_bytes) || reply.call_id != header.call_id) {
    ::close(fd);
    return Status::internal("the reply is not a control-protocol frame for this call");
  }
  std::string body;
  if (Io io = recv_body(fd, reply.body_bytes, body, deadline, -1); !io.ok()) {
    return fail(io, "receiving the reply");
  }
  pool_->give_back(fd);
  if (may_have_run != nullptr) *may_have_run = false;  // it answered
  if (reply.kind == 0) return body;
  if (reply.kind > static_cast<uint16_t>(StatusCode::kCancelled)) {
    return Status::internal(fmt::format("unknown status code {} in a reply: {}", reply.kind, body));
  }
  return Status(static_cast<StatusCode>(reply.kind), std::move(body));
}

}  // namespace crescent::store
