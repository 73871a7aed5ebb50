#include "bench/transfer_bench.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "common/child_process.h"
#include "common/percentile.h"
#include "common/temp_dir.h"
#include "common/text_format.h"

namespace crescent::bench {
namespace {

using Clock = std::chrono::steady_clock;
using transfer::TransferEngine;
using transfer::TransferOp;
using transfer::TransportKind;

constexpr uint64_t kPatternSeedTarget = 1;                // the target's segment content
constexpr uint64_t kPatternSeedInitiator = 2;             // initiator memory (what writes carry)
constexpr auto kBatchTimeout = std::chrono::seconds(60);  // > the engine's request timeout (10 s)

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Fills `length` bytes with words that depend on (seed, word index from `data`): never all zero, and a
// block copied to the wrong place does not match.
void fill_pattern(std::byte* data, uint64_t length, uint64_t seed) {
  uint64_t i = 0;
  for (; i + 8 <= length; i += 8) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + i / 8 + 1;
    x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    std::memcpy(data + i, &x, 8);
  }
  for (; i < length; ++i) data[i] = static_cast<std::byte>(i * 131 + seed + 1);
}

bool all_zero(const std::byte* data, uint64_t length) {
  return std::all_of(data, data + length, [](std::byte b) { return b == std::byte{0}; });
}

std::string errno_text(std::string_view what) {
  return fmt::format("{}: {}", what, std::strerror(errno));
}

// Memory laid out as the transfer engine's allocate_memory lays it out (memfd, MAP_SHARED, pre-faulted),
// so the baselines copy from and to the same kind of pages as the engines.
class SharedBuffer {
 public:
  static Result<SharedBuffer> allocate(uint64_t length) {
    const int fd = ::memfd_create("crescent-bench", MFD_CLOEXEC);
    if (fd < 0) return Status::io_error(errno_text("memfd_create"));
    if (::ftruncate(fd, static_cast<off_t>(length)) != 0) {
      const Status status = Status::io_error(errno_text(fmt::format("ftruncate {} bytes", length)));
      ::close(fd);
      return status;
    }
    void* memory = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (memory == MAP_FAILED) {
      return Status::io_error(fmt::format("mmap {} bytes: {}", length, std::strerror(err)));
    }
    SharedBuffer buffer;
    buffer.data_ = static_cast<std::byte*>(memory);
    buffer.length_ = length;
    return buffer;
  }
  SharedBuffer() = default;
  SharedBuffer(SharedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), length_(std::exchange(other.length_, 0)) {}
  SharedBuffer& operator=(SharedBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(length_, other.length_);
    return *this;
  }
  ~SharedBuffer() {
    if (data_ != nullptr) ::munmap(data_, length_);
  }
  std::byte* data() const { return data_; }

 private:
  std::byte* data_ = nullptr;
  uint64_t length_ = 0;
};

// Bytes one thread of `spec` rotates over: batches of consecutive blocks, wrapping at the partition end.
uint64_t partition_bytes(const TransferRunSpec& spec, uint64_t working_set_bytes) {
  return run_working_set_bytes(spec, working_set_bytes) / static_cast<uint64_t>(spec.threads);
}

// ---------------------------------------------------------------------------------------------------------
// Baselines.

// Single-thread memcpy of `batch` blocks per round, at the same offsets in `src` and `dst`, rotating over
// `span` bytes of each: GB/s over `seconds` after one warm-up round.
double measure_memcpy_gbps(const std::byte* src, std::byte* dst, uint64_t span, uint64_t block, size_t batch,
                           double seconds) {
  const uint64_t round = block * batch;
  uint64_t cursor = 0;
  auto copy_round = [&] {
    for (size_t i = 0; i < batch; ++i) std::memcpy(dst + cursor + i * block, src + cursor + i * block, block);
    cursor += round;
    if (cursor + round > span) cursor = 0;
  };
  copy_round();
  // Read the clock about once per MiB copied, not after every 4 KiB round.
  const uint64_t rounds_per_check = std::max<uint64_t>(1, kMiB / round);
  uint64_t bytes = 0;
  const auto start = Clock::now();
  Clock::time_point now;
  do {
    for (uint64_t i = 0; i < rounds_per_check; ++i) copy_round();
    bytes += round * rounds_per_check;
    now = Clock::now();
  } while (seconds_between(start, now) < seconds);
  return static_cast<double>(bytes) / seconds_between(start, now) / 1e9;
}

Status send_all(int fd, const std::byte* data, uint64_t length) {
  while (length > 0) {
    const ssize_t n = ::send(fd, data, length, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::io_error(errno_text("send"));
    data += n;
    length -= static_cast<uint64_t>(n);
  }
  return Status();
}

Status recv_all(int fd, std::byte* data, uint64_t length) {
  while (length > 0) {
    const ssize_t n = ::recv(fd, data, length, MSG_WAITALL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::io_error(errno_text("recv"));
    if (n == 0) return Status::io_error("recv: connection closed");
    data += n;
    length -= static_cast<uint64_t>(n);
  }
  return Status();
}

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Raw loopback TCP: per stream, a sender thread sends `block`-byte messages over one plain blocking socket
// on 127.0.0.1 (default socket options) from `src` and a receiver thread receives them into `dst`; streams
// use disjoint parts of `span` bytes and rotate over them. GB/s received by all streams together over
// `seconds`, timed once every stream has received `warm_bytes` / streams (at least one message) untimed.
Result<double> measure_tcp_loopback_gbps(const std::byte* src, std::byte* dst, uint64_t span, uint64_t block,
                                         int streams, uint64_t warm_bytes, double seconds) {
  Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.fd < 0) return Status::io_error(errno_text("socket"));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t address_length = sizeof address;
  if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listener.fd, streams) != 0 ||
      ::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&address), &address_length) != 0) {
    return Status::io_error(errno_text("listen on 127.0.0.1"));
  }
  std::vector<std::unique_ptr<Fd>> senders;
  std::vector<std::unique_ptr<Fd>> receivers;
  for (int i = 0; i < streams; ++i) {
    senders.push_back(std::make_unique<Fd>(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)));
    if (senders.back()->fd < 0) return Status::io_error(errno_text("socket"));
    if (::connect(senders.back()->fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      return Status::io_error(errno_text("connect to 127.0.0.1"));
    }
    receivers.push_back(std::make_unique<Fd>(::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC)));
    if (receivers.back()->fd < 0) return Status::io_error(errno_text("accept"));
  }

  const uint64_t part = span / static_cast<uint64_t>(streams);
  const uint64_t warm_per_stream = std::max(block, warm_bytes / static_cast<uint64_t>(streams));
  auto next = [&](uint64_t cursor) { return cursor + 2 * block > part ? 0 : cursor + block; };
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> received{0};  // by warmed-up streams
  std::atomic<int> warmed{0};
  std::mutex error_mu;
  Status error;
  std::vector<std::thread> threads;
  for (int i = 0; i < streams; ++i) {
    const uint64_t base = part * static_cast<uint64_t>(i);
    threads.emplace_back([&, base, fd = senders[i]->fd] {
      for (uint64_t cursor = 0; !stop.load(std::memory_order_relaxed); cursor = next(cursor)) {
        if (!send_all(fd, src + base + cursor, block).ok()) return;
      }
    });
    threads.emplace_back([&, base, fd = receivers[i]->fd] {
      uint64_t got = 0;
      for (uint64_t cursor = 0; !stop.load(std::memory_order_relaxed); cursor = next(cursor)) {
        if (Status status = recv_all(fd, dst + base + cursor, block); !status.ok()) {
          std::lock_guard lock(error_mu);
          if (!stop.load() && error.ok()) error = status;
          return;
        }
        if (got < warm_per_stream) {
          got += block;
          if (got >= warm_per_stream) warmed.fetch_add(1);
        } else {
          received.fetch_add(block, std::memory_order_relaxed);
        }
      }
    });
  }
  auto failed = [&] {
    std::lock_guard lock(error_mu);
    return !error.ok();
  };
  while (warmed.load() < streams && !failed()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto start = Clock::now();
  const uint64_t before = received.load();
  const auto end_at = start + std::chrono::duration<double>(seconds);
  while (Clock::now() < end_at && !failed()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const uint64_t after = received.load();
  const auto end = Clock::now();
  stop = true;
  for (auto& fd : senders) ::shutdown(fd->fd, SHUT_RDWR);  // wakes sends blocked on full socket buffers
  for (auto& fd : receivers) ::shutdown(fd->fd, SHUT_RDWR);
  for (auto& thread : threads) thread.join();
  if (!error.ok()) return error;
  return static_cast<double>(after - before) / seconds_between(start, end) / 1e9;
}

// ---------------------------------------------------------------------------------------------------------
// The target process.

// Points file descriptor 1 at stderr while alive, so what libraries print on stdout (UCX's log lines) does
// not mix with the report (or, in the target, with the control channel); restores it on destruction.
class StdoutToStderr {
 public:
  StdoutToStderr() {
    std::fflush(stdout);
    saved_ = ::dup(STDOUT_FILENO);
    if (saved_ >= 0) ::dup2(STDERR_FILENO, STDOUT_FILENO);
  }
  ~StdoutToStderr() {
    std::fflush(stdout);
    if (saved_ >= 0) {
      ::dup2(saved_, STDOUT_FILENO);
      ::close(saved_);
    }
  }
  StdoutToStderr(const StdoutToStderr&) = delete;
  StdoutToStderr& operator=(const StdoutToStderr&) = delete;
  // The original stdout (-1 when it could not be duplicated).
  int saved() const { return saved_; }

 private:
  int saved_ = -1;
};

// The bench's metadata directory: a TempDir named crescent-bench-PID-XXXXXX. Before creating it, removes
// such directories of processes that no longer exist (a bench killed by SIGKILL cannot remove its own).
Result<TempDir> create_bench_dir() {
  std::error_code error;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::temp_directory_path(error), error)) {
    const std::string name = entry.path().filename().string();
    int pid = 0;
    const char* digits = name.c_str() + std::strlen("crescent-bench-");
    if (name.rfind("crescent-bench-", 0) != 0) continue;
    const auto [end, ec] = std::from_chars(digits, name.c_str() + name.size(), pid);
    if (ec != std::errc() || *end != '-' || pid <= 0) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) std::filesystem::remove_all(entry.path(), error);
  }
  return TempDir::create(fmt::format("crescent-bench-{}", ::getpid()));
}

std::string join_transports(const std::vector<TransportKind>& kinds) {
  std::string out;
  for (TransportKind kind : kinds) {
    if (!out.empty()) out.push_back(',');
    out.append(transfer::transport_name(kind));
  }
  return out;
}

// `crescent bench transfer-target` as a child process, driven over pipes; stopped and reaped on
// destruction whatever happened.
class TargetProcess {
 public:
  // Starts `binary` as the target; wait_ready() waits for it to serve its segment.
  static Result<std::unique_ptr<TargetProcess>> start(const std::string& binary,
                                                      const TransferTargetOptions& options) {
    std::vector<std::string> args = {binary,
                                     "bench",
                                     "transfer-target",
                                     "--metadata-dir",
                                     options.metadata_dir,
                                     "--name",
                                     options.engine_name,
                                     "--segment",
                                     options.segment,
                                     "--transports",
                                     join_transports(options.transports),
                                     "--bytes",
                                     std::to_string(options.segment_bytes)};
    if (!options.ucx_tls.empty()) {
      args.push_back("--ucx-tls");
      args.push_back(options.ucx_tls);
    }
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);

    int to_child[2];
    int from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0) return Status::io_error(errno_text("pipe"));
    if (::pipe2(from_child, O_CLOEXEC) != 0) {
      const Status status = Status::io_error(errno_text("pipe"));
      ::close(to_child[0]);
      ::close(to_child[1]);
      return status;
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Async-signal-safe calls only. The target dies with this thread (the bench's main thread).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ::dup2(to_child[0], 0);
      ::dup2(from_child[1], 1);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const int fork_errno = errno;
    ::close(to_child[0]);
    ::close(from_child[1]);
    auto target = std::unique_ptr<TargetProcess>(new TargetProcess(pid, to_child[1], from_child[0]));
    if (pid < 0) return Status::io_error(fmt::format("fork: {}", std::strerror(fork_errno)));
    return target;
  }

  // Waits (up to `timeout`) for the target's ready line: its segment is filled and exposed.
  Status wait_ready(std::chrono::milliseconds timeout) {
    Result<std::string> line = read_line(timeout);
    if (!line.ok())
      return Status::unavailable(fmt::format("bench target process: {}", line.status().message()));
    const auto ready = nlohmann::json::parse(*line, nullptr, false);
    if (!ready.is_object() || !ready.value("ready", false)) {
      const std::string why = ready.is_object() && ready.contains("error") && ready["error"].is_string()
                                  ? ready["error"].get<std::string>()
                                  : *line;
      return Status::unavailable(fmt::format("bench target process did not start: {}", why));
    }
    const nlohmann::json served = ready.contains("served") ? ready.at("served") : nlohmann::json();
    for (size_t i = 0; served.is_array() && i < served.size(); ++i) {
      if (served[i].is_string()) served_.push_back(served[i].get<std::string>());
    }
    const nlohmann::json unavailable =
        ready.contains("unavailable") ? ready.at("unavailable") : nlohmann::json();
    if (unavailable.is_object()) {
      for (auto it = unavailable.begin(); it != unavailable.end(); ++it) {
        unavailable_[it.key()] = it->is_string() ? it->get<std::string>() : it->dump();
      }
    }
    return Status();
  }

  ~TargetProcess() { stop(); }
  TargetProcess(const TargetProcess&) = delete;
  TargetProcess& operator=(const TargetProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::vector<std::string>& served() const { return served_; }
  const std::map<std::string, std::string>& unavailable() const { return unavailable_; }

  // XXH3-64 of the target's segment bytes [offset, offset + length).
  Result<uint64_t> checksum(uint64_t offset, uint64_t length) {
    const std::string command = fmt::format("sum {} {}\n", offset, length);
    for (size_t done = 0; done < command.size();) {
      const ssize_t n = ::write(in_, command.data() + done, command.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::unavailable(errno_text("bench target process: write"));
      done += static_cast<size_t>(n);
    }
    Result<std::string> line = read_line(std::chrono::seconds(30));
    if (!line.ok())
      return Status::unavailable(fmt::format("bench target process: {}", line.status().message()));
    if (line->rfind("sum ", 0) != 0)
      return Status::internal(fmt::format("bench target process: '{}'", *line));
    return std::stoull(line->substr(4), nullptr, 16);
  }

  // Asks the target to exit, waits up to 2 s, then kills it; always reaps it.
  void stop() {
    if (in_ >= 0) {
      (void)!::write(in_, "exit\n", 5);
      ::close(in_);
      in_ = -1;
    }
    if (pid_ > 0) {
      const auto deadline = Clock::now() + std::chrono::seconds(2);
      while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
        if (Clock::now() > deadline) {
          ::kill(pid_, SIGKILL);
          ::waitpid(pid_, nullptr, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      pid_ = -1;
    }
    if (out_ >= 0) {
      ::close(out_);
      out_ = -1;
    }
  }

 private:
  TargetProcess(pid_t pid, int in, int out) : pid_(pid), in_(in), out_(out) {}

  Result<std::string> read_line(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const size_t newline = buffer_.find('\n');
      if (newline != std::string::npos) {
        std::string line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return Status::deadline_exceeded("no answer within the timeout");
      pollfd p{.fd = out_, .events = POLLIN, .revents = 0};
      const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) return Status::io_error(errno_text("poll"));
      if (ready == 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(out_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::unavailable("exited unexpectedly");
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int in_ = -1;   // its stdin
  int out_ = -1;  // its stdout
  std::string buffer_;
  std::vector<std::string> served_;
  std::map<std::string, std::string> unavailable_;
};

// ---------------------------------------------------------------------------------------------------------
// Transfer runs.

// One initiator thread's share of a run.
struct Worker {
  uint64_t base = 0;       // first byte of its partition (same offset locally and in the segment)
  uint64_t partition = 0;  // bytes it rotates over
  uint64_t cursor = 0;     // offset of the next batch inside the partition
  std::vector<transfer::TransferRequest> requests;
  uint64_t bytes = 0;
  uint64_t completed = 0;
  std::vector<double> batch_us;
  std::vector<double> request_us;
  Clock::time_point end;
  std::string error;
};

// Everything a run needs from its path.
struct PathContext {
  TransferEngine* engine = nullptr;
  transfer::SegmentHandle segment = 0;
  std::byte* local = nullptr;
  TargetProcess* target = nullptr;
};

std::string first_failure(TransferEngine& engine, transfer::BatchId batch, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    Result<transfer::TransferStatus> status = engine.status(batch, i);
    if (status.ok() && status->state == transfer::TransferState::kFailed) {
      return fmt::format("request {} of the batch failed: {}", i, status->error);
    }
  }
  return "a request of the batch failed";
}

// Submits one batch of `spec.batch` consecutive blocks at the worker's cursor and waits for it: with
// wait() (`poll` false, records the batch latency) or by polling each request's status (`poll` true,
// records every request's latency). Advances the cursor; returns the error text on failure.
std::optional<std::string> run_batch(const PathContext& path, const TransferRunSpec& spec, Worker& worker,
                                     bool poll, bool record) {
  TransferEngine& engine = *path.engine;
  const size_t n = spec.batch;
  worker.requests.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t offset = worker.base + worker.cursor + i * spec.block_bytes;
    worker.requests[i] = {.op = spec.op,
                          .local_address = path.local + offset,
                          .segment = path.segment,
                          .offset_bytes = offset,
                          .length_bytes = spec.block_bytes};
  }
  Result<transfer::BatchId> batch = engine.allocate_batch(n);
  if (!batch.ok()) return batch.status().message();
  const auto start = Clock::now();
  if (Status submitted = engine.submit(*batch, worker.requests); !submitted.ok()) {
    (void)engine.free_batch(*batch);
    return submitted.message();
  }
  const auto deadline = start + kBatchTimeout;
  if (!poll) {
    Result<transfer::BatchSummary> summary = engine.wait(*batch, kBatchTimeout);
    const auto end = Clock::now();
    if (!summary.ok()) return summary.status().message();
    if (summary->pending() > 0) {
      return fmt::format("{} of {} requests still pending after {} s", summary->pending(), n,
                         std::chrono::duration_cast<std::chrono::seconds>(kBatchTimeout).count());
    }
    if (summary->failed > 0) return first_failure(engine, *batch, n);
    if (record) worker.batch_us.push_back(std::chrono::duration<double, std::micro>(end - start).count());
  } else {
    std::vector<char> done(n, 0);
    size_t remaining = n;
    size_t first = 0;
    while (remaining > 0) {
      bool progress = false;
      for (size_t i = first; i < n; ++i) {
        if (done[i]) continue;
        Result<transfer::TransferStatus> status = engine.status(*batch, i);
        if (!status.ok()) return status.status().message();
        if (status->state == transfer::TransferState::kPending) continue;
        if (status->state == transfer::TransferState::kFailed) {
          (void)engine.wait(*batch, kBatchTimeout);
          return fmt::format("request {} of the batch failed: {}", i, status->error);
        }
        const auto now = Clock::now();
        if (record)
          worker.request_us.push_back(std::chrono::duration<double, std::micro>(now - start).count());
        done[i] = 1;
        --remaining;
        progress = true;
      }
      while (first < n && done[first]) ++first;
      if (!progress) {
        if (Clock::now() > deadline) return fmt::format("{} of {} requests still pending", remaining, n);
        std::this_thread::yield();
      }
    }
    // A request's state is published just before its batch counts it: wait() lets the counts catch up, so
    // free_batch does not see it pending.
    if (Result<transfer::BatchSummary> summary = engine.wait(*batch, kBatchTimeout); !summary.ok()) {
      return summary.status().message();
    }
  }
  if (Status freed = engine.free_batch(*batch); !freed.ok()) return freed.message();
  if (record && !poll) {
    worker.bytes += spec.block_bytes * n;
    worker.completed += n;
  }
  const uint64_t round = spec.block_bytes * n;
  worker.cursor += round;
  if (worker.cursor + round > worker.partition) worker.cursor = 0;
  return std::nullopt;
}

// Transfers one batch at offset 0 with fresh content in a sample of its requests (reads: zeroed local
// blocks; writes: a new pattern), then compares checksums of those blocks here and in the target.
std::optional<std::string> verify(const PathContext& path, const TransferRunSpec& spec, uint64_t seed,
                                  uint64_t& verified_bytes) {
  Worker worker;
  worker.partition = spec.block_bytes * spec.batch;
  std::vector<size_t> sample = {0, spec.batch / 2, spec.batch - 1};
  sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
  for (size_t i : sample) {
    std::byte* block = path.local + i * spec.block_bytes;
    if (spec.op == TransferOp::kRead) {
      std::memset(block, 0, spec.block_bytes);
    } else {
      fill_pattern(block, spec.block_bytes, seed + i);
    }
  }
  if (auto error = run_batch(path, spec, worker, false, false)) return error;
  for (size_t i : sample) {
    const uint64_t offset = i * spec.block_bytes;
    const std::byte* block = path.local + offset;
    if (spec.op == TransferOp::kRead && all_zero(block, spec.block_bytes)) {
      return fmt::format("verification failed: request {} read only zeros ({} bytes at offset {})", i,
                         spec.block_bytes, offset);
    }
    const uint64_t local = XXH3_64bits(block, spec.block_bytes);
    Result<uint64_t> remote = path.target->checksum(offset, spec.block_bytes);
    if (!remote.ok()) return fmt::format("verification failed: {}", remote.status().message());
    if (local != *remote) {
      return fmt::format(
          "verification failed: request {} ({} bytes at offset {}): checksum {:016x} here, {:016x} in the "
          "target",
          i, spec.block_bytes, offset, local, *remote);
    }
    verified_bytes += spec.block_bytes;
  }
  return std::nullopt;
}

// One untimed pass over the first `bytes` of the segment and of local memory with 1 MiB requests (reads,
// and writes too when `write`): the first kernel-side copy over fresh memory is several times slower on
// some VMs than later ones, and the runs measure the steady state.
std::optional<std::string> warm_path(const PathContext& path, uint64_t bytes, bool write) {
  TransferRunSpec spec;
  spec.block_bytes = std::min<uint64_t>(kMiB, bytes);
  spec.batch = static_cast<size_t>(std::min<uint64_t>(32, bytes / spec.block_bytes));
  Worker worker;
  worker.partition = bytes;
  for (TransferOp op : {TransferOp::kRead, TransferOp::kWrite}) {
    if (op == TransferOp::kWrite && !write) break;
    spec.op = op;
    worker.cursor = 0;
    do {
      if (auto error = run_batch(path, spec, worker, false, false)) return "warm-up: " + *error;
    } while (worker.cursor != 0);
  }
  return std::nullopt;
}

// One timed run: a warm-up batch per thread, then (all threads together) a throughput phase of 3/4 of
// `seconds` waiting per batch, a latency phase of 1/4 polling per request, and a verification batch.
TransferRunResult run_one(const PathContext& path, const TransferRunSpec& spec,
                          const TransferBenchOptions& options, uint64_t seed) {
  TransferRunResult result;
  result.spec = spec;
  result.working_set_bytes = run_working_set_bytes(spec, options.working_set_bytes);
  const uint64_t partition = partition_bytes(spec, options.working_set_bytes);
  const auto throughput_phase = std::chrono::duration<double>(options.seconds * 0.75);
  const auto latency_phase = std::chrono::duration<double>(options.seconds * 0.25);

  std::vector<Worker> workers(static_cast<size_t>(spec.threads));
  for (size_t t = 0; t < workers.size(); ++t) {
    workers[t].base = t * partition;
    workers[t].partition = partition;
  }
  std::atomic<bool> failed{false};
  Clock::time_point throughput_start;
  Clock::time_point latency_start;
  int phase = 0;
  std::barrier sync(spec.threads,
                    [&]() noexcept { (phase++ == 0 ? throughput_start : latency_start) = Clock::now(); });
  auto body = [&](Worker& worker) {
    auto step = [&](bool poll, bool record) {
      if (failed.load()) return false;
      if (auto error = run_batch(path, spec, worker, poll, record)) {
        worker.error = *error;
        failed = true;
        return false;
      }
      return true;
    };
    step(false, false);  // warm-up: connections, first touch
    sync.arrive_and_wait();
    const auto throughput_end = throughput_start + throughput_phase;
    while (step(false, true) && Clock::now() < throughput_end) {
    }
    worker.end = Clock::now();
    sync.arrive_and_wait();
    const auto latency_end = latency_start + latency_phase;
    for (int batches = 0; step(true, true) && (++batches < 2 || Clock::now() < latency_end);) {
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < workers.size(); ++t) threads.emplace_back(body, std::ref(workers[t]));
  body(workers[0]);
  for (auto& thread : threads) thread.join();

  for (size_t t = 0; t < workers.size(); ++t) {
    if (!workers[t].error.empty()) {
      result.error =
          workers.size() > 1 ? fmt::format("thread {}: {}", t, workers[t].error) : workers[t].error;
      return result;
    }
  }
  Clock::time_point end = throughput_start;
  std::vector<double> batch_us;
  std::vector<double> request_us;
  for (Worker& worker : workers) {
    end = std::max(end, worker.end);
    result.bytes += worker.bytes;
    result.requests += worker.completed;
    batch_us.insert(batch_us.end(), worker.batch_us.begin(), worker.batch_us.end());
    request_us.insert(request_us.end(), worker.request_us.begin(), worker.request_us.end());
  }
  result.seconds = seconds_between(throughput_start, end);
  result.gbps = static_cast<double>(result.bytes) / result.seconds / 1e9;
  result.requests_per_s = static_cast<double>(result.requests) / result.seconds;
  result.latency_samples = request_us.size();
  std::sort(request_us.begin(), request_us.end());
  std::sort(batch_us.begin(), batch_us.end());
  result.p50_us = nearest_rank(request_us, 50);
  result.p99_us = nearest_rank(request_us, 99);
  result.batch_p50_us = nearest_rank(batch_us, 50);
  result.batch_p99_us = nearest_rank(batch_us, 99);
  if (auto error = verify(path, spec, seed, result.verified_bytes)) result.error = *error;
  return result;
}

// A one-thread run of `batch` blocks of `block` bytes (for sizing baseline buffers).
TransferRunSpec baseline_spec(uint64_t block, size_t batch) {
  TransferRunSpec spec;
  spec.block_bytes = block;
  spec.batch = batch;
  return spec;
}

bool same_path(const TransferPath& a, const TransferPath& b) {
  return a.kind == b.kind && a.ucx_tls == b.ucx_tls;
}

// Runs every run of one path (indexes `runs`) with one initiator engine restricted to that transport,
// moving data to and from `local` (registered with that engine for the duration).
void run_path(const TransferPath& spec, const std::vector<size_t>& runs, const TransferBenchOptions& options,
              const std::shared_ptr<transfer::MetadataService>& metadata, const std::string& engine_name,
              const std::string& segment, TargetProcess& target, std::byte* local, uint64_t local_bytes,
              uint64_t warm_bytes, TransferBenchReport& report) {
  auto fail_all = [&](const std::string& error) {
    for (size_t index : runs) {
      report.runs[index].spec = options.runs[index];
      report.runs[index].error = error;
      report.runs[index].working_set_bytes =
          run_working_set_bytes(options.runs[index], options.working_set_bytes);
    }
  };
  const std::string kind(transfer::transport_name(spec.kind));
  if (std::find(target.served().begin(), target.served().end(), kind) == target.served().end()) {
    auto why = target.unavailable().find(kind);
    return fail_all(fmt::format("the target cannot serve {}: {}", kind,
                                why == target.unavailable().end() ? "not started" : why->second));
  }
  transfer::EngineOptions engine_options{
      .name = engine_name, .metadata = metadata, .transports = {spec.kind}};
  engine_options.ucx.tls = spec.ucx_tls;
  Result<std::unique_ptr<TransferEngine>> engine = TransferEngine::create(engine_options);
  if (!engine.ok()) {
    return fail_all(fmt::format("cannot start a {} engine: {}", spec.label(), engine.status().message()));
  }
  Result<transfer::SegmentHandle> handle = (*engine)->open_segment(segment);
  if (!handle.ok()) return fail_all(handle.status().message());
  Result<TransportKind> picked = (*engine)->segment_transport(*handle);
  if (!picked.ok() || *picked != spec.kind) {
    return fail_all(fmt::format("open_segment picked {} instead of {}",
                                picked.ok() ? transfer::transport_name(*picked) : "nothing", kind));
  }
  if (Status registered = (*engine)->register_memory(local, local_bytes); !registered.ok()) {
    return fail_all(registered.message());
  }
  const PathContext context{.engine = engine->get(), .segment = *handle, .local = local, .target = &target};
  const bool writes = std::any_of(runs.begin(), runs.end(),
                                  [&](size_t index) { return options.runs[index].op == TransferOp::kWrite; });
  if (options.progress) {
    options.progress(fmt::format("{}: warm-up pass over {}", spec.label(), format_size(warm_bytes)));
  }
  if (auto error = warm_path(context, warm_bytes, writes)) return fail_all(*error);
  for (size_t index : runs) {
    const TransferRunSpec& run = options.runs[index];
    if (options.progress) {
      options.progress(fmt::format("[{}/{}] {}: {} {} x {}, {} thread(s)", index + 1, options.runs.size(),
                                   spec.label(), op_name(run.op), format_size(run.block_bytes), run.batch,
                                   run.threads));
    }
    report.runs[index] = run_one(context, run, options, 1000 * (index + 1));
  }
}

}  // namespace

std::string_view op_name(transfer::TransferOp op) {
  return op == TransferOp::kRead ? "read" : "write";
}

std::string TransferPath::label() const {
  if (kind != TransportKind::kUcx) return std::string(transfer::transport_name(kind));
  return fmt::format("ucx (tls {})", ucx_tls.empty() ? "default" : ucx_tls);
}

bool TransferPath::compares_to_tcp() const {
  if (kind == TransportKind::kTcp) return true;
  if (kind == TransportKind::kShm) return false;
  // UCX: over TCP only when every listed UCX transport is a TCP one.
  if (ucx_tls.empty()) return false;
  std::stringstream in(ucx_tls);
  for (std::string tl; std::getline(in, tl, ',');) {
    if (tl != "tcp" && tl != "self") return false;
  }
  return true;
}

uint64_t run_working_set_bytes(const TransferRunSpec& spec, uint64_t working_set_bytes) {
  const uint64_t threads = static_cast<uint64_t>(spec.threads);
  const uint64_t per_thread_round = spec.block_bytes * spec.batch;
  uint64_t partition = (working_set_bytes + threads - 1) / threads;
  partition = (partition + spec.block_bytes - 1) / spec.block_bytes * spec.block_bytes;
  partition = std::max(partition, per_thread_round);
  return partition * threads;
}

Result<TransferBenchReport> run_transfer_bench(const TransferBenchOptions& options) {
  const auto wall_start = Clock::now();
  IgnoreSigpipe ignore_sigpipe;
  StdoutToStderr quiet_stdout;
  TransferBenchReport report;
  report.runs.resize(options.runs.size());

  Result<TempDir> dir = create_bench_dir();
  if (!dir.ok()) return dir.status();
  Result<std::shared_ptr<transfer::MetadataService>> metadata =
      transfer::make_directory_metadata(dir->path());
  if (!metadata.ok()) return metadata.status();

  TransferTargetOptions target_options;
  target_options.metadata_dir = dir->path();
  target_options.engine_name = fmt::format("bench-{}-target", ::getpid());
  target_options.segment = fmt::format("bench-{}-target/segment", ::getpid());
  target_options.segment_bytes = options.working_set_bytes;
  for (const TransferRunSpec& run : options.runs) {
    target_options.segment_bytes =
        std::max(target_options.segment_bytes, run_working_set_bytes(run, options.working_set_bytes));
  }
  for (TransportKind kind : {TransportKind::kTcp, TransportKind::kShm, TransportKind::kUcx}) {
    if (std::any_of(options.runs.begin(), options.runs.end(),
                    [&](const TransferRunSpec& run) { return run.path.kind == kind; })) {
      target_options.transports.push_back(kind);
    }
  }
  if (target_options.transports.empty()) target_options.transports.push_back(TransportKind::kShm);
  // The target fills its segment while this process fills its own memory: first touches of fresh memory
  // are slow on some VMs (host-side faults, even after MAP_POPULATE), so nothing is timed before every
  // byte on both sides has been written once.
  if (options.progress) {
    options.progress(
        fmt::format("starting the target process ({} segment)", format_size(target_options.segment_bytes)));
  }
  Result<std::unique_ptr<TargetProcess>> target =
      TargetProcess::start(options.crescent_binary, target_options);
  if (!target.ok()) return target.status();
  report.target_pid = (*target)->pid();
  report.segment_bytes = target_options.segment_bytes;

  // Baselines, one per block size (1 MiB always: the goals' block size), before any engine runs. The batch
  // of a block size's baseline: the largest of its runs (64 for 1 MiB without runs).
  std::map<uint64_t, size_t> batch_of_block;
  for (const TransferRunSpec& run : options.runs) {
    size_t& batch = batch_of_block[run.block_bytes];
    batch = std::max(batch, run.batch);
  }
  batch_of_block.emplace(kMiB, 64);
  uint64_t local_bytes =
      target_options.segment_bytes;  // the initiator's memory: every run's working set fits
  for (const auto& [block, batch] : batch_of_block) {
    local_bytes =
        std::max(local_bytes, run_working_set_bytes(baseline_spec(block, batch), options.working_set_bytes));
  }
  Result<SharedBuffer> local = SharedBuffer::allocate(local_bytes);
  if (!local.ok()) return local.status();
  fill_pattern(local->data(), local_bytes, kPatternSeedInitiator);
  {
    Result<SharedBuffer> src = SharedBuffer::allocate(local_bytes);  // the baselines' source
    if (!src.ok()) return src.status();
    fill_pattern(src->data(), local_bytes, kPatternSeedTarget);
    if (Status ready = (*target)->wait_ready(std::chrono::seconds(120)); !ready.ok()) return ready;
    report.target_transports = (*target)->served();
    report.target_unavailable = (*target)->unavailable();
    for (const auto& [block, batch] : batch_of_block) {
      const uint64_t span = run_working_set_bytes(baseline_spec(block, batch), options.working_set_bytes);
      TransferBaseline baseline;
      baseline.block_bytes = block;
      baseline.batch = batch;
      if (options.progress)
        options.progress(fmt::format("baseline: memcpy, {} x {}", format_size(block), batch));
      baseline.memcpy_gbps =
          measure_memcpy_gbps(src->data(), local->data(), span, block, batch, options.seconds);
      if (options.progress)
        options.progress(fmt::format("baseline: loopback TCP, {} messages", format_size(block)));
      // The first baseline warms the whole span through the kernel once (see warm_path).
      const uint64_t warm = report.baselines.empty() ? span : block;
      Result<double> tcp =
          measure_tcp_loopback_gbps(src->data(), local->data(), span, block, 1, warm, options.seconds);
      if (tcp.ok()) {
        baseline.tcp_loopback_gbps = *tcp;
      } else {
        baseline.tcp_loopback_error = tcp.status().message();
      }
      if (options.loopback_streams > 1) {
        if (options.progress) {
          options.progress(fmt::format("baseline: loopback TCP, {} sockets, {} messages",
                                       options.loopback_streams, format_size(block)));
        }
        Result<double> parallel = measure_tcp_loopback_gbps(src->data(), local->data(), span, block,
                                                            options.loopback_streams, block, options.seconds);
        if (parallel.ok()) {
          baseline.tcp_loopback_streams_gbps = *parallel;
        } else if (baseline.tcp_loopback_error.empty()) {
          baseline.tcp_loopback_error = parallel.status().message();
        }
      }
      report.baselines.push_back(baseline);
    }
  }

  // Runs, grouped by path: one initiator engine per path, restricted to its transport.
  std::vector<std::pair<TransferPath, std::vector<size_t>>> paths;
  for (size_t i = 0; i < options.runs.size(); ++i) {
    auto it = std::find_if(paths.begin(), paths.end(),
                           [&](const auto& p) { return same_path(p.first, options.runs[i].path); });
    if (it == paths.end()) {
      paths.push_back({options.runs[i].path, {i}});
    } else {
      it->second.push_back(i);
    }
  }
  for (size_t p = 0; p < paths.size(); ++p) {
    run_path(paths[p].first, paths[p].second, options, *metadata,
             fmt::format("bench-{}-initiator-{}", ::getpid(), p), target_options.segment, **target,
             local->data(), local_bytes, target_options.segment_bytes, report);
  }
  (*target)->stop();
  report.wall_seconds = seconds_between(wall_start, Clock::now());
  return report;
}

Status run_transfer_target(const TransferTargetOptions& options) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the bench (also set before exec)
  // The control channel is the original stdout; libraries' output on fd 1 goes to stderr.
  StdoutToStderr quiet_stdout;
  FILE* control = quiet_stdout.saved() >= 0 ? ::fdopen(::dup(quiet_stdout.saved()), "w") : nullptr;
  if (control == nullptr) return Status::io_error("bench target process: no control channel (stdout)");
  auto say = [control](const std::string& line) {
    std::fputs((line + "\n").c_str(), control);
    std::fflush(control);
  };
  auto fail = [&](const std::string& message) {
    say(nlohmann::json{{"ready", false}, {"error", message}}.dump());
    std::fclose(control);
    return Status::unavailable(message);
  };
  Result<std::shared_ptr<transfer::MetadataService>> metadata =
      transfer::make_directory_metadata(options.metadata_dir);
  if (!metadata.ok()) return fail(metadata.status().message());
  auto make_options = [&](const std::string& name, std::vector<TransportKind> transports) {
    transfer::EngineOptions engine_options{
        .name = name, .metadata = *metadata, .transports = std::move(transports)};
    engine_options.ucx.tls = options.ucx_tls;
    return engine_options;
  };
  nlohmann::json unavailable = nlohmann::json::object();
  Result<std::unique_ptr<TransferEngine>> engine =
      TransferEngine::create(make_options(options.engine_name, options.transports));
  if (!engine.ok() && options.transports.size() > 1) {
    // Serve what can start: probe each transport alone and keep the ones that work.
    std::vector<TransportKind> working;
    for (TransportKind kind : options.transports) {
      const std::string kind_name(transfer::transport_name(kind));
      Result<std::unique_ptr<TransferEngine>> probe =
          TransferEngine::create(make_options(options.engine_name + "-probe-" + kind_name, {kind}));
      if (probe.ok()) {
        working.push_back(kind);
      } else {
        unavailable[kind_name] = probe.status().message();
      }
    }
    if (!working.empty()) engine = TransferEngine::create(make_options(options.engine_name, working));
  } else if (!engine.ok()) {
    unavailable[std::string(transfer::transport_name(options.transports[0]))] = engine.status().message();
  }
  if (!engine.ok()) return fail(fmt::format("no transport can serve the segment: {}", unavailable.dump()));
  Result<void*> memory = (*engine)->allocate_memory(options.segment_bytes);
  if (!memory.ok()) return fail(memory.status().message());
  auto* data = static_cast<std::byte*>(*memory);
  fill_pattern(data, options.segment_bytes, kPatternSeedTarget);
  if (Status exposed = (*engine)->expose_segment(options.segment, data, options.segment_bytes);
      !exposed.ok()) {
    return fail(exposed.message());
  }
  nlohmann::json served = nlohmann::json::array();
  for (TransportKind kind : options.transports) {
    if (!unavailable.contains(std::string(transfer::transport_name(kind)))) {
      served.push_back(transfer::transport_name(kind));
    }
  }
  say(nlohmann::json{{"ready", true}, {"pid", ::getpid()}, {"served", served}, {"unavailable", unavailable}}
          .dump());
  for (std::string line; std::getline(std::cin, line);) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    if (command == "exit") break;
    uint64_t offset = 0;
    uint64_t length = 0;
    if (command != "sum" || !(in >> offset >> length) || offset > options.segment_bytes ||
        length > options.segment_bytes - offset) {
      say("error: bad command '" + line + "'");
      continue;
    }
    say(fmt::format("sum {:x}", XXH3_64bits(data + offset, length)));
  }
  std::fclose(control);
  return Status();
}

}  // namespace crescent::bench
