#include "common/socket_io.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>
#include <system_error>

namespace crescent::net {

// Waits until `fd` is ready for `events` (or has an error: the next syscall reports it), `deadline`
// passes, or `stop_fd` becomes readable.
Io wait_fd(int fd, short events, Clock::time_point deadline, int stop_fd) {
  for (;;) {
    int timeout_ms = -1;
    if (deadline != kNoDeadline) {
      const auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero()) return {Io::kTimeout};
      // Rounded up: a 0 ms poll before the deadline would spin.
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
      timeout_ms = static_cast<int>(std::min<int64_t>(ms, INT_MAX));
    }
    pollfd fds[2] = {{.fd = fd, .events = events, .revents = 0},
                     {.fd = stop_fd, .events = POLLIN, .revents = 0}};
    const int n = ::poll(fds, stop_fd >= 0 ? 2 : 1, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      return {Io::kError, errno};
    }
    if (stop_fd >= 0 && (fds[1].revents & POLLIN) != 0) return {Io::kStopped};
    if (n > 0) return {};
  }
}

void advance_iov(iovec*& iov, int& count, size_t sent) {
  while (count > 0 && sent >= iov->iov_len) {
    sent -= iov->iov_len;
    ++iov;
    --count;
  }
  if (count > 0) {
    iov->iov_base = static_cast<std::byte*>(iov->iov_base) + sent;
    iov->iov_len -= sent;
  }
}

// Sends every byte of `iov` (modified in place).
Io send_all(int fd, iovec* iov, int iov_count, Clock::time_point deadline, int stop_fd) {
  while (iov_count > 0) {
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = static_cast<size_t>(iov_count);
    const ssize_t n = ::sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return {Io::kError, errno};
      if (Io waited = wait_fd(fd, POLLOUT, deadline, stop_fd); !waited.ok()) return waited;
      continue;
    }
    advance_iov(iov, iov_count, static_cast<size_t>(n));
  }
  return {};
}

Io send_bytes(int fd, const void* data, size_t length, Clock::time_point deadline, int stop_fd) {
  iovec iov{.iov_base = const_cast<void*>(data), .iov_len = length};
  return send_all(fd, &iov, 1, deadline, stop_fd);
}

// Receives exactly `length` bytes into `data`.
Io recv_all(int fd, void* data, size_t length, Clock::time_point deadline, int stop_fd) {
  auto* out = static_cast<std::byte*>(data);
  while (length > 0) {
    const ssize_t n = ::recv(fd, out, length, MSG_DONTWAIT);
    if (n > 0) {
      out += n;
      length -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return {Io::kClosed};
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return {Io::kError, errno};
    if (Io waited = wait_fd(fd, POLLIN, deadline, stop_fd); !waited.ok()) return waited;
  }
  return {};
}

// Receives the `length` bytes of a frame's start on a server connection: waits for the first byte without a
// deadline (the connection may idle between requests), for the rest at most `stall`.
Io recv_frame_start(int fd, std::byte* data, size_t length, std::chrono::milliseconds stall, int stop_fd) {
  for (;;) {
    const ssize_t n = ::recv(fd, data, length, MSG_DONTWAIT);
    if (n > 0) {
      const auto got = static_cast<size_t>(n);
      return got == length ? Io{} : recv_all(fd, data + got, length - got, Clock::now() + stall, stop_fd);
    }
    if (n == 0) return {Io::kClosed};
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return {Io::kError, errno};
    if (Io waited = wait_fd(fd, POLLIN, kNoDeadline, stop_fd); !waited.ok()) return waited;
  }
}

// What went wrong, for error messages ("connection closed by the peer during X").
std::string describe(const Io& io, std::string_view during, std::chrono::milliseconds stall) {
  switch (io.code) {
    case Io::kOk:
      return "ok";
    case Io::kClosed:
      return fmt::format("connection closed by the peer during {}", during);
    case Io::kError:
      return fmt::format("{}: {}", during, std::strerror(io.error));
    case Io::kTimeout:
      return fmt::format("no progress during {} before the request deadline ({} ms timeout)", during,
                         stall.count());
    case Io::kStopped:
      return "shutting down";
  }
  return "?";
}

void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

namespace {

// Whether `port` (0: any) can be bound on every local address now; the bound port, or 0.
uint16_t try_bind(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(port);
  socklen_t len = sizeof addr;
  uint16_t bound = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    bound = ntohs(addr.sin_port);
  }
  ::close(fd);
  return bound;
}

// The first port of the kernel's ephemeral range (net.ipv4.ip_local_port_range), 32768 when unreadable.
int ephemeral_range_start() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  int high = 0;
  return in >> low >> high && low > 0 ? low : 32768;
}

}  // namespace

uint16_t free_tcp_port() {
  // Below the ephemeral range, where neither an outgoing connection nor a port-0 listener can take the port
  // between this pick and the caller's bind; drawn at random so that concurrent pickers rarely meet.
  constexpr int kLowest = 20000;
  const int end = ephemeral_range_start();
  if (end - kLowest >= 1000) {
    thread_local std::mt19937 random(std::random_device{}());
    std::uniform_int_distribution<int> pick(kLowest, end - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      if (const uint16_t port = try_bind(static_cast<uint16_t>(pick(random))); port != 0) return port;
    }
  }
  return try_bind(0);
}

std::string endpoint_key(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

Result<std::pair<std::string, int>> split_host_port(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == address.size()) {
    return Status::invalid_argument(fmt::format("address '{}' is not host:port", address));
  }
  std::string host(address.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  for (char c : address.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535) {
      return Status::invalid_argument(fmt::format("address '{}': port is not a number in 0..65535", address));
    }
    port = port * 10 + (c - '0');
  }
  if (port > 65535) {
    return Status::invalid_argument(fmt::format("address '{}': port is not a number in 0..65535", address));
  }
  return std::make_pair(std::move(host), port);
}

Result<SocketAddress> resolve_tcp(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found); rc != 0) {
    return Status::unavailable(
        fmt::format("cannot resolve {}: {}", endpoint_key(host, port), ::gai_strerror(rc)));
  }
  SocketAddress address;
  std::memcpy(&address.storage, found->ai_addr, found->ai_addrlen);
  address.length = static_cast<socklen_t>(found->ai_addrlen);
  ::freeaddrinfo(found);
  return address;
}

bool is_wildcard_host(std::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "*" || host == "[::]";
}

Result<std::string> local_address_toward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found); rc != 0) {
    return Status::unavailable(
        fmt::format("cannot resolve {}: {}", endpoint_key(host, port), ::gai_strerror(rc)));
  }
  const int fd = ::socket(found->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(found);
    return Status::unavailable(fmt::format("socket: {}", std::strerror(errno)));
  }
  const int rc = ::connect(fd, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  if (rc != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status::unavailable(fmt::format("no route to {}: {}", endpoint_key(host, port), why));
  }
  ::close(fd);
  char text[INET6_ADDRSTRLEN] = {};
  const void* address = local.ss_family == AF_INET6
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
  if (::inet_ntop(local.ss_family, address, text, sizeof(text)) == nullptr) {
    return Status::unavailable(fmt::format("inet_ntop: {}", std::strerror(errno)));
  }
  return std::string(text);
}

std::string zmq_bindable(const std::string& endpoint) {
  if (endpoint.size() > 2 && endpoint.ends_with(":0")) return endpoint.substr(0, endpoint.size() - 1) + "*";
  return endpoint;
}

Result<std::pair<std::string, int>> url_host_port(std::string_view url) {
  int default_port = -1;
  if (const size_t scheme = url.find("://"); scheme != std::string_view::npos) {
    if (url.substr(0, scheme) == "http") default_port = 80;
    if (url.substr(0, scheme) == "https") default_port = 443;
    url.remove_prefix(scheme + 3);
  }
  if (const size_t slash = url.find('/'); slash != std::string_view::npos) url = url.substr(0, slash);
  auto split = split_host_port(url);
  if (split.ok() && !split->first.empty()) return split;
  if (default_port > 0 && !url.empty() && url.find(':') == std::string_view::npos) {
    return std::pair<std::string, int>(std::string(url), default_port);
  }
  return Status::invalid_argument(fmt::format("'{}' names no host and port", url));
}

Result<Listener> listen_tcp(const std::string& host, int port, const std::function<void(int)>& configure) {
  const std::string where = endpoint_key(host, port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &found);
      rc != 0) {
    return Status::unavailable(fmt::format("cannot listen on {}: {}", where, ::gai_strerror(rc)));
  }
  std::string error;
  int listen_fd = -1;
  for (addrinfo* a = found; a != nullptr && listen_fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      error = fmt::format("socket: {}", std::strerror(errno));
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (configure) configure(fd);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      error = fmt::format("bind: {}", std::strerror(errno));
      ::close(fd);
      continue;
    }
    if (::listen(fd, SOMAXCONN) != 0) {
      error = fmt::format("listen: {}", std::strerror(errno));
      ::close(fd);
      continue;
    }
    listen_fd = fd;
  }
  ::freeaddrinfo(found);
  if (listen_fd < 0) return Status::unavailable(fmt::format("cannot listen on {}: {}", where, error));
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &length);
  const int bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return Listener{listen_fd, bound_port};
}

Connected connect_tcp(const SocketAddress& address, Clock::time_point deadline, int stop_fd,
                      const std::function<void(int)>& configure) {
  Connected out;
  const auto started = Clock::now();
  int fd = ::socket(address.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    out.io = {Io::kError, errno};
    out.error = fmt::format("socket: {}", std::strerror(errno));
    return out;
  }
  if (configure) configure(fd);
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&address.storage), address.length);
  if (rc != 0 && errno == EINPROGRESS) {
    const Io waited = wait_fd(fd, POLLOUT, deadline, stop_fd);
    if (waited.code == Io::kTimeout) {
      out.io = waited;
      out.error =
          fmt::format("connect: no answer within {} ms",
                      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - started).count());
    } else if (waited.code == Io::kStopped) {
      out.io = waited;
      out.error = "shutting down";
    } else if (waited.code == Io::kError) {
      out.io = waited;
      out.error = fmt::format("connect: poll: {}", std::strerror(waited.error));
    } else {
      int so_error = 0;
      socklen_t length = sizeof(so_error);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &length);
      if (so_error != 0) {
        out.io = {Io::kError, so_error};
        out.error = fmt::format("connect: {}", std::strerror(so_error));
      }
    }
  } else if (rc != 0) {
    out.io = {Io::kError, errno};
    out.error = fmt::format("connect: {}", std::strerror(errno));
  }
  if (!out.error.empty()) {
    ::close(fd);
    return out;
  }
  out.fd = fd;
  return out;
}

ConnectionServer::~ConnectionServer() {
  join();
}

void ConnectionServer::start(int listen_fd, int stop_fd, Serve serve) {
  listen_fd_ = listen_fd;
  stop_fd_ = stop_fd;
  serve_ = std::move(serve);
  acceptor_ = std::thread([this] { accept_loop(); });
}

void ConnectionServer::join() {
  if (acceptor_.joinable()) acceptor_.join();
  std::list<Connection> ending;
  {
    std::lock_guard lock(mu_);
    ending.splice(ending.end(), connections_);  // the nodes stay where their threads see them
  }
  for (Connection& connection : ending) {  // joined unlocked: each thread takes mu_ as it ends
    if (connection.thread.joinable()) connection.thread.join();
  }
}

void ConnectionServer::accept_loop() {
  for (;;) {
    const Io waited = wait_fd(listen_fd_, POLLIN, kNoDeadline, stop_fd_);
    if (waited.code == Io::kStopped) return;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: back off instead of spinning on the pending connection.
        pollfd p{.fd = stop_fd_, .events = POLLIN, .revents = 0};
        ::poll(&p, 1, 100);
      }
      continue;
    }
    set_nodelay(fd);
    std::lock_guard lock(mu_);
    // Reap connections that ended, so a long-lived server does not accumulate finished threads.
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (it->finished) {
        it->thread.join();
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    if (connections_.size() >= kMaxConnections) {
      ::close(fd);
      continue;
    }
    Connection& connection = connections_.emplace_back();
    connection.fd = fd;
    try {
      connection.thread = std::thread([this, &connection] {
        serve_(connection.fd);
        ::close(connection.fd);
        std::lock_guard lock(mu_);
        connection.finished = true;
      });
    } catch (const std::system_error&) {  // out of threads: refuse this one rather than end the process
      ::close(fd);
      connections_.pop_back();
    }
  }
}

}  // namespace crescent::net
