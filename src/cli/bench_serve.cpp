// `crescent bench serve`: the front end under load, in one process on loopback (docs/benchmarks.md).
//   1. Admission overhead: completions sent open-loop at --rate requests/s for --seconds; the time from the
//      HTTP handler's entry to the Conductor's placement returned (parse, tokenize, schedule), p50/p99.
//   2. Concurrent streams: --streams streamed completions of --tokens tokens opened at once and held to the
//      end; how many completed, tokens delivered per second, the process's peak RSS.
// The load driver is one epoll thread with non-blocking sockets, so the client is not the bottleneck.
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cluster/cluster_config.h"
#include "cluster/local_cluster.h"
#include "common/percentile.h"
#include "serve/frontend.h"
#include "serve/http_server.h"

namespace crescent::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchServeArgs {
  std::string config_path;
  double rate = 1000;
  double seconds = 3;
  int64_t streams = 2000;
  int64_t tokens = 64;
  uint32_t prefill_instances = 12;  // 16 instances in all: enough prefill for 1,000 short prompts a second
  uint32_t decode_instances = 4;
  bool json = false;
};

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
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
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

// CPU seconds (user + system) this process has used.
double cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

int64_t peak_rss_kib() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

int run_bench_serve(const BenchServeArgs& args) {
  if (!(args.rate > 0) || !(args.seconds > 0) || args.streams < 1 || args.tokens < 2) {
    return fail(Status::invalid_argument("--rate and --seconds must be > 0, --streams >= 1, --tokens >= 2"));
  }
  auto config = load_cluster_config_or_default(args.config_path, 512);
  if (!config.ok()) return fail(config.status());
  config->prefill_instances = args.prefill_instances;
  config->decode_instances = args.decode_instances;
  auto cluster = cluster::LocalCluster::start({.config = *config});
  if (!cluster.ok()) return fail(cluster.status());
  // The handler timed as a whole: parse, tokenize, Conductor placement (it answers later, from the cluster).
  std::vector<double> admission_s;
  admission_s.reserve(static_cast<size_t>(args.rate * args.seconds) + 16);
  serve::HttpHandler frontend = serve::make_frontend(**cluster, {});
  serve::HttpHandler timed = [&](serve::HttpRequest request, serve::HttpResponder responder) {
    const auto t0 = Clock::now();
    frontend(std::move(request), std::move(responder));
    admission_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  };
  auto server = serve::HttpServer::start({.port = 0, .max_connections = 100'000}, timed);
  if (!server.ok()) return fail(server.status());
  const int port = (*server)->port();

  // 1. Admission overhead at a fixed arrival rate.
  const auto total = static_cast<size_t>(args.rate * args.seconds);
  const std::string small = request_bytes(R"({"model": "mock", "prompt": "Say hello.", "max_tokens": 1})");
  std::vector<double> latency_s;
  size_t sent = 0, answered = 0, dropped = 0;
  double open_loop_s = 0;
  {
    Driver open_loop;
    const size_t pool = std::min<size_t>(total, 2048);
    if (!open_loop.open(port, pool)) return fail(Status::unavailable("bench serve: cannot open connections"));
    const auto start = Clock::now();
    while (answered + dropped < total &&
           Clock::now() - start < std::chrono::duration<double>(args.seconds + 30)) {
      const auto now = Clock::now();
      const auto due =
          static_cast<size_t>(std::chrono::duration<double>(now - start).count() * args.rate) + 1;
      while (sent < std::min(due, total)) {
        auto& conns = open_loop.connections();
        auto idle = std::find_if(conns.begin(), conns.end(), [](const Connection& c) { return !c.busy; });
        if (idle == conns.end()) {
          ++dropped;  // every connection busy: the server is behind
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
          ++answered;
        }
      });
    }
    open_loop_s = std::chrono::duration<double>(Clock::now() - start).count();
  }                                             // closes the admission test's connections
  std::vector<double> handler_s = admission_s;  // the admission test's, sorted
  std::sort(handler_s.begin(), handler_s.end());
  std::sort(latency_s.begin(), latency_s.end());

  // 2. Concurrent streams held to the end.
  const size_t first_stream_admission = admission_s.size();
  Driver streams;
  if (!streams.open(port, static_cast<size_t>(args.streams))) {
    return fail(Status::unavailable(
        fmt::format("bench serve: cannot open {} connections (ulimit -n?)", args.streams)));
  }
  const std::string streamed = request_bytes(fmt::format(
      R"({{"model": "mock", "prompt": "Tell me a long story.", "max_tokens": {}, "stream": true}})",
      args.tokens));
  const auto stream_start = Clock::now();
  const double stream_cpu_start = cpu_seconds();
  for (size_t i = 0; i < streams.connections().size(); ++i) streams.send(i, streamed);
  size_t completed = 0;
  int64_t max_open = 0, events = 0;
  while (completed < streams.connections().size() &&
         Clock::now() - stream_start < std::chrono::seconds(120)) {
    streams.poll(10, [&](size_t i) {
      Connection& c = streams.connections()[i];
      if (!c.busy) return;
      if (take_stream_events(c)) {
        c.busy = false;
        ++completed;
      }
    });
    max_open = std::max<int64_t>(max_open, static_cast<int64_t>((*server)->connections()));
  }
  const double stream_s = std::chrono::duration<double>(Clock::now() - stream_start).count();
  const double stream_cpu_s = cpu_seconds() - stream_cpu_start;
  for (const Connection& c : streams.connections()) events += c.events;
  const int64_t tokens =
      events - static_cast<int64_t>(streams.connections().size()) * 2;  // minus finish, [DONE]
  (*server)->stop();

  nlohmann::json out = {{"admission",
                         {{"rate_per_s", args.rate},
                          {"requests", total},
                          {"answered", answered},
                          {"dropped_client_side", dropped},
                          {"achieved_per_s", static_cast<double>(answered) / open_loop_s},
                          {"handler_p50_us", nearest_rank(handler_s, 50) * 1e6},
                          {"handler_p99_us", nearest_rank(handler_s, 99) * 1e6},
                          {"response_p50_ms", nearest_rank(latency_s, 50) * 1e3},
                          {"response_p99_ms", nearest_rank(latency_s, 99) * 1e3}}},
                        {"streams",
                         {{"opened", args.streams},
                          {"completed", completed},
                          {"held_at_once", max_open},
                          {"tokens_per_stream", args.tokens},
                          {"tokens_delivered", tokens},
                          {"seconds", stream_s},
                          {"tokens_per_s", static_cast<double>(tokens) / stream_s},
                          {"cpu_s", stream_cpu_s},
                          {"tokens_per_cpu_s", static_cast<double>(tokens) / stream_cpu_s},
                          {"admissions_timed", admission_s.size() - first_stream_admission}}},
                        {"peak_rss_mib", static_cast<double>(peak_rss_kib()) / 1024},
                        {"cluster", fmt::format("{} prefill + {} decode mock instances",
                                                config->prefill_instances, config->decode_instances)}};
  if (args.json) {
    fmt::print("{}\n", dump_json(out, 2));
  } else {
    const auto& a = out["admission"];
    const auto& s = out["streams"];
    fmt::print(
        "crescent bench serve: front end and in-process cluster ({}, mock timing of the config's model), "
        "one process, loopback\n\n",
        out["cluster"].get<std::string>());
    fmt::print("admission at {:g} requests/s for {:g} s: {} answered ({:.0f}/s), {} dropped by the client\n",
               args.rate, args.seconds, answered, a["achieved_per_s"].get<double>(), dropped);
    fmt::print("  handler (HTTP in -> placement) p50 {:.1f} us  p99 {:.1f} us   goal p99 < 1000 us: {}\n",
               a["handler_p50_us"].get<double>(), a["handler_p99_us"].get<double>(),
               a["handler_p99_us"].get<double>() < 1000 ? "met" : "NOT met");
    fmt::print("  whole response (1 token)        p50 {:.2f} ms  p99 {:.2f} ms\n",
               a["response_p50_ms"].get<double>(), a["response_p99_ms"].get<double>());
    fmt::print(
        "streams: {} opened at once, {} completed, {} held open at once; {} tokens in {:.1f} s = {:.0f} "
        "tokens/s   goal >= 2000 held: {}\n",
        args.streams, completed, max_open, tokens, stream_s, s["tokens_per_s"].get<double>(),
        max_open >= 2000 && completed == static_cast<size_t>(args.streams) ? "met" : "NOT met");
    fmt::print("  {:.1f} CPU seconds (server and load driver together): {:.0f} tokens per CPU second\n",
               s["cpu_s"].get<double>(), s["tokens_per_cpu_s"].get<double>());
    fmt::print("peak RSS {:.0f} MiB\n", out["peak_rss_mib"].get<double>());
  }
  return completed == static_cast<size_t>(args.streams) ? 0 : 1;
}

}  // namespace

void register_bench_serve(CLI::App& bench_cmd, int& exit_code) {
  auto args = std::make_shared<BenchServeArgs>();
  CLI::App* cmd = bench_cmd.add_subcommand(
      "serve", "The HTTP front end and Conductor under load: admission overhead and concurrent SSE streams");
  cmd->add_option("--config", args->config_path,
                  "Cluster config (default: the bundled configs/paper-fig5.json)");
  cmd->add_option("--rate", args->rate, "Open-loop arrivals per second for the admission test")
      ->capture_default_str();
  cmd->add_option("--seconds", args->seconds, "Length of the admission test")->capture_default_str();
  cmd->add_option("--streams", args->streams, "Streams opened at once")->capture_default_str();
  cmd->add_option("--tokens", args->tokens, "Tokens per stream")->capture_default_str();
  cmd->add_option("--prefill", args->prefill_instances, "Prefill instances")->capture_default_str();
  cmd->add_option("--decode", args->decode_instances, "Decode instances")->capture_default_str();
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
  cmd->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_bench_serve(*args); }); });
}

}  // namespace crescent::cli
