#include "bench/serve_bench.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "cluster/local_cluster.h"
#include "common/percentile.h"
#include "common/process_usage.h"
#include "common/socket_io.h"
#include "serve/frontend.h"
#include "serve/http_server.h"

namespace crescent::bench {
namespace {

using Clock = std::chrono::steady_clock;

// One client connection of the driver.
struct Connection {
  int fd = -1;
  std::string out;  // bytes still to send
  size_t sent = 0;
  std::string in;  // bytes received and not yet consumed
  bool busy = false;
  int64_t events = 0;  // SSE data events seen on the current request
  bool done = false;   // the current response ended
  Clock::time_point started;
};

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  net::set_nodelay(fd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string request_bytes(const std::string& body) {
  return fmt::format(
      "POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: "
      "{}\r\n\r\n{}",
      body.size(), body);
}

// Drives connections with epoll until `finished()` or `deadline`. `on_readable` consumes c.in.
class Driver {
 public:
  Driver() : epoll_fd_(::epoll_create1(EPOLL_CLOEXEC)) {}
  ~Driver() {
    for (Connection& c : connections_) {
      if (c.fd >= 0) ::close(c.fd);
    }
    ::close(epoll_fd_);
  }

  std::vector<Connection>& connections() { return connections_; }

  // Opens `n` connections to `port`; false when the OS refuses.
  bool open(int port, size_t n) {
    connections_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      connections_[i].fd = connect_to(port);
      if (connections_[i].fd < 0) return false;
      epoll_event ev{.events = EPOLLIN | EPOLLOUT, .data = {.u64 = i}};
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, connections_[i].fd, &ev);
    }
    return true;
  }

  void send(size_t i, std::string bytes) {
    Connection& c = connections_[i];
    c.out = std::move(bytes);
    c.sent = 0;
    c.busy = true;
    c.done = false;
    c.events = 0;
    c.started = Clock::now();
    flush(c);
  }

  // One round of waiting (at most `timeout_ms`); calls on_data(i) after bytes arrive on connection i.
  template <typename OnData>
  void poll(int timeout_ms, OnData on_data) {
    epoll_event events[256];
    const int n = ::epoll_wait(epoll_fd_, events, 256, timeout_ms);
    for (int k = 0; k < n; ++k) {
      const size_t i = events[k].data.u64;
      Connection& c = connections_[i];
      if (events[k].events & EPOLLOUT) flush(c);
      if (events[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        char buffer[64 << 10];
        for (;;) {
          const ssize_t got = ::recv(c.fd, buffer, sizeof(buffer), 0);
          if (got > 0) {
            c.in.append(buffer, static_cast<size_t>(got));
            continue;
          }
          break;
        }
        on_data(i);
      }
    }
  }

 private:
  static void flush(Connection& c) {
    while (c.sent < c.out.size()) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      c.sent += static_cast<size_t>(n);
    }
  }

  int epoll_fd_;
  std::vector<Connection> connections_;
};

// Consumes whole responses of kind "Content-Length" from c.in; true when one ended.
bool take_whole_response(Connection& c) {
  const size_t head_end = c.in.find("\r\n\r\n");
  if (head_end == std::string::npos) return false;
  const size_t at = c.in.find("Content-Length: ");
  if (at == std::string::npos || at > head_end) return false;
  const size_t length = std::stoul(c.in.substr(at + 16));
  if (c.in.size() < head_end + 4 + length) return false;
  c.in.erase(0, head_end + 4 + length);
  return true;
}

// Counts SSE data events in c.in (consuming complete ones); true once "[DONE]" and the last chunk arrived.
bool take_stream_events(Connection& c) {
  for (size_t at; (at = c.in.find("data: ")) != std::string::npos;) {
    const size_t end = c.in.find("\n\n", at);
    if (end == std::string::npos) break;
    if (c.in.compare(at + 6, 6, "[DONE]") == 0) c.done = true;
    ++c.events;
    c.in.erase(0, end + 2);
  }
  return c.done && c.in.find("0\r\n\r\n") != std::string::npos;
}

}  // namespace

Result<ServeBenchReport> run_serve_bench(const ServeBenchOptions& options) {
  if (!(options.rate_per_s > 0) || !(options.seconds > 0) || options.streams < 1 ||
      options.tokens_per_stream < 2) {
    return Status::invalid_argument("--rate and --seconds must be > 0, --streams >= 1, --tokens >= 2");
  }
  auto cluster = cluster::LocalCluster::start({.config = options.config});
  if (!cluster.ok()) return cluster.status();
  // The handler timed as a whole: parse, tokenize, Conductor placement (it answers later, from the cluster).
  std::vector<double> admission_s;
  admission_s.reserve(static_cast<size_t>(options.rate_per_s * options.seconds) + 16);
  serve::HttpHandler frontend = serve::make_frontend(**cluster, {});
  serve::HttpHandler timed = [&](serve::HttpRequest request, serve::HttpResponder responder) {
    const auto t0 = Clock::now();
    frontend(std::move(request), std::move(responder));
    admission_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  };
  auto server = serve::HttpServer::start({.port = 0, .max_connections = 100'000}, timed);
  if (!server.ok()) return server.status();
  const int port = (*server)->port();
  ServeBenchReport report;

  // 1. Admission overhead at a fixed arrival rate.
  ServeAdmission& a = report.admission;
  const auto total = static_cast<size_t>(options.rate_per_s * options.seconds);
  a.requests = total;
  const std::string small = request_bytes(R"({"model": "mock", "prompt": "Say hello.", "max_tokens": 1})");
  std::vector<double> latency_s;
  size_t sent = 0;
  double open_loop_s = 0;
  {
    Driver open_loop;
    const size_t pool = std::min<size_t>(total, 2048);
    if (!open_loop.open(port, pool)) return Status::unavailable("bench serve: cannot open connections");
    const auto start = Clock::now();
    while (a.answered + a.dropped_client_side < total &&
           Clock::now() - start < std::chrono::duration<double>(options.seconds + 30)) {
      const auto now = Clock::now();
      const auto due =
          static_cast<size_t>(std::chrono::duration<double>(now - start).count() * options.rate_per_s) + 1;
      while (sent < std::min(due, total)) {
        auto& conns = open_loop.connections();
        auto idle = std::find_if(conns.begin(), conns.end(), [](const Connection& c) { return !c.busy; });
        if (idle == conns.end()) {
          ++a.dropped_client_side;  // every connection busy: the server is behind
        } else {
          open_loop.send(static_cast<size_t>(idle - conns.begin()), small);
        }
        ++sent;
      }
      open_loop.poll(1, [&](size_t i) {
        Connection& c = open_loop.connections()[i];
        while (c.busy && take_whole_response(c)) {
          c.busy = false;
          latency_s.push_back(std::chrono::duration<double>(Clock::now() - c.started).count());
          ++a.answered;
        }
      });
    }
    open_loop_s = std::chrono::duration<double>(Clock::now() - start).count();
  }                                             // closes the admission test's connections
  std::vector<double> handler_s = admission_s;  // the admission test's, sorted
  std::sort(handler_s.begin(), handler_s.end());
  std::sort(latency_s.begin(), latency_s.end());
  a.achieved_per_s = static_cast<double>(a.answered) / open_loop_s;
  a.handler_p50_us = nearest_rank(handler_s, 50) * 1e6;
  a.handler_p99_us = nearest_rank(handler_s, 99) * 1e6;
  a.response_p50_ms = nearest_rank(latency_s, 50) * 1e3;
  a.response_p99_ms = nearest_rank(latency_s, 99) * 1e3;

  // 2. Concurrent streams held to the end.
  ServeStreams& s = report.streams;
  const size_t first_stream_admission = admission_s.size();
  Driver streams;
  if (!streams.open(port, static_cast<size_t>(options.streams))) {
    return Status::unavailable(
        fmt::format("bench serve: cannot open {} connections (ulimit -n?)", options.streams));
  }
  const std::string streamed = request_bytes(fmt::format(
      R"({{"model": "mock", "prompt": "Tell me a long story.", "max_tokens": {}, "stream": true}})",
      options.tokens_per_stream));
  const auto stream_start = Clock::now();
  const double stream_cpu_start = process_cpu_seconds();
  for (size_t i = 0; i < streams.connections().size(); ++i) streams.send(i, streamed);
  int64_t events = 0;
  while (s.completed < streams.connections().size() &&
         Clock::now() - stream_start < std::chrono::seconds(120)) {
    streams.poll(10, [&](size_t i) {
      Connection& c = streams.connections()[i];
      if (!c.busy) return;
      if (take_stream_events(c)) {
        c.busy = false;
        ++s.completed;
      }
    });
    s.held_at_once = std::max<int64_t>(s.held_at_once, static_cast<int64_t>((*server)->connections()));
  }
  s.seconds = std::chrono::duration<double>(Clock::now() - stream_start).count();
  s.cpu_seconds = process_cpu_seconds() - stream_cpu_start;
  for (const Connection& c : streams.connections()) events += c.events;
  s.tokens_delivered =
      events - static_cast<int64_t>(streams.connections().size()) * 2;  // minus finish, [DONE]
  (*server)->stop();
  s.tokens_per_s = static_cast<double>(s.tokens_delivered) / s.seconds;
  s.tokens_per_cpu_s = static_cast<double>(s.tokens_delivered) / s.cpu_seconds;
  s.admissions_timed = admission_s.size() - first_stream_admission;
  report.peak_rss_mib = peak_rss_mib();
  return report;
}

}  // namespace crescent::bench
