// The UCX transport through the public TransferEngine API, over UCX's tcp transport and over its shared
// memory transports. Two-process tests start the peer by fork + exec of this binary (running the disabled
// test UcxChildProcess.DISABLED_Serve): a plain fork() would copy UCX's state (its async thread, locks held
// by other threads) into a child that then starts UCX again, which UCX does not support.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test_support/temp_dir.h"
#include "transfer/transfer_engine.h"

extern char** environ;

namespace crescent::transfer {
namespace {

using namespace std::chrono_literals;
using Ms = std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// The shared-memory set: UCX 1.13 reaches a same-host peer through sysv (am) and posix lanes with it.
constexpr const char* kShmTls = "posix,sysv,cma,self";
constexpr const char* kChildEnv = "CRESCENT_UCX_TEST_CHILD";
constexpr size_t kMiB = 1 << 20;

#define EXPECT_OK(expr)                                      \
  do {                                                       \
    const ::crescent::Status _st = (expr);                   \
    EXPECT_TRUE(_st.ok()) << #expr << ": " << _st.message(); \
  } while (0)
#define ASSERT_OK(expr)                                      \
  do {                                                       \
    const ::crescent::Status _st = (expr);                   \
    ASSERT_TRUE(_st.ok()) << #expr << ": " << _st.message(); \
  } while (0)

// Deterministic contents: byte `position` of the pattern `seed`.
uint64_t mix(uint64_t seed, uint64_t word) {
  uint64_t x = word * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull + 1;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return x;
}

void fill_pattern(std::byte* out, uint64_t seed, uint64_t position, size_t length) {
  uint64_t word = mix(seed, position / 8);
  for (size_t i = 0; i < length; ++i, ++position) {
    if (position % 8 == 0) word = mix(seed, position / 8);
    out[i] = static_cast<std::byte>(word >> (8 * (position % 8)));
  }
}

std::vector<std::byte> pattern(uint64_t seed, uint64_t position, size_t length) {
  std::vector<std::byte> bytes(length);
  fill_pattern(bytes.data(), seed, position, length);
  return bytes;
}

EngineOptions ucx_options(const std::string& name, std::shared_ptr<MetadataService> metadata,
                          const std::string& tls) {
  EngineOptions options;
  options.name = name;
  options.metadata = std::move(metadata);
  options.transports = {TransportKind::kUcx};
  options.ucx.tls = tls;
  return options;
}

std::string tls_label(const ::testing::TestParamInfo<std::string>& info) {
  return info.param == "tcp" ? "tcp" : "shm";
}

struct BatchResult {
  BatchSummary summary;
  std::vector<TransferStatus> statuses;
  std::string first_error() const {
    for (const auto& status : statuses) {
      if (status.state == TransferState::kFailed) return status.error;
    }
    return "";
  }
};

// Submits `requests` as one batch, waits, and collects every status.
BatchResult run_batch(TransferEngine& engine, const std::vector<TransferRequest>& requests,
                      Ms timeout = Ms(30000)) {
  BatchResult result;
  Result<BatchId> batch = engine.allocate_batch(requests.size());
  EXPECT_TRUE(batch.ok()) << batch.status().message();
  if (!batch.ok()) return result;
  Status submitted = engine.submit(*batch, requests);
  EXPECT_TRUE(submitted.ok()) << submitted.message();
  Result<BatchSummary> summary = engine.wait(*batch, timeout);
  EXPECT_TRUE(summary.ok());
  if (summary.ok()) result.summary = *summary;
  for (size_t i = 0; i < result.summary.submitted; ++i)
    result.statuses.push_back(engine.status(*batch, i).value());
  if (result.summary.pending() == 0) EXPECT_OK(engine.free_batch(*batch));
  return result;
}

// Allocates `bytes` in `engine`, fills them with pattern `seed` and exposes them as `segment`.
std::byte* expose_pattern(TransferEngine& engine, const std::string& segment, size_t bytes, uint64_t seed) {
  Result<void*> memory = engine.allocate_memory(bytes);
  EXPECT_TRUE(memory.ok()) << memory.status().message();
  if (!memory.ok()) return nullptr;
  auto* base = static_cast<std::byte*>(*memory);
  fill_pattern(base, seed, 0, bytes);
  EXPECT_OK(engine.expose_segment(segment, base, bytes));
  return base;
}

// Sizes from 1 B to 64 MiB: the edges, sizes around the transport's 4 MiB operation size, and random ones
// spread evenly over the orders of magnitude.
std::vector<size_t> test_sizes(std::mt19937_64& rng) {
  std::vector<size_t> sizes = {
      1, 2, 3, 511, 4097, 65535, kMiB + 1, 4 * kMiB, 4 * kMiB + 7, 9 * kMiB - 3, 64 * kMiB};
  std::uniform_real_distribution<double> log_size(0.0, std::log2(64.0 * kMiB));
  for (int i = 0; i < 6; ++i)
    sizes.push_back(std::max<size_t>(1, static_cast<size_t>(std::exp2(log_size(rng)))));
  return sizes;
}

// ---------------------------------------------------------------------------------------------------------
// The peer process of the two-process tests.

// Spec: dir|engine|segment|tls|bytes|seed|ready_fd|control_fd.
int serve_as_child(const std::string& spec) {
  std::vector<std::string> fields;
  size_t start = 0;
  for (size_t bar; (bar = spec.find('|', start)) != std::string::npos; start = bar + 1) {
    fields.push_back(spec.substr(start, bar - start));
  }
  fields.push_back(spec.substr(start));
  if (fields.size() != 8) return 3;
  const int ready_fd = std::stoi(fields[6]);
  const int control_fd = std::stoi(fields[7]);
  auto fail = [&](const std::string& message) {
    const std::string line = "E" + message;
    [[maybe_unused]] ssize_t written = ::write(ready_fd, line.data(), line.size());
    return 2;
  };
  Result<std::shared_ptr<MetadataService>> metadata = make_directory_metadata(fields[0]);
  if (!metadata.ok()) return fail(metadata.status().message());
  Result<std::unique_ptr<TransferEngine>> engine =
      TransferEngine::create(ucx_options(fields[1], *metadata, fields[3]));
  if (!engine.ok()) return fail(engine.status().message());
  const size_t bytes = std::stoull(fields[4]);
  Result<void*> memory = (*engine)->allocate_memory(bytes);
  if (!memory.ok()) return fail(memory.status().message());
  fill_pattern(static_cast<std::byte*>(*memory), std::stoull(fields[5]), 0, bytes);
  Status exposed = (*engine)->expose_segment(fields[2], *memory, bytes);
  if (!exposed.ok()) return fail(exposed.message());
  [[maybe_unused]] ssize_t written = ::write(ready_fd, "R", 1);
  ::close(ready_fd);
  // Serve until the parent closes the control pipe (or kills this process).
  char byte;
  while (::read(control_fd, &byte, 1) != 0) {
    if (errno != EINTR) break;
  }
  engine->reset();
  return 0;
}

TEST(UcxChildProcess, DISABLED_Serve) {
  const char* spec = std::getenv(kChildEnv);
  if (spec == nullptr) GTEST_SKIP() << "runs only in a peer process started by the two-process tests";
  std::fflush(nullptr);
  ::_exit(serve_as_child(spec));
}

// A peer process serving one segment of pattern `seed`.
class ChildServer {
 public:
  ChildServer(const std::string& dir, const std::string& engine, const std::string& segment,
              const std::string& tls, size_t bytes, uint64_t seed) {
    int ready[2];
    int control[2];
    if (::pipe2(ready, O_CLOEXEC) != 0 || ::pipe2(control, O_CLOEXEC) != 0) {
      error_ = "pipe2 failed";
      return;
    }
    // Everything the child needs is prepared before fork(): between fork and exec only async-signal-safe
    // calls are allowed in a multi-threaded parent.
    char self[4096] = {};
    const ssize_t self_length = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (self_length <= 0) {
      error_ = "readlink /proc/self/exe failed";
      return;
    }
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "GTEST_OUTPUT=", 13) != 0) env_strings.emplace_back(*e);
    }
    env_strings.push_back(fmt::format("{}={}|{}|{}|{}|{}|{}|{}|{}", kChildEnv, dir, engine, segment, tls,
                                      bytes, seed, ready[1], control[0]));
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string filter = "--gtest_filter=UcxChildProcess.DISABLED_Serve";
    std::string also_disabled = "--gtest_also_run_disabled_tests";
    std::vector<char*> argv = {self, filter.data(), also_disabled.data(), nullptr};
    const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::fcntl(ready[1], F_SETFD, 0);
      ::fcntl(control[0], F_SETFD, 0);
      if (devnull >= 0) ::dup2(devnull, STDOUT_FILENO);  // gtest's chatter; UCX's stderr stays visible
      ::execve(self, argv.data(), envp.data());
      ::_exit(127);
    }
    if (devnull >= 0) ::close(devnull);
    ::close(ready[1]);
    ::close(control[0]);
    control_fd_ = control[1];
    if (pid_ < 0) {
      error_ = "fork failed";
      ::close(ready[0]);
      return;
    }
    pollfd p{.fd = ready[0], .events = POLLIN, .revents = 0};
    char reply[1024] = {};
    if (::poll(&p, 1, 20000) != 1) {
      error_ = "peer process not ready after 20 s";
    } else {
      const ssize_t n = ::read(ready[0], reply, sizeof(reply) - 1);
      if (n <= 0 || reply[0] != 'R') error_ = n > 1 ? std::string(reply + 1) : "peer process died";
    }
    ::close(ready[0]);
  }

  ~ChildServer() { stop(); }

  const std::string& error() const { return error_; }
  pid_t pid() const { return pid_; }
  // Stops the peer and returns once it is stopped (SIGSTOP takes effect asynchronously).
  void freeze() const {
    ::kill(pid_, SIGSTOP);
    int status = 0;
    ::waitpid(pid_, &status, WUNTRACED);
  }
  void thaw() const { ::kill(pid_, SIGCONT); }

  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // Asks the peer to exit (closing the control pipe); kills it if it has not within 10 s.
  void stop() {
    if (control_fd_ >= 0) ::close(control_fd_);
    control_fd_ = -1;
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    const auto give_up = SteadyClock::now() + 10s;
    while (SteadyClock::now() < give_up) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(10ms);
    }
    kill_now();
  }

 private:
  pid_t pid_ = -1;
  int control_fd_ = -1;
  std::string error_;
};

// ---------------------------------------------------------------------------------------------------------
// One process, two or more engines.

class UcxInProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<TransferEngine> make_engine(const std::string& name, int max_endpoints = 256) {
    EngineOptions options = ucx_options(name, metadata_, GetParam());
    options.failure.max_endpoints = max_endpoints;
    Result<std::unique_ptr<TransferEngine>> engine = TransferEngine::create(std::move(options));
    EXPECT_TRUE(engine.ok()) << engine.status().message();
    return engine.ok() ? std::move(engine).value() : nullptr;
  }

  std::shared_ptr<MetadataService> metadata_ = make_in_process_metadata();
};

TEST_P(UcxInProcessTest, ReadsAndWritesRandomSizesWithUnalignedOffsets) {
  auto target = make_engine("target");
  auto initiator = make_engine("initiator");
  ASSERT_TRUE(target && initiator);
  const size_t segment_bytes = 64 * kMiB + 64 * 1024;
  std::byte* remote = expose_pattern(*target, "kv", segment_bytes, 1);
  ASSERT_NE(remote, nullptr);
  Result<SegmentHandle> handle = initiator->open_segment("kv");
  ASSERT_TRUE(handle.ok()) << handle.status().message();
  EXPECT_EQ(initiator->segment_transport(*handle).value(), TransportKind::kUcx);
  const size_t local_bytes = 64 * kMiB + 64 * 1024;
  auto* local = static_cast<std::byte*>(initiator->allocate_memory(local_bytes).value());

  std::mt19937_64 rng(42);
  const std::vector<size_t> sizes = test_sizes(rng);
  uint64_t expected_bytes = 0;
  for (size_t size : sizes) {
    const uint64_t offset = std::uniform_int_distribution<uint64_t>(0, segment_bytes - size)(rng);
    std::byte* into = local + std::uniform_int_distribution<size_t>(0, local_bytes - size)(rng);
    BatchResult read = run_batch(*initiator, {{.op = TransferOp::kRead,
                                               .local_address = into,
                                               .segment = *handle,
                                               .offset_bytes = offset,
                                               .length_bytes = size}});
    ASSERT_EQ(read.summary.completed, 1u)
        << "read of " << size << " at " << offset << ": " << read.first_error();
    ASSERT_EQ(std::memcmp(into, pattern(1, offset, size).data(), size), 0) << size << " bytes at " << offset;
    expected_bytes += size;
  }
  for (size_t size : sizes) {
    const uint64_t offset = std::uniform_int_distribution<uint64_t>(0, segment_bytes - size)(rng);
    std::byte* from = local + std::uniform_int_distribution<size_t>(0, local_bytes - size)(rng);
    fill_pattern(from, 2 + size, 0, size);
    BatchResult write = run_batch(*initiator, {{.op = TransferOp::kWrite,
                                                .local_address = from,
                                                .segment = *handle,
                                                .offset_bytes = offset,
                                                .length_bytes = size}});
    ASSERT_EQ(write.summary.completed, 1u)
        << "write of " << size << " at " << offset << ": " << write.first_error();
    // A completed write is in the target's memory (remote completion), not merely sent.
    ASSERT_EQ(std::memcmp(remote + offset, from, size), 0) << size << " bytes at " << offset;
    expected_bytes += size;
  }
  EXPECT_EQ(initiator->stats().bytes_transferred, expected_bytes);
  EXPECT_EQ(initiator->stats().requests_failed, 0u);
}

TEST_P(UcxInProcessTest, BatchOf1024SmallRequests) {
  auto target = make_engine("target");
  auto initiator = make_engine("initiator");
  ASSERT_TRUE(target && initiator);
  constexpr size_t kRequests = 1024;
  constexpr size_t kSlot = 4096;
  const size_t segment_bytes = 2 * kRequests * kSlot;  // reads from the first half, writes to the second
  std::byte* remote = expose_pattern(*target, "kv", segment_bytes, 3);
  ASSERT_NE(remote, nullptr);
  SegmentHandle handle = initiator->open_segment("kv").value();
  auto* local = static_cast<std::byte*>(initiator->allocate_memory(kRequests * kSlot).value());
  fill_pattern(local, 4, 0, kRequests * kSlot);

  std::mt19937_64 rng(7);
  std::vector<TransferRequest> requests;
  std::vector<std::pair<uint64_t, size_t>> ranges;  // request i: its offset in the segment and length
  uint64_t total = 0;
  for (size_t i = 0; i < kRequests; ++i) {
    const size_t length = std::uniform_int_distribution<size_t>(1, kSlot - 1)(rng);
    const size_t skew = std::uniform_int_distribution<size_t>(0, kSlot - length)(rng);
    const bool read = i % 2 == 0;
    const uint64_t offset = (read ? 0 : kRequests * kSlot) + i * kSlot + skew;
    requests.push_back({.op = read ? TransferOp::kRead : TransferOp::kWrite,
                        .local_address = local + i * kSlot + skew,
                        .segment = handle,
                        .offset_bytes = offset,
                        .length_bytes = length});
    ranges.emplace_back(offset, length);
    total += length;
  }
  std::vector<std::byte> written(local, local + kRequests * kSlot);  // what the writes send
  BatchResult result = run_batch(*initiator, requests);
  ASSERT_EQ(result.summary.completed, kRequests) << result.first_error();
  for (size_t i = 0; i < kRequests; ++i) {
    const auto [offset, length] = ranges[i];
    const std::byte* local_bytes = local + (i * kSlot) + (offset % kSlot);
    if (i % 2 == 0) {
      ASSERT_EQ(std::memcmp(local_bytes, pattern(3, offset, length).data(), length), 0) << "read " << i;
    } else {
      ASSERT_EQ(std::memcmp(remote + offset, written.data() + (local_bytes - local), length), 0)
          << "write " << i;
    }
  }
  EXPECT_EQ(initiator->stats().bytes_transferred, total);
}

TEST_P(UcxInProcessTest, EngineReadsAndWritesItsOwnSegment) {
  auto engine = make_engine("solo");
  ASSERT_TRUE(engine);
  std::byte* remote = expose_pattern(*engine, "own", 4 * kMiB, 5);
  ASSERT_NE(remote, nullptr);
  SegmentHandle handle = engine->open_segment("own").value();
  auto* local = static_cast<std::byte*>(engine->allocate_memory(2 * kMiB).value());
  BatchResult read = run_batch(*engine, {{.op = TransferOp::kRead,
                                          .local_address = local + 3,
                                          .segment = handle,
                                          .offset_bytes = 12345,
                                          .length_bytes = kMiB + 17}});
  ASSERT_EQ(read.summary.completed, 1u) << read.first_error();
  EXPECT_EQ(std::memcmp(local + 3, pattern(5, 12345, kMiB + 17).data(), kMiB + 17), 0);
  fill_pattern(local, 6, 0, 1000);
  BatchResult write = run_batch(*engine, {{.op = TransferOp::kWrite,
                                           .local_address = local,
                                           .segment = handle,
                                           .offset_bytes = 3 * kMiB + 1,
                                           .length_bytes = 1000}});
  ASSERT_EQ(write.summary.completed, 1u) << write.first_error();
  EXPECT_EQ(std::memcmp(remote + 3 * kMiB + 1, local, 1000), 0);
}

TEST_P(UcxInProcessTest, EndpointCapClosesIdleEndpoints) {
  auto first = make_engine("first");
  auto second = make_engine("second");
  auto initiator = make_engine("initiator", /*max_endpoints=*/1);
  ASSERT_TRUE(first && second && initiator);
  ASSERT_NE(expose_pattern(*first, "a", kMiB, 10), nullptr);
  ASSERT_NE(expose_pattern(*second, "b", kMiB, 11), nullptr);
  SegmentHandle a = initiator->open_segment("a").value();
  SegmentHandle b = initiator->open_segment("b").value();  // the endpoint to "first" is idle: closed
  EXPECT_EQ(initiator->stats().endpoints_evicted, 1u);
  auto* local = static_cast<std::byte*>(initiator->allocate_memory(kMiB).value());
  for (int round = 0; round < 3; ++round) {
    for (auto [handle, seed] : {std::pair{a, 10}, std::pair{b, 11}}) {
      const uint64_t offset = 1000 * round + 1;
      BatchResult read = run_batch(*initiator, {{.op = TransferOp::kRead,
                                                 .local_address = local,
                                                 .segment = handle,
                                                 .offset_bytes = offset,
                                                 .length_bytes = 100000}});
      ASSERT_EQ(read.summary.completed, 1u) << read.first_error();
      ASSERT_EQ(std::memcmp(local, pattern(seed, offset, 100000).data(), 100000), 0);
    }
  }
  EXPECT_EQ(initiator->stats().endpoints_evicted, 7u);  // every switch of peer closes the other endpoint
  // Both peers at once: the cap is exceeded while both endpoints are busy, and restored when they idle.
  std::vector<TransferRequest> both;
  for (int i = 0; i < 8; ++i) {
    both.push_back({.op = TransferOp::kRead,
                    .local_address = local + i * 100000,
                    .segment = i % 2 ? b : a,
                    .offset_bytes = static_cast<uint64_t>(i),
                    .length_bytes = 100000});
  }
  BatchResult result = run_batch(*initiator, both);
  ASSERT_EQ(result.summary.completed, both.size()) << result.first_error();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(std::memcmp(local + i * 100000, pattern(i % 2 ? 11 : 10, i, 100000).data(), 100000), 0) << i;
  }
}

TEST_P(UcxInProcessTest, BadRequestsAreRefusedAtSubmit) {
  auto target = make_engine("target");
  auto initiator = make_engine("initiator");
  ASSERT_TRUE(target && initiator);
  ASSERT_NE(expose_pattern(*target, "kv", 64 * 1024, 12), nullptr);
  SegmentHandle handle = initiator->open_segment("kv").value();
  EXPECT_EQ(initiator->segment_transport(handle).value(), TransportKind::kUcx);
  auto* local = static_cast<std::byte*>(initiator->allocate_memory(64 * 1024).value());
  BatchId batch = initiator->allocate_batch(4).value();
  const std::vector<TransferRequest> bad = {
      {.op = TransferOp::kRead,
       .local_address = local,
       .segment = handle,
       .offset_bytes = 64 * 1024 - 10,
       .length_bytes = 20},
      {.op = TransferOp::kRead,
       .local_address = local,
       .segment = handle + 1000,
       .offset_bytes = 0,
       .length_bytes = 20},
      {.op = TransferOp::kWrite,
       .local_address = local,
       .segment = handle,
       .offset_bytes = 0,
       .length_bytes = 0},
      {.op = TransferOp::kWrite,
       .local_address = local,
       .segment = handle,
       .offset_bytes = ~0ull - 4,
       .length_bytes = 10},
  };
  for (const TransferRequest& request : bad) {
    const TransferRequest ok = {.op = TransferOp::kRead,
                                .local_address = local,
                                .segment = handle,
                                .offset_bytes = 0,
                                .length_bytes = 10};
    const std::vector<TransferRequest> requests = {ok, request};
    Status submitted = initiator->submit(batch, requests);
    EXPECT_EQ(submitted.code(), StatusCode::kInvalidArgument) << submitted.message();
    EXPECT_NE(submitted.message().find("request 1"), std::string::npos) << submitted.message();
  }
  EXPECT_EQ(initiator->wait(batch, Ms(0)).value().submitted, 0u);  // none of them went out
  EXPECT_EQ(initiator->stats().requests_completed + initiator->stats().requests_failed, 0u);
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxInProcessTest, ::testing::Values(std::string("tcp"), std::string(kShmTls)),
                         tls_label);

TEST(UcxTransport, UnknownTlsFailsEngineCreation) {
  Result<std::unique_ptr<TransferEngine>> engine =
      TransferEngine::create(ucx_options("bad", make_in_process_metadata(), "no_such_transport"));
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(engine.status().message().find("no_such_transport"), std::string::npos)
      << engine.status().message();
}

// ---------------------------------------------------------------------------------------------------------
// Two processes: this one initiates, a child process serves.

class UcxTwoProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_FALSE(temp_.path().empty());
    dir_ = temp_.path();
    Result<std::shared_ptr<MetadataService>> metadata = make_directory_metadata(dir_);
    ASSERT_TRUE(metadata.ok()) << metadata.status().message();
    metadata_ = *metadata;
  }
  void TearDown() override { children_.clear(); }

  ChildServer* spawn(const std::string& engine, const std::string& segment, size_t bytes, uint64_t seed) {
    children_.push_back(std::make_unique<ChildServer>(dir_, engine, segment, GetParam(), bytes, seed));
    ChildServer* child = children_.back().get();
    EXPECT_EQ(child->error(), "");
    return child->error().empty() ? child : nullptr;
  }

  std::unique_ptr<TransferEngine> make_engine(const std::string& name, Ms request_timeout = Ms(10000),
                                              Ms path_cooldown = Ms(1000)) {
    EngineOptions options = ucx_options(name, metadata_, GetParam());
    options.failure.request_timeout = request_timeout;
    options.failure.path_cooldown = path_cooldown;
    Result<std::unique_ptr<TransferEngine>> engine = TransferEngine::create(std::move(options));
    EXPECT_TRUE(engine.ok()) << engine.status().message();
    return engine.ok() ? std::move(engine).value() : nullptr;
  }

  test::TempDir temp_{"crescent-ucx-test"};  // declared first: removed after everything that uses it
  std::string dir_;                          // temp_'s
  std::shared_ptr<MetadataService> metadata_;
  std::vector<std::unique_ptr<ChildServer>> children_;
};

TEST_P(UcxTwoProcessTest, ReadsAndWritesRandomSizesWithUnalignedOffsets) {
  const size_t segment_bytes = 64 * kMiB + 64 * 1024;
  ASSERT_NE(spawn("server", "kv", segment_bytes, 21), nullptr);
  auto engine = make_engine("client");
  ASSERT_TRUE(engine);
  Result<SegmentHandle> handle = engine->open_segment("kv");
  ASSERT_TRUE(handle.ok()) << handle.status().message();
  const size_t local_bytes = 64 * kMiB + 64 * 1024;
  auto* local = static_cast<std::byte*>(engine->allocate_memory(local_bytes).value());
  auto* back = static_cast<std::byte*>(engine->allocate_memory(local_bytes).value());

  std::mt19937_64 rng(43);
  for (size_t size : test_sizes(rng)) {
    const uint64_t offset = std::uniform_int_distribution<uint64_t>(0, segment_bytes - size)(rng);
    std::byte* into = local + std::uniform_int_distribution<size_t>(0, local_bytes - size)(rng);
    BatchResult read = run_batch(*engine, {{.op = TransferOp::kRead,
                                            .local_address = into,
                                            .segment = *handle,
                                            .offset_bytes = offset,
                                            .length_bytes = size}});
    ASSERT_EQ(read.summary.completed, 1u)
        << "read of " << size << " at " << offset << ": " << read.first_error();
    ASSERT_EQ(std::memcmp(into, pattern(21, offset, size).data(), size), 0) << size << " bytes at " << offset;

    // Write different bytes to another random range, then read them back into other memory.
    const uint64_t write_offset = std::uniform_int_distribution<uint64_t>(0, segment_bytes - size)(rng);
    fill_pattern(into, 1000 + size, 0, size);
    std::byte* check = back + (into - local);
    BatchResult write = run_batch(*engine, {{.op = TransferOp::kWrite,
                                             .local_address = into,
                                             .segment = *handle,
                                             .offset_bytes = write_offset,
                                             .length_bytes = size}});
    ASSERT_EQ(write.summary.completed, 1u) << "write of " << size << ": " << write.first_error();
    BatchResult reread = run_batch(*engine, {{.op = TransferOp::kRead,
                                              .local_address = check,
                                              .segment = *handle,
                                              .offset_bytes = write_offset,
                                              .length_bytes = size}});
    ASSERT_EQ(reread.summary.completed, 1u) << reread.first_error();
    ASSERT_EQ(std::memcmp(check, into, size), 0) << size << " bytes written at " << write_offset;
    // Put the original bytes back so later reads of this range see the pattern.
    fill_pattern(into, 21, write_offset, size);
    ASSERT_EQ(run_batch(*engine, {{.op = TransferOp::kWrite,
                                   .local_address = into,
                                   .segment = *handle,
                                   .offset_bytes = write_offset,
                                   .length_bytes = size}})
                  .summary.completed,
              1u);
  }
  EXPECT_EQ(engine->stats().requests_failed, 0u);
}

TEST_P(UcxTwoProcessTest, BatchOf1024SmallReads) {
  ASSERT_NE(spawn("server", "kv", 8 * kMiB, 22), nullptr);
  auto engine = make_engine("client");
  ASSERT_TRUE(engine);
  SegmentHandle handle = engine->open_segment("kv").value();
  auto* local = static_cast<std::byte*>(engine->allocate_memory(4 * kMiB).value());
  std::mt19937_64 rng(8);
  std::vector<TransferRequest> requests;
  for (size_t i = 0; i < 1024; ++i) {
    requests.push_back({.op = TransferOp::kRead,
                        .local_address = local + i * 4096,
                        .segment = handle,
                        .offset_bytes = std::uniform_int_distribution<uint64_t>(0, 8 * kMiB - 4096)(rng),
                        .length_bytes = std::uniform_int_distribution<uint64_t>(1, 4096)(rng)});
  }
  BatchResult result = run_batch(*engine, requests);
  ASSERT_EQ(result.summary.completed, requests.size()) << result.first_error();
  for (const TransferRequest& r : requests) {
    ASSERT_EQ(
        std::memcmp(r.local_address, pattern(22, r.offset_bytes, r.length_bytes).data(), r.length_bytes), 0);
  }
}

TEST_P(UcxTwoProcessTest, KilledPeerFailsPendingRequestsAndEngineServesOthers) {
  constexpr Ms kTimeout(2000);
  ChildServer* doomed = spawn("doomed", "a", 16 * kMiB, 31);
  ASSERT_NE(doomed, nullptr);
  auto engine = make_engine("client", kTimeout);
  ASSERT_TRUE(engine);
  SegmentHandle a = engine->open_segment("a").value();
  auto* local = static_cast<std::byte*>(engine->allocate_memory(16 * kMiB).value());

  // Stopped, the peer cannot serve (RMA is emulated in software and needs its worker), so the requests
  // are certainly still pending when it dies.
  doomed->freeze();
  std::vector<TransferRequest> requests;
  for (int i = 0; i < 16; ++i) {
    requests.push_back({.op = i % 4 == 3 ? TransferOp::kWrite : TransferOp::kRead,
                        .local_address = local + i * kMiB,
                        .segment = a,
                        .offset_bytes = static_cast<uint64_t>(i) * kMiB + 1,
                        .length_bytes = kMiB - 1});
  }
  BatchId batch = engine->allocate_batch(requests.size()).value();
  ASSERT_OK(engine->submit(batch, requests));
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(engine->wait(batch, Ms(0)).value().pending(), requests.size());
  const auto killed = SteadyClock::now();
  doomed->kill_now();
  BatchSummary summary = engine->wait(batch, kTimeout + Ms(1500)).value();
  const auto elapsed = std::chrono::duration_cast<Ms>(SteadyClock::now() - killed);
  EXPECT_EQ(summary.failed, requests.size());
  EXPECT_LE(elapsed, kTimeout + Ms(1500));
  std::cout << "[   INFO   ] pending requests failed " << elapsed.count()
            << " ms after the peer was killed\n";
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferStatus status = engine->status(batch, i).value();
    ASSERT_EQ(status.state, TransferState::kFailed);
    EXPECT_NE(status.error.find("'doomed'"), std::string::npos) << status.error;
    EXPECT_NE(status.error.find("segment 'a'"), std::string::npos) << status.error;
    EXPECT_NE(status.error.find("UCX"), std::string::npos) << status.error;
  }
  EXPECT_OK(engine->free_batch(batch));

  // A new request to the dead peer fails rather than hangs.
  BatchResult again = run_batch(*engine, {requests[0]}, kTimeout + Ms(1500));
  EXPECT_EQ(again.summary.failed, 1u);

  // The engine still works with another peer.
  ASSERT_NE(spawn("survivor", "b", 4 * kMiB, 32), nullptr);
  SegmentHandle b = engine->open_segment("b").value();
  BatchResult read = run_batch(*engine, {{.op = TransferOp::kRead,
                                          .local_address = local + 5,
                                          .segment = b,
                                          .offset_bytes = 777,
                                          .length_bytes = 3 * kMiB}});
  ASSERT_EQ(read.summary.completed, 1u) << read.first_error();
  EXPECT_EQ(std::memcmp(local + 5, pattern(32, 777, 3 * kMiB).data(), 3 * kMiB), 0);
}

TEST_P(UcxTwoProcessTest, FailedPeerIsAvoidedForPathCooldownAndRestartedPeerWorksAfterwards) {
  constexpr Ms kTimeout(5000);
  constexpr Ms kCooldown(3000);
  ChildServer* doomed = spawn("phoenix", "a", 4 * kMiB, 61);
  ASSERT_NE(doomed, nullptr);
  auto engine = make_engine("client", kTimeout, kCooldown);
  ASSERT_TRUE(engine);
  SegmentHandle a = engine->open_segment("a").value();
  auto* local = static_cast<std::byte*>(engine->allocate_memory(4 * kMiB).value());
  const TransferRequest read_a{
      .op = TransferOp::kRead, .local_address = local, .segment = a, .offset_bytes = 5, .length_bytes = kMiB};
  BatchResult before = run_batch(*engine, {read_a});
  ASSERT_EQ(before.summary.completed, 1u) << before.first_error();

  // The first request after the kill fails through the peer's failure (pidfd, UCX error) or, when that was
  // seen first, through the cool-down it starts; either way the peer is cooling down once it has failed.
  doomed->kill_now();
  BatchResult first = run_batch(*engine, {read_a}, kTimeout + Ms(1500));
  ASSERT_EQ(first.summary.failed, 1u);
  const auto failed_at = SteadyClock::now();

  // Requests during the cool-down fail at once, naming the peer, the segment and the failure.
  for (int i = 0; i < 3; ++i) {
    const auto start = SteadyClock::now();
    BatchResult cooled = run_batch(*engine, {read_a}, kTimeout);
    const auto took = std::chrono::duration_cast<Ms>(SteadyClock::now() - start);
    ASSERT_EQ(cooled.summary.failed, 1u);
    const std::string error = cooled.first_error();
    EXPECT_NE(error.find("cooling down after"), std::string::npos) << error;
    EXPECT_NE(error.find("'phoenix'"), std::string::npos) << error;
    EXPECT_NE(error.find("segment 'a'"), std::string::npos) << error;
    EXPECT_LT(took, Ms(500)) << error;
  }
  ASSERT_LT(SteadyClock::now() - failed_at, kCooldown) << "too slow to observe the cool-down";

  // A peer restarted under the same names, once the cool-down has passed, is reached through a re-opened
  // segment.
  children_.clear();
  ChildServer* reborn = spawn("phoenix", "a", 4 * kMiB, 62);
  ASSERT_NE(reborn, nullptr);
  std::this_thread::sleep_until(failed_at + kCooldown + Ms(100));
  Result<SegmentHandle> reopened = engine->open_segment("a");
  ASSERT_TRUE(reopened.ok()) << reopened.status().message();
  BatchResult after = run_batch(*engine, {{.op = TransferOp::kRead,
                                           .local_address = local,
                                           .segment = *reopened,
                                           .offset_bytes = 7,
                                           .length_bytes = 3 * kMiB}});
  ASSERT_EQ(after.summary.completed, 1u) << after.first_error();
  EXPECT_EQ(std::memcmp(local, pattern(62, 7, 3 * kMiB).data(), 3 * kMiB), 0);
}

TEST_P(UcxTwoProcessTest, HungPeerRequestsFailAtTheirDeadlineAndPeerIsUsableAfterwards) {
  constexpr Ms kTimeout(1000);
  ChildServer* peer = spawn("sleepy", "kv", 8 * kMiB, 41);
  ASSERT_NE(peer, nullptr);
  auto engine = make_engine("client", kTimeout);
  ASSERT_TRUE(engine);
  SegmentHandle handle = engine->open_segment("kv").value();
  auto* local = static_cast<std::byte*>(engine->allocate_memory(8 * kMiB).value());

  peer->freeze();
  std::vector<TransferRequest> requests;
  for (int i = 0; i < 16; ++i) {
    const uint64_t offset = static_cast<uint64_t>(i) * 256 * 1024 + 3;
    // Writes send the bytes the segment already holds, so whenever they land the contents stay the same.
    if (i % 2 == 1) fill_pattern(local + i * 256 * 1024, 41, offset, 100000);
    requests.push_back({.op = i % 2 ? TransferOp::kWrite : TransferOp::kRead,
                        .local_address = local + i * 256 * 1024,
                        .segment = handle,
                        .offset_bytes = offset,
                        .length_bytes = 100000});
  }
  const auto submitted = SteadyClock::now();
  BatchResult timed_out = run_batch(*engine, requests, Ms(5000));
  const auto elapsed = std::chrono::duration_cast<Ms>(SteadyClock::now() - submitted);
  EXPECT_EQ(timed_out.summary.failed, requests.size());
  EXPECT_GE(elapsed, kTimeout - Ms(50));
  EXPECT_LE(elapsed, kTimeout + Ms(1000));
  for (const TransferStatus& status : timed_out.statuses) {
    EXPECT_NE(status.error.find("timed out"), std::string::npos) << status.error;
    EXPECT_NE(status.error.find("'sleepy'"), std::string::npos) << status.error;
  }

  peer->thaw();
  BatchResult read = run_batch(*engine, {{.op = TransferOp::kRead,
                                          .local_address = local,
                                          .segment = handle,
                                          .offset_bytes = 99,
                                          .length_bytes = 2 * kMiB}});
  ASSERT_EQ(read.summary.completed, 1u) << read.first_error();
  EXPECT_EQ(std::memcmp(local, pattern(41, 99, 2 * kMiB).data(), 2 * kMiB), 0);
}

TEST_P(UcxTwoProcessTest, DestroyingEngineWithRequestsPendingIsBounded) {
  ChildServer* peer = spawn("stuck", "kv", 4 * kMiB, 51);
  ASSERT_NE(peer, nullptr);
  auto engine = make_engine("client", Ms(60000));
  ASSERT_TRUE(engine);
  SegmentHandle handle = engine->open_segment("kv").value();
  auto* local = static_cast<std::byte*>(engine->allocate_memory(4 * kMiB).value());
  peer->freeze();
  BatchId batch = engine->allocate_batch(4).value();
  std::vector<TransferRequest> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back({.op = i % 2 ? TransferOp::kWrite : TransferOp::kRead,
                        .local_address = local + i * kMiB,
                        .segment = handle,
                        .offset_bytes = static_cast<uint64_t>(i) * kMiB,
                        .length_bytes = kMiB});
  }
  ASSERT_OK(engine->submit(batch, requests));
  std::this_thread::sleep_for(100ms);
  const auto start = SteadyClock::now();
  engine.reset();
  EXPECT_LE(SteadyClock::now() - start, 3s);
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxTwoProcessTest, ::testing::Values(std::string("tcp"), std::string(kShmTls)),
                         tls_label);

}  // namespace
}  // namespace crescent::transfer
