// The TCP transport through the public TransferEngine API: correctness of reads and writes (sizes, offsets,
// slicing), lane failures and retries, dead, hung and absent peers, malformed frames from a raw socket, the
// endpoint cap, and shutdown with requests in flight. Two-process tests fork a child that runs its own
// engine and serves a segment filled with a deterministic pattern.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "transfer/metadata.h"
#include "transfer/transfer_engine.h"

namespace crescent::transfer {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

// ThreadSanitizer makes every recv write shadow memory for its whole buffer: the big transfers shrink.
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif

// ---- Patterns ----------------------------------------------------------------------------------------

// Byte i of pattern `seed` depends only on (seed, i), so any sub-range can be checked on its own.
uint64_t pattern_word(uint64_t seed, uint64_t word) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + word;
  x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

void fill_pattern(std::byte* data, size_t length, uint64_t seed, uint64_t first = 0) {
  size_t i = 0;
  for (; i < length && (first + i) % 8 != 0; ++i) {
    data[i] = static_cast<std::byte>(pattern_word(seed, (first + i) / 8) >> (8 * ((first + i) % 8)));
  }
  for (; i + 8 <= length; i += 8) {
    const uint64_t x = pattern_word(seed, (first + i) / 8);
    std::memcpy(data + i, &x, 8);
  }
  for (; i < length; ++i) {
    data[i] = static_cast<std::byte>(pattern_word(seed, (first + i) / 8) >> (8 * ((first + i) % 8)));
  }
}

// Whether [data, data + length) holds bytes [first, first + length) of pattern `seed`.
::testing::AssertionResult matches_pattern(const std::byte* data, size_t length, uint64_t seed,
                                           uint64_t first) {
  constexpr size_t kChunk = 1 << 20;
  std::vector<std::byte> expected(std::min(length, kChunk));
  for (size_t done = 0; done < length; done += kChunk) {
    const size_t n = std::min(kChunk, length - done);
    fill_pattern(expected.data(), n, seed, first + done);
    if (std::memcmp(expected.data(), data + done, n) != 0) {
      size_t at = 0;
      while (expected[at] == data[done + at]) ++at;
      return ::testing::AssertionFailure() << "byte " << done + at << " of " << length << " (pattern " << seed
                                           << " index " << first + done + at << ") differs";
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- Engines -----------------------------------------------------------------------------------------

EngineOptions tcp_options(std::string name, std::shared_ptr<MetadataService> metadata) {
  EngineOptions options;
  options.name = std::move(name);
  options.metadata = std::move(metadata);
  options.transports = {TransportKind::kTcp};
  return options;
}

std::unique_ptr<TransferEngine> make_engine(EngineOptions options) {
  auto engine = TransferEngine::create(std::move(options));
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

// Registered memory of an engine, from allocate_memory (zeroed, freed with the engine).
std::byte* allocate(TransferEngine& engine, size_t bytes) {
  auto memory = engine.allocate_memory(bytes);
  EXPECT_TRUE(memory.ok()) << memory.status().message();
  return memory.ok() ? static_cast<std::byte*>(memory.value()) : nullptr;
}

// Submits `requests` as one batch and waits for it; returns the summary and fills `errors` (one per failed
// request, by index) when given.
BatchSummary run_batch(TransferEngine& engine, const std::vector<TransferRequest>& requests,
                       std::chrono::milliseconds timeout = 60s, std::vector<std::string>* errors = nullptr) {
  auto batch = engine.allocate_batch(requests.size());
  EXPECT_TRUE(batch.ok()) << batch.status().message();
  if (!batch.ok()) return {};
  const Status submitted = engine.submit(*batch, requests);
  EXPECT_TRUE(submitted.ok()) << submitted.message();
  auto summary = engine.wait(*batch, timeout);
  EXPECT_TRUE(summary.ok());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto status = engine.status(*batch, i);
    if (status.ok() && status->state == TransferState::kFailed) {
      if (errors != nullptr) {
        errors->push_back(status->error);
      } else {
        ADD_FAILURE() << "request " << i << " failed: " << status->error;
      }
    }
  }
  if (summary->pending() == 0) {
    EXPECT_TRUE(engine.free_batch(*batch).ok());
  }
  return *summary;
}

// Port and segment id the owner of `segment` publishes for tcp.
std::pair<uint16_t, uint64_t> tcp_endpoint(MetadataService& metadata, const std::string& segment) {
  auto descriptor = metadata.lookup(segment);
  EXPECT_TRUE(descriptor.ok()) << descriptor.status().message();
  if (!descriptor.ok()) return {0, 0};
  const auto& entry = descriptor->transports["tcp"];
  return {entry["port"].get<uint16_t>(), entry["segment_id"].get<uint64_t>()};
}

// ---- A peer engine in a forked process ----------------------------------------------------------------

using test::TempDir;

// A child process whose engine serves `segment` (filled with pattern `seed`) over tcp. Fork these before the
// test creates its own engines: the child must not inherit engine threads.
class ForkedPeer {
 public:
  ForkedPeer() = default;
  ForkedPeer(const ForkedPeer&) = delete;
  ForkedPeer& operator=(const ForkedPeer&) = delete;
  ~ForkedPeer() { stop(); }

  ::testing::AssertionResult start(const std::string& directory, const std::string& engine,
                                   const std::string& segment, size_t bytes, uint64_t seed) {
    int ready[2];
    int control[2];
    if (::pipe2(ready, O_CLOEXEC) != 0 || ::pipe2(control, O_CLOEXEC) != 0) {
      return ::testing::AssertionFailure() << "pipe: " << std::strerror(errno);
    }
    pid_ = ::fork();
    if (pid_ < 0) return ::testing::AssertionFailure() << "fork: " << std::strerror(errno);
    if (pid_ == 0) serve(directory, engine, segment, bytes, seed, ready[1], control[0]);  // never returns
    ::close(ready[1]);
    ::close(control[0]);
    control_ = control[1];
    pollfd p{.fd = ready[0], .events = POLLIN, .revents = 0};
    char answer = 0;
    const bool got = ::poll(&p, 1, 60000) == 1 && ::read(ready[0], &answer, 1) == 1;
    ::close(ready[0]);
    if (!got || answer != 'R') return ::testing::AssertionFailure() << "peer " << engine << " did not start";
    return ::testing::AssertionSuccess();
  }

  pid_t pid() const { return pid_; }

  void kill_now() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    close_control();
  }

  // Asks the child to destroy its engine and exit, and reaps it.
  void stop() {
    close_control();
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);  // in case a test stopped it
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

 private:
  void close_control() {
    if (control_ >= 0) ::close(control_);
    control_ = -1;
  }

  [[noreturn]] static void serve(const std::string& directory, const std::string& name,
                                 const std::string& segment, size_t bytes, uint64_t seed, int ready,
                                 int control) {
    // Other peers' control pipes were inherited: keeping them open would hide their parent's close.
    for (int fd = 3; fd < 1024; ++fd) {
      if (fd != ready && fd != control) ::close(fd);
    }
    auto metadata = make_directory_metadata(directory);
    if (!metadata.ok()) ::_exit(1);
    auto engine = TransferEngine::create(tcp_options(name, *metadata));
    if (!engine.ok()) ::_exit(2);
    auto memory = (*engine)->allocate_memory(bytes);
    if (!memory.ok()) ::_exit(3);
    fill_pattern(static_cast<std::byte*>(*memory), bytes, seed);
    if (!(*engine)->expose_segment(segment, *memory, bytes).ok()) ::_exit(4);
    if (::write(ready, "R", 1) != 1) ::_exit(5);
    char c;
    while (::read(control, &c, 1) != 0 && errno == EINTR) {
    }
    engine->reset();
    ::_exit(0);
  }

  pid_t pid_ = -1;
  int control_ = -1;
};

// ---- In-process correctness --------------------------------------------------------------------------

struct SliceCase {
  int lanes;
  uint64_t slice_bytes;
};

class TcpInProcessTest : public ::testing::TestWithParam<SliceCase> {};

// Random reads and writes, 1 B .. 64 MiB, unaligned on both sides, between two engines of one process;
// every byte compared.
TEST_P(TcpInProcessTest, RandomReadsAndWritesMoveExactBytes) {
  auto metadata = make_in_process_metadata();
  auto target = make_engine(tcp_options("target", metadata));
  EngineOptions initiator_options = tcp_options("initiator", metadata);
  initiator_options.tcp.lanes_per_peer = GetParam().lanes;
  initiator_options.tcp.slice_bytes = GetParam().slice_bytes;
  auto initiator = make_engine(initiator_options);
  ASSERT_TRUE(target && initiator);

  constexpr size_t kBytes = (64 << 20) + (8 << 20);
  std::byte* remote = allocate(*target, kBytes);
  std::byte* local = allocate(*initiator, kBytes);
  ASSERT_TRUE(remote && local);
  fill_pattern(remote, kBytes, 1);
  ASSERT_TRUE(target->expose_segment("target/kv", remote, kBytes).ok());
  auto segment = initiator->open_segment("target/kv");
  ASSERT_TRUE(segment.ok()) << segment.status().message();
  EXPECT_EQ(*initiator->segment_transport(*segment), TransportKind::kTcp);

  std::mt19937_64 rng(42);
  auto random_size = [&](uint64_t max) {  // log-uniform in [1, max]
    const double x =
        std::exp(std::uniform_real_distribution<double>(0, std::log(static_cast<double>(max)))(rng));
    return std::clamp<uint64_t>(static_cast<uint64_t>(x), 1, max);
  };
  std::vector<uint64_t> sizes = {1, 2, 4095, 4097, 64 << 20, (64 << 20) - 3};
  for (int i = 0; i < 24; ++i) sizes.push_back(random_size(64 << 20));
  uint64_t write_seed = 100;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t size = sizes[i];
    const uint64_t remote_offset = std::uniform_int_distribution<uint64_t>(0, kBytes - size)(rng);
    const uint64_t local_offset = std::uniform_int_distribution<uint64_t>(0, kBytes - size)(rng);
    const bool read = i % 2 == 0;
    SCOPED_TRACE(::testing::Message() << (read ? "read " : "write ") << size << " bytes, remote offset "
                                      << remote_offset << ", local offset " << local_offset);
    if (!read) fill_pattern(local + local_offset, size, ++write_seed);
    const TransferRequest request{.op = read ? TransferOp::kRead : TransferOp::kWrite,
                                  .local_address = local + local_offset,
                                  .segment = *segment,
                                  .offset_bytes = remote_offset,
                                  .length_bytes = size};
    const BatchSummary summary = run_batch(*initiator, {request});
    ASSERT_EQ(summary.completed, 1u);
    if (read) {
      ASSERT_EQ(std::memcmp(local + local_offset, remote + remote_offset, size), 0);
    } else {
      ASSERT_TRUE(matches_pattern(remote + remote_offset, size, write_seed, 0));
      fill_pattern(remote + remote_offset, size, 1, remote_offset);  // restore for later reads
    }
  }
  EXPECT_EQ(initiator->stats().requests_failed, 0u);
  EXPECT_EQ(initiator->stats().slices_retried, 0u);
  EXPECT_EQ(target->stats().remote_accesses_refused, 0u);
}

INSTANTIATE_TEST_SUITE_P(Slicing, TcpInProcessTest,
                         ::testing::Values(SliceCase{4, 512 << 10}, SliceCase{1, 1 << 20},
                                           SliceCase{3, 5000}),
                         [](const ::testing::TestParamInfo<SliceCase>& info) {
                           return "lanes" + std::to_string(info.param.lanes) + "_slice" +
                                  std::to_string(info.param.slice_bytes);
                         });

// 1,024 small requests in one batch (reads and writes to disjoint ranges), every byte compared.
TEST(TcpTransport, BatchOf1024SmallRequests) {
  auto metadata = make_in_process_metadata();
  auto target = make_engine(tcp_options("target", metadata));
  auto initiator = make_engine(tcp_options("initiator", metadata));
  ASSERT_TRUE(target && initiator);
  constexpr size_t kRequests = 1024;
  constexpr size_t kStride = 4096;  // request i uses [i * kStride, +size) on both sides, size <= kStride
  constexpr size_t kBytes = kRequests * kStride;
  std::byte* remote = allocate(*target, kBytes);
  std::byte* local = allocate(*initiator, kBytes);
  ASSERT_TRUE(remote && local);
  fill_pattern(remote, kBytes, 7);
  fill_pattern(local, kBytes, 8);
  ASSERT_TRUE(target->expose_segment("target/small", remote, kBytes).ok());
  auto segment = initiator->open_segment("target/small");
  ASSERT_TRUE(segment.ok()) << segment.status().message();

  std::mt19937_64 rng(5);
  std::vector<TransferRequest> requests;
  for (size_t i = 0; i < kRequests; ++i) {
    const uint64_t size = std::uniform_int_distribution<uint64_t>(1, kStride - 1)(rng);
    const uint64_t skew = std::uniform_int_distribution<uint64_t>(0, kStride - size)(rng);  // unaligned
    requests.push_back({.op = i % 3 == 0 ? TransferOp::kWrite : TransferOp::kRead,
                        .local_address = local + i * kStride + skew,
                        .segment = *segment,
                        .offset_bytes = i * kStride + skew,
                        .length_bytes = size});
  }
  const BatchSummary summary = run_batch(*initiator, requests);
  EXPECT_EQ(summary.completed, kRequests);
  uint64_t bytes = 0;
  for (const TransferRequest& r : requests) {
    const auto* at = static_cast<std::byte*>(r.local_address);
    const uint64_t offset = static_cast<uint64_t>(at - local);
    // Reads brought the target's pattern 7 over; writes carried the initiator's pattern 8 over.
    const uint64_t seed = r.op == TransferOp::kRead ? 7 : 8;
    ASSERT_TRUE(matches_pattern(at, r.length_bytes, seed, offset));
    ASSERT_TRUE(matches_pattern(remote + r.offset_bytes, r.length_bytes, seed, offset));
    bytes += r.length_bytes;
  }
  EXPECT_EQ(initiator->stats().requests_completed, kRequests);
  EXPECT_EQ(initiator->stats().bytes_transferred, bytes);
}

// Members only (issue 22 §2): a target started with the cluster secret serves its members' reads and writes
// and nobody else's: an engine without the secret, or with another cluster's, can neither read the segment
// nor write into it, and each connection refused is counted. A member sends nothing to an engine outside
// the cluster either.
TEST(TcpTransport, OnlyMembersReadOrWriteASegment) {
  auto metadata = make_in_process_metadata();
  const ClusterSecret cluster = ClusterSecret::generate();
  EngineOptions target_options = tcp_options("target", metadata);
  target_options.secret = cluster;
  auto target = make_engine(target_options);
  EngineOptions member_options = tcp_options("member", metadata);
  member_options.secret = cluster;
  auto member = make_engine(member_options);
  EngineOptions stranger_options = tcp_options("stranger", metadata);
  stranger_options.failure.request_timeout = 3s;
  auto stranger = make_engine(stranger_options);
  EngineOptions other_options = tcp_options("other-cluster", metadata);
  other_options.secret = ClusterSecret::generate();
  other_options.failure.request_timeout = 3s;
  auto other = make_engine(other_options);
  ASSERT_TRUE(target && member && stranger && other);
  constexpr size_t kBytes = 64 << 10;
  std::byte* remote = allocate(*target, kBytes);
  ASSERT_TRUE(remote);
  fill_pattern(remote, kBytes, 7);
  ASSERT_TRUE(target->expose_segment("target/kv", remote, kBytes).ok());

  for (TransferEngine* outsider : {stranger.get(), other.get()}) {
    std::byte* local = allocate(*outsider, kBytes);
    ASSERT_TRUE(local);
    fill_pattern(local, kBytes, 9);
    auto segment = outsider->open_segment("target/kv");
    ASSERT_TRUE(segment.ok()) << segment.status().message();
    std::vector<std::string> errors;
    const BatchSummary summary = run_batch(*outsider,
                                           {{.op = TransferOp::kWrite,
                                             .local_address = local,
                                             .segment = *segment,
                                             .offset_bytes = 0,
                                             .length_bytes = kBytes},
                                            {.op = TransferOp::kRead,
                                             .local_address = local,
                                             .segment = *segment,
                                             .offset_bytes = 0,
                                             .length_bytes = kBytes}},
                                           20s, &errors);
    EXPECT_EQ(summary.failed, 2u);
    EXPECT_TRUE(matches_pattern(local, kBytes, 9, 0)) << "nothing was read";
    if (outsider == other.get()) {
      ASSERT_FALSE(errors.empty());
      EXPECT_NE(errors[0].find("not a member"), std::string::npos) << errors[0];
    }
  }
  EXPECT_TRUE(matches_pattern(remote, kBytes, 7, 0)) << "nothing was written";
  EXPECT_GE(target->stats().peers_refused, 2u);

  std::byte* local = allocate(*member, kBytes);
  ASSERT_TRUE(local);
  auto segment = member->open_segment("target/kv");
  ASSERT_TRUE(segment.ok()) << segment.status().message();
  EXPECT_EQ(run_batch(*member, {{.op = TransferOp::kRead,
                                 .local_address = local,
                                 .segment = *segment,
                                 .offset_bytes = 0,
                                 .length_bytes = kBytes}})
                .completed,
            1u);
  EXPECT_TRUE(matches_pattern(local, kBytes, 7, 0));

  // The member toward an engine without the secret: refused before a byte of the request leaves.
  std::byte* open_memory = allocate(*stranger, kBytes);
  ASSERT_TRUE(open_memory);
  fill_pattern(open_memory, kBytes, 3);
  ASSERT_TRUE(stranger->expose_segment("stranger/kv", open_memory, kBytes).ok());
  auto open_segment = member->open_segment("stranger/kv");
  ASSERT_TRUE(open_segment.ok());
  fill_pattern(local, kBytes, 5);
  std::vector<std::string> errors;
  EXPECT_EQ(run_batch(*member,
                      {{.op = TransferOp::kWrite,
                        .local_address = local,
                        .segment = *open_segment,
                        .offset_bytes = 0,
                        .length_bytes = kBytes}},
                      20s, &errors)
                .failed,
            1u);
  EXPECT_TRUE(matches_pattern(open_memory, kBytes, 3, 0));
}

// ---- Two processes -----------------------------------------------------------------------------------

// Reads checked against the child's pattern; writes read back and compared.
TEST(TcpTransport, TwoProcessReadsAndWrites) {
  TempDir directory;
  constexpr size_t kRemoteBytes = 80 << 20;
  ForkedPeer peer;
  ASSERT_TRUE(peer.start(directory.path(), "child", "child/kv", kRemoteBytes, 11));
  auto metadata = make_directory_metadata(directory.path());
  ASSERT_TRUE(metadata.ok());
  auto engine = make_engine(tcp_options("parent", *metadata));
  ASSERT_TRUE(engine);
  constexpr size_t kLocalBytes = 2 * kRemoteBytes;
  std::byte* local = allocate(*engine, kLocalBytes);
  ASSERT_TRUE(local);
  auto segment = engine->open_segment("child/kv");
  ASSERT_TRUE(segment.ok()) << segment.status().message();

  std::mt19937_64 rng(9);
  std::vector<uint64_t> sizes = {1, 3, 64 << 20, (64 << 20) - 1};
  for (int i = 0; i < 12; ++i) {
    sizes.push_back(std::clamp<uint64_t>(
        static_cast<uint64_t>(
            std::exp(std::uniform_real_distribution<double>(0, std::log(64.0 * (1 << 20)))(rng))),
        1, 64 << 20));
  }
  uint64_t write_seed = 500;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t size = sizes[i];
    const uint64_t remote_offset = std::uniform_int_distribution<uint64_t>(0, kRemoteBytes - size)(rng);
    const uint64_t local_offset = std::uniform_int_distribution<uint64_t>(0, kRemoteBytes - size)(rng);
    SCOPED_TRACE(::testing::Message()
                 << size << " bytes, remote offset " << remote_offset << ", local offset " << local_offset);
    if (i % 2 == 0) {
      const BatchSummary read = run_batch(*engine, {{.op = TransferOp::kRead,
                                                     .local_address = local + local_offset,
                                                     .segment = *segment,
                                                     .offset_bytes = remote_offset,
                                                     .length_bytes = size}});
      ASSERT_EQ(read.completed, 1u);
      ASSERT_TRUE(matches_pattern(local + local_offset, size, 11, remote_offset));
    } else {
      // Write a fresh pattern, read it back into the other half of the buffer, then restore the child's.
      fill_pattern(local + local_offset, size, ++write_seed);
      std::byte* back = local + kRemoteBytes + local_offset;
      const BatchSummary written = run_batch(*engine, {{.op = TransferOp::kWrite,
                                                        .local_address = local + local_offset,
                                                        .segment = *segment,
                                                        .offset_bytes = remote_offset,
                                                        .length_bytes = size}});
      ASSERT_EQ(written.completed, 1u);
      const BatchSummary read = run_batch(*engine, {{.op = TransferOp::kRead,
                                                     .local_address = back,
                                                     .segment = *segment,
                                                     .offset_bytes = remote_offset,
                                                     .length_bytes = size}});
      ASSERT_EQ(read.completed, 1u);
      ASSERT_TRUE(matches_pattern(back, size, write_seed, 0));
      fill_pattern(local + local_offset, size, 11, remote_offset);
      ASSERT_EQ(run_batch(*engine, {{.op = TransferOp::kWrite,
                                     .local_address = local + local_offset,
                                     .segment = *segment,
                                     .offset_bytes = remote_offset,
                                     .length_bytes = size}})
                    .completed,
                1u);
    }
  }
  EXPECT_EQ(engine->stats().requests_failed, 0u);
}

// Once `engine` has moved `after_bytes`, breaks a connected lane of the path to `segment`, again every 20 ms
// until a slice is retried; returns whether one was before `batch` ended. (A lane broken before it took
// its first slice of the batch finds its connection dead while still idle and reconnects without a retry.)
bool break_lanes_until_retried(TransferEngine& engine, SegmentHandle segment, BatchId batch,
                               uint64_t after_bytes) {
  const uint64_t retried = engine.stats().slices_retried;
  Steady::time_point last_break{};
  while (engine.wait(batch, 0ms)->pending() > 0) {
    if (engine.stats().slices_retried > retried) return true;
    if (engine.stats().bytes_transferred >= after_bytes && Steady::now() - last_break > 20ms) {
      for (int lane = 0; lane < 4; ++lane) {
        if (engine.break_tcp_lane_for_testing(segment, lane).ok()) {
          last_break = Steady::now();
          break;
        }
      }
    }
    std::this_thread::sleep_for(200us);
  }
  return engine.stats().slices_retried > retried;
}

// A lane broken in the middle of a 1 GiB batch: its slices are retried on the other lanes and every byte
// still arrives; then the same for writes. (Most of this test's time is the first touch of 2 GiB of fresh
// memory, not the transfer.)
TEST(TcpTransport, LaneBrokenMidBatchIsRetried) {
  TempDir directory;
  constexpr size_t kBytes = kThreadSanitizer ? 256 << 20 : 1ull << 30;
  constexpr size_t kRequestBytes = 4 << 20;
  ForkedPeer peer;
  ASSERT_TRUE(peer.start(directory.path(), "child", "child/big", kBytes, 21));
  auto metadata = make_directory_metadata(directory.path());
  ASSERT_TRUE(metadata.ok());
  EngineOptions options = tcp_options("parent", *metadata);
  options.tcp.lanes_per_peer = 4;
  options.failure.request_timeout = 60s;
  auto engine = make_engine(options);
  ASSERT_TRUE(engine);
  std::byte* local = allocate(*engine, kBytes);
  ASSERT_TRUE(local);
  auto segment = engine->open_segment("child/big");
  ASSERT_TRUE(segment.ok()) << segment.status().message();

  std::vector<TransferRequest> reads;
  for (size_t i = 0; i < kBytes / kRequestBytes; ++i) {
    reads.push_back({.op = TransferOp::kRead,
                     .local_address = local + i * kRequestBytes,
                     .segment = *segment,
                     .offset_bytes = i * kRequestBytes,
                     .length_bytes = kRequestBytes});
  }
  auto batch = engine->allocate_batch(reads.size());
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(engine->submit(*batch, reads).ok());
  EXPECT_TRUE(break_lanes_until_retried(*engine, *segment, *batch, 64 << 20));
  auto summary = engine->wait(*batch, 60s);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->completed, reads.size());
  EXPECT_EQ(summary->failed, 0u);
  ASSERT_TRUE(engine->free_batch(*batch).ok());
  const uint64_t retried_reads = engine->stats().slices_retried;
  EXPECT_GT(retried_reads, 0u);
  EXPECT_TRUE(matches_pattern(local, kBytes, 21, 0));

  // Writes of a new pattern over half the segment, read back. Both sides' memory is warm now, so the batch is
  // short; it must still last long enough for breaks (every 20 ms) to land mid-batch.
  constexpr size_t kWriteBytes = kBytes / 2;
  fill_pattern(local, kWriteBytes, 22);
  std::vector<TransferRequest> writes;
  for (size_t i = 0; i < kWriteBytes / kRequestBytes; ++i) {
    writes.push_back({.op = TransferOp::kWrite,
                      .local_address = local + i * kRequestBytes,
                      .segment = *segment,
                      .offset_bytes = i * kRequestBytes,
                      .length_bytes = kRequestBytes});
  }
  const uint64_t before = engine->stats().bytes_transferred;
  batch = engine->allocate_batch(writes.size());
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(engine->submit(*batch, writes).ok());
  EXPECT_TRUE(break_lanes_until_retried(*engine, *segment, *batch, before + (16 << 20)));
  summary = engine->wait(*batch, 60s);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->completed, writes.size());
  ASSERT_TRUE(engine->free_batch(*batch).ok());
  EXPECT_GT(engine->stats().slices_retried, retried_reads);
  std::memset(local, 0, kWriteBytes);
  std::vector<TransferRequest> check = writes;
  for (auto& r : check) r.op = TransferOp::kRead;
  EXPECT_EQ(run_batch(*engine, check).completed, check.size());
  EXPECT_TRUE(matches_pattern(local, kWriteBytes, 22, 0));
}

// Lanes broken again and again while two threads submit reads and writes to one peer: every request
// completes with the right bytes. In one process, so ThreadSanitizer sees both sides.
TEST(TcpTransport, LanesBrokenRepeatedlyUnderConcurrentSubmits) {
  auto metadata = make_in_process_metadata();
  auto target = make_engine(tcp_options("target", metadata));
  EngineOptions options = tcp_options("initiator", metadata);
  options.tcp.lanes_per_peer = 3;
  options.tcp.slice_bytes = 256 << 10;
  options.failure.path_cooldown = 20ms;
  options.failure.retry_budget = 1000;  // the test breaks far more often than a network would
  options.failure.request_timeout = 60s;
  auto initiator = make_engine(options);
  ASSERT_TRUE(target && initiator);
  constexpr size_t kRequestBytes = 1 << 20;
  constexpr size_t kRequests = kThreadSanitizer ? 32 : 128;  // per submitting thread
  constexpr size_t kHalf = kRequests * kRequestBytes;  // thread 0 reads the first half, 1 writes the second
  std::byte* remote = allocate(*target, 2 * kHalf);
  std::byte* local = allocate(*initiator, 2 * kHalf);
  ASSERT_TRUE(remote && local);
  fill_pattern(remote, kHalf, 71);
  fill_pattern(local + kHalf, kHalf, 72, kHalf);
  ASSERT_TRUE(target->expose_segment("target/kv", remote, 2 * kHalf).ok());
  auto segment = initiator->open_segment("target/kv");
  ASSERT_TRUE(segment.ok());

  std::atomic<int> running{2};
  std::atomic<int> breaks{0};
  // One break per 4 MiB moved, so slices always make progress however slow the build is.
  std::thread breaker([&] {
    std::mt19937 rng(3);
    uint64_t next = 4 << 20;
    while (running.load() > 0) {
      if (initiator->stats().bytes_transferred >= next) {
        breaks += initiator->break_tcp_lane_for_testing(*segment, static_cast<int>(rng() % 3)).ok();
        next += 4 << 20;
      }
      std::this_thread::sleep_for(500us);
    }
  });
  std::vector<BatchSummary> summaries(2);
  std::vector<std::thread> submitters;
  for (int t = 0; t < 2; ++t) {
    submitters.emplace_back([&, t] {
      const size_t base = t * kHalf;
      for (size_t round = 0; round < 4; ++round) {  // several batches, each of a quarter of the requests
        std::vector<TransferRequest> requests;
        for (size_t i = round * kRequests / 4; i < (round + 1) * kRequests / 4; ++i) {
          requests.push_back({.op = t == 0 ? TransferOp::kRead : TransferOp::kWrite,
                              .local_address = local + base + i * kRequestBytes,
                              .segment = *segment,
                              .offset_bytes = base + i * kRequestBytes,
                              .length_bytes = kRequestBytes});
        }
        const BatchSummary summary = run_batch(*initiator, requests);
        summaries[t].submitted += summary.submitted;
        summaries[t].completed += summary.completed;
      }
      running--;
    });
  }
  for (auto& thread : submitters) thread.join();
  breaker.join();
  for (const BatchSummary& summary : summaries) EXPECT_EQ(summary.completed, kRequests);
  EXPECT_TRUE(matches_pattern(local, kHalf, 71, 0));               // read
  EXPECT_TRUE(matches_pattern(remote + kHalf, kHalf, 72, kHalf));  // written
  EXPECT_GT(breaks.load(), 0);
  EXPECT_GT(initiator->stats().slices_retried, 0u);
  EXPECT_EQ(initiator->stats().requests_failed, 0u);
}

// Many small reads and writes of random sizes (a lane carries a window of them at a time) while lanes are
// broken again and again: the unanswered slices of a broken window are retried, every request completes
// with the right bytes, and nothing is answered twice into the wrong place.
TEST(TcpTransport, WindowsOfSmallRequestsSurviveBrokenLanes) {
  auto metadata = make_in_process_metadata();
  auto target = make_engine(tcp_options("target", metadata));
  EngineOptions options = tcp_options("initiator", metadata);
  options.tcp.lanes_per_peer = 3;
  options.failure.path_cooldown = 5ms;
  options.failure.retry_budget = 1000;  // the test breaks far more often than a network would
  options.failure.request_timeout = 60s;
  auto initiator = make_engine(options);
  ASSERT_TRUE(target && initiator);
  constexpr size_t kBytes = 8 << 20;
  std::byte* remote = allocate(*target, kBytes);
  std::byte* local = allocate(*initiator, kBytes);
  ASSERT_TRUE(remote && local);
  fill_pattern(remote, kBytes / 2, 81);                          // read into the first half
  fill_pattern(local + kBytes / 2, kBytes / 2, 82, kBytes / 2);  // written from the second
  ASSERT_TRUE(target->expose_segment("target/kv", remote, kBytes).ok());
  auto segment = initiator->open_segment("target/kv");
  ASSERT_TRUE(segment.ok());

  // Requests of 1 byte to 20 KiB tiling each half, reads and writes interleaved in every batch.
  std::mt19937 rng(5);
  std::vector<TransferRequest> requests;
  for (const TransferOp op : {TransferOp::kRead, TransferOp::kWrite}) {
    const size_t base = op == TransferOp::kRead ? 0 : kBytes / 2;
    for (size_t at = 0; at < kBytes / 2;) {
      const size_t length = std::min<size_t>(1 + rng() % (20 << 10), kBytes / 2 - at);
      requests.push_back({.op = op,
                          .local_address = local + base + at,
                          .segment = *segment,
                          .offset_bytes = base + at,
                          .length_bytes = length});
      at += length;
    }
  }
  std::shuffle(requests.begin(), requests.end(), rng);

  std::atomic<bool> running{true};
  std::atomic<int> breaks{0};
  std::thread breaker([&] {  // one break per 256 KiB moved: windows are cut mid-answer
    uint64_t next = 256 << 10;
    int lane = 0;
    while (running.load()) {
      if (initiator->stats().bytes_transferred >= next) {
        breaks += initiator->break_tcp_lane_for_testing(*segment, lane++ % 3).ok();
        next += 256 << 10;
      }
      std::this_thread::sleep_for(100us);
    }
  });
  size_t completed = 0;
  for (size_t at = 0; at < requests.size(); at += 512) {
    const std::vector<TransferRequest> batch(
        requests.begin() + static_cast<ptrdiff_t>(at),
        requests.begin() + static_cast<ptrdiff_t>(std::min(at + 512, requests.size())));
    completed += run_batch(*initiator, batch).completed;
  }
  running = false;
  breaker.join();
  EXPECT_EQ(completed, requests.size());
  EXPECT_TRUE(matches_pattern(local, kBytes / 2, 81, 0));                         // read
  EXPECT_TRUE(matches_pattern(remote + kBytes / 2, kBytes / 2, 82, kBytes / 2));  // written
  EXPECT_GT(breaks.load(), 0);
  EXPECT_GT(initiator->stats().slices_retried, 0u);
  EXPECT_EQ(initiator->stats().requests_failed, 0u);
}

// The owner of a segment is SIGKILLed with requests in flight: every one of them ends (failed, naming the
// peer) within the request timeout, and the engine keeps serving transfers to another, live peer.
TEST(TcpTransport, KilledPeerFailsPendingRequestsWithinTimeout) {
  TempDir directory;
  constexpr size_t kBytes = 64 << 20;
  ForkedPeer doomed;
  ForkedPeer live;
  ASSERT_TRUE(doomed.start(directory.path(), "doomed", "doomed/kv", kBytes, 31));
  ASSERT_TRUE(live.start(directory.path(), "live", "live/kv", kBytes, 32));
  auto metadata = make_directory_metadata(directory.path());
  ASSERT_TRUE(metadata.ok());
  EngineOptions options = tcp_options("parent", *metadata);
  constexpr auto kTimeout = 2000ms;
  options.failure.request_timeout = kTimeout;
  auto engine = make_engine(options);
  ASSERT_TRUE(engine);
  std::byte* local = allocate(*engine, kBytes);
  ASSERT_TRUE(local);
  auto doomed_segment = engine->open_segment("doomed/kv");
  auto live_segment = engine->open_segment("live/kv");
  ASSERT_TRUE(doomed_segment.ok() && live_segment.ok());

  // 1 GiB of reads (the 64 MiB segment 16 times over): far more than can finish before the kill.
  std::vector<TransferRequest> reads;
  for (size_t i = 0; i < 1024; ++i) {
    reads.push_back({.op = TransferOp::kRead,
                     .local_address = local + (i % 64) * (1 << 20),
                     .segment = *doomed_segment,
                     .offset_bytes = (i % 64) * (1 << 20),
                     .length_bytes = 1 << 20});
  }
  auto batch = engine->allocate_batch(reads.size());
  ASSERT_TRUE(batch.ok());
  const auto submitted = Steady::now();
  ASSERT_TRUE(engine->submit(*batch, reads).ok());
  while (engine->stats().bytes_transferred < (8 << 20)) std::this_thread::sleep_for(100us);
  doomed.kill_now();
  auto summary = engine->wait(*batch, kTimeout + 3s);
  const auto elapsed = Steady::now() - submitted;
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->pending(), 0u);
  EXPECT_GT(summary->failed, 0u);
  EXPECT_LT(elapsed, kTimeout + 500ms);
  size_t named = 0;
  for (size_t i = 0; i < reads.size(); ++i) {
    auto status = engine->status(*batch, i);
    ASSERT_TRUE(status.ok());
    if (status->state != TransferState::kFailed) continue;
    EXPECT_NE(status->error.find("tcp: peer doomed 127.0.0.1:"), std::string::npos) << status->error;
    EXPECT_NE(status->error.find("doomed/kv"), std::string::npos) << status->error;
    named++;
  }
  EXPECT_EQ(named, summary->failed);
  EXPECT_TRUE(engine->free_batch(*batch).ok());

  // The other peer is unaffected.
  const BatchSummary alive = run_batch(*engine, {{.op = TransferOp::kRead,
                                                  .local_address = local,
                                                  .segment = *live_segment,
                                                  .offset_bytes = 0,
                                                  .length_bytes = 8 << 20}});
  EXPECT_EQ(alive.completed, 1u);
  EXPECT_TRUE(matches_pattern(local, 8 << 20, 32, 0));
}

// A SIGSTOPped owner accepts connections but never answers: requests fail at their deadline, not later.
TEST(TcpTransport, HungPeerFailsAtDeadline) {
  TempDir directory;
  constexpr size_t kBytes = 16 << 20;
  ForkedPeer hung;
  ASSERT_TRUE(hung.start(directory.path(), "hung", "hung/kv", kBytes, 41));
  auto metadata = make_directory_metadata(directory.path());
  ASSERT_TRUE(metadata.ok());
  EngineOptions options = tcp_options("parent", *metadata);
  constexpr auto kTimeout = 1000ms;
  options.failure.request_timeout = kTimeout;
  auto engine = make_engine(options);
  ASSERT_TRUE(engine);
  std::byte* local = allocate(*engine, kBytes);
  ASSERT_TRUE(local);
  auto segment = engine->open_segment("hung/kv");
  ASSERT_TRUE(segment.ok());
  ASSERT_EQ(::kill(hung.pid(), SIGSTOP), 0);
  std::vector<TransferRequest> requests;
  for (size_t i = 0; i < 16; ++i) {
    requests.push_back({.op = i % 2 == 0 ? TransferOp::kRead : TransferOp::kWrite,
                        .local_address = local + i * (1 << 20),
                        .segment = *segment,
                        .offset_bytes = i * (1 << 20),
                        .length_bytes = 1 << 20});
  }
  std::vector<std::string> errors;
  const auto start = Steady::now();
  const BatchSummary summary = run_batch(*engine, requests, kTimeout + 3s, &errors);
  const auto elapsed = Steady::now() - start;
  EXPECT_EQ(summary.failed, requests.size());
  EXPECT_GE(elapsed, kTimeout - 50ms);
  EXPECT_LT(elapsed, kTimeout + 500ms);
  for (const std::string& error : errors) {
    EXPECT_NE(error.find("tcp: peer hung 127.0.0.1:"), std::string::npos) << error;
    EXPECT_NE(error.find("hung/kv"), std::string::npos) << error;
  }
  hung.kill_now();
}

// Destroying an engine with requests pending on a hung peer returns promptly (and cleanly under ASan).
TEST(TcpTransport, DestroyWithPendingRequestsDoesNotHang) {
  TempDir directory;
  constexpr size_t kBytes = 16 << 20;
  ForkedPeer hung;
  ASSERT_TRUE(hung.start(directory.path(), "hung", "hung/kv", kBytes, 42));
  auto metadata = make_directory_metadata(directory.path());
  ASSERT_TRUE(metadata.ok());
  auto engine = make_engine(tcp_options("parent", *metadata));
  ASSERT_TRUE(engine);
  std::byte* local = allocate(*engine, kBytes);
  ASSERT_TRUE(local);
  auto segment = engine->open_segment("hung/kv");
  ASSERT_TRUE(segment.ok());
  ASSERT_EQ(::kill(hung.pid(), SIGSTOP), 0);
  std::vector<TransferRequest> requests;
  for (size_t i = 0; i < 64; ++i) {
    requests.push_back({.op = TransferOp::kRead,
                        .local_address = local + (i % 16) * (1 << 20),
                        .segment = *segment,
                        .offset_bytes = (i % 16) * (1 << 20),
                        .length_bytes = 1 << 20});
  }
  auto batch = engine->allocate_batch(requests.size());
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(engine->submit(*batch, requests).ok());
  std::this_thread::sleep_for(100ms);  // lanes connected and blocked on the hung peer
  EXPECT_EQ(engine->wait(*batch, 0ms)->pending(), requests.size());
  const auto start = Steady::now();
  engine.reset();
  EXPECT_LT(Steady::now() - start, 1s);
  hung.kill_now();
}

// ---- Absent peers, raw frames, endpoint cap ------------------------------------------------------------

// A free port on 127.0.0.1 that nothing listens on.
uint16_t closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

std::string fmt_peer(const std::string& engine, uint16_t port) {
  return "tcp: peer " + engine + " 127.0.0.1:" + std::to_string(port);
}

// A segment whose owner never existed (its port is closed) fails fast, not after the timeouts.
TEST(TcpTransport, AbsentPeerFailsFast) {
  auto metadata = make_in_process_metadata();
  ASSERT_TRUE(metadata->claim_engine("ghost").ok());
  const uint16_t port = closed_port();
  SegmentDescriptor ghost{
      .name = "ghost/kv",
      .engine = "ghost",
      .host_id = "elsewhere",
      .length_bytes = 1 << 20,
      .transports = {{"tcp", {{"host", "127.0.0.1"}, {"port", port}, {"segment_id", 1}}}}};
  ASSERT_TRUE(metadata->publish(ghost).ok());
  auto engine = make_engine(tcp_options("initiator", metadata));
  ASSERT_TRUE(engine);
  std::byte* local = allocate(*engine, 1 << 20);
  auto segment = engine->open_segment("ghost/kv");  // does not connect
  ASSERT_TRUE(segment.ok()) << segment.status().message();
  std::vector<TransferRequest> requests(8, {.op = TransferOp::kRead,
                                            .local_address = local,
                                            .segment = *segment,
                                            .offset_bytes = 0,
                                            .length_bytes = 1 << 20});
  for (int round = 0; round < 2; ++round) {  // the second finds the peer known down
    std::vector<std::string> errors;
    const auto start = Steady::now();
    const BatchSummary summary = run_batch(*engine, requests, 10s, &errors);
    EXPECT_LT(Steady::now() - start, 500ms);
    EXPECT_EQ(summary.failed, requests.size());
    for (const std::string& error : errors) {
      EXPECT_NE(error.find(fmt_peer("ghost", port)), std::string::npos) << error;
      EXPECT_NE(error.find("ghost/kv"), std::string::npos) << error;
      EXPECT_NE(error.find("Connection refused"), std::string::npos) << error;
    }
  }
  EXPECT_EQ(engine->stats().requests_failed, 2 * requests.size());
}

// A peer whose listen queue is full drops connection attempts (SYNs go unanswered): its requests fail after
// about connect_timeout, not request_timeout.
TEST(TcpTransport, UnresponsivePeerFailsAfterConnectTimeout) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 0), 0);  // never accepted: the queue fills with the connections below
  socklen_t length = sizeof(address);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  const uint16_t port = ntohs(address.sin_port);
  std::vector<int> fillers;
  for (int i = 0; i < 4; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    fillers.push_back(fd);
  }
  std::this_thread::sleep_for(50ms);

  auto metadata = make_in_process_metadata();
  ASSERT_TRUE(metadata->claim_engine("mute").ok());
  SegmentDescriptor mute{.name = "mute/kv",
                         .engine = "mute",
                         .host_id = "elsewhere",
                         .length_bytes = 1 << 20,
                         .transports = {{"tcp", {{"host", "127.0.0.1"}, {"port", port}, {"segment_id", 1}}}}};
  ASSERT_TRUE(metadata->publish(mute).ok());
  EngineOptions options = tcp_options("initiator", metadata);
  options.failure.connect_timeout = 300ms;
  options.failure.request_timeout = 10s;
  auto engine = make_engine(options);
  ASSERT_TRUE(engine);
  std::byte* local = allocate(*engine, 1 << 20);
  auto segment = engine->open_segment("mute/kv");
  ASSERT_TRUE(segment.ok());
  std::vector<TransferRequest> requests(4, {.op = TransferOp::kWrite,
                                            .local_address = local,
                                            .segment = *segment,
                                            .offset_bytes = 0,
                                            .length_bytes = 1 << 20});
  std::vector<std::string> errors;
  const auto start = Steady::now();
  const BatchSummary summary = run_batch(*engine, requests, 20s, &errors);
  const auto elapsed = Steady::now() - start;
  EXPECT_EQ(summary.failed, requests.size());
  EXPECT_GE(elapsed, 300ms);
  EXPECT_LT(elapsed, 1500ms);
  for (const std::string& error : errors) {
    EXPECT_NE(error.find(fmt_peer("mute", port)), std::string::npos) << error;
    EXPECT_NE(error.find("mute/kv"), std::string::npos) << error;
    EXPECT_NE(error.find("connect: no answer within"), std::string::npos) << error;
  }
  for (int fd : fillers) ::close(fd);
  ::close(listener);
}

// The wire format, written by hand as a foreign client would (see tcp_transport.cpp).
constexpr uint32_t kMagic = 0x50545243;
constexpr uint16_t kOpRead = 1;
constexpr uint16_t kOpWrite = 2;

template <typename T>
void put(std::vector<std::byte>& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out.push_back(static_cast<std::byte>(static_cast<uint64_t>(value) >> (8 * i)));
}

std::vector<std::byte> frame(uint16_t op, uint64_t tag, uint64_t segment_id, uint64_t offset, uint64_t length,
                             uint32_t magic = kMagic, uint16_t version = 1) {
  std::vector<std::byte> out;
  put(out, magic);
  put(out, version);
  put(out, op);
  put(out, tag);
  put(out, segment_id);
  put(out, offset);
  put(out, length);
  return out;
}

class RawConnection {
 public:
  explicit RawConnection(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~RawConnection() { ::close(fd_); }
  bool connected() const { return connected_; }

  bool send(const void* data, size_t length) {
    return ::send(fd_, data, length, MSG_NOSIGNAL) == static_cast<ssize_t>(length);
  }
  bool send(const std::vector<std::byte>& bytes) { return send(bytes.data(), bytes.size()); }

  // Exactly `length` bytes within 5 s; false on EOF, error or timeout.
  bool receive(void* data, size_t length) {
    auto* out = static_cast<std::byte*>(data);
    while (length > 0) {
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, 5000) != 1) return false;
      const ssize_t n = ::recv(fd_, out, length, 0);
      if (n <= 0) return false;
      out += n;
      length -= static_cast<size_t>(n);
    }
    return true;
  }

  struct Response {
    bool received = false;
    uint32_t magic = 0;
    uint16_t status = 0;
    uint64_t tag = 0;
    std::string error;
  };
  Response response() {
    Response r;
    std::byte header[24];
    if (!receive(header, sizeof(header))) return r;
    auto get = [&](size_t at, size_t bytes) {
      uint64_t v = 0;
      for (size_t i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(header[at + i]) << (8 * i);
      return v;
    };
    r.magic = static_cast<uint32_t>(get(0, 4));
    r.status = static_cast<uint16_t>(get(6, 2));
    r.tag = get(8, 8);
    r.error.resize(get(16, 4));
    r.received = receive(r.error.data(), r.error.size());
    return r;
  }

  // True when the engine closes the connection within 5 s.
  bool closed_by_peer() {
    pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 5000) != 1) return false;
    char c;
    return ::recv(fd_, &c, 1, 0) <= 0;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// Garbage and out-of-bounds frames from a plain socket: refused with an error response (connection still
// usable) or the connection closed; the engine keeps serving and counts the refusals.
TEST(TcpTransport, MalformedFramesAreRefused) {
  auto metadata = make_in_process_metadata();
  auto target = make_engine(tcp_options("target", metadata));
  ASSERT_TRUE(target);
  constexpr size_t kBytes = 1 << 20;
  std::byte* memory = allocate(*target, kBytes);
  fill_pattern(memory, kBytes, 51);
  ASSERT_TRUE(target->expose_segment("target/kv", memory, kBytes).ok());
  const auto [port, id] = tcp_endpoint(*metadata, "target/kv");
  ASSERT_NE(port, 0);

  {
    RawConnection raw(port);
    ASSERT_TRUE(raw.connected());
    // Unknown segment id.
    ASSERT_TRUE(raw.send(frame(kOpRead, 1, id + 1000, 0, 16)));
    auto r = raw.response();
    ASSERT_TRUE(r.received);
    EXPECT_EQ(r.magic, kMagic);
    EXPECT_EQ(r.tag, 1u);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.error.find("no segment with id"), std::string::npos) << r.error;
    // Range beyond the segment.
    ASSERT_TRUE(raw.send(frame(kOpRead, 2, id, kBytes - 8, 16)));
    r = raw.response();
    ASSERT_TRUE(r.received);
    EXPECT_EQ(r.tag, 2u);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.error.find("target/kv"), std::string::npos) << r.error;
    // Zero length.
    ASSERT_TRUE(raw.send(frame(kOpRead, 3, id, 0, 0)));
    r = raw.response();
    ASSERT_TRUE(r.received);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.error.find("zero-length"), std::string::npos) << r.error;
    // A refused write: its payload is drained, so the next frame is still parsed.
    std::vector<std::byte> write = frame(kOpWrite, 4, id, kBytes - 100, 1000);
    write.resize(write.size() + 1000, std::byte{0x5a});
    ASSERT_TRUE(raw.send(write));
    r = raw.response();
    ASSERT_TRUE(r.received);
    EXPECT_EQ(r.tag, 4u);
    EXPECT_NE(r.status, 0);
    // Still in sync: a good read on the same connection.
    ASSERT_TRUE(raw.send(frame(kOpRead, 5, id, 1000, 4096)));
    r = raw.response();
    ASSERT_TRUE(r.received);
    EXPECT_EQ(r.tag, 5u);
    EXPECT_EQ(r.status, 0);
    std::vector<std::byte> payload(4096);
    ASSERT_TRUE(raw.receive(payload.data(), payload.size()));
    EXPECT_TRUE(matches_pattern(payload.data(), payload.size(), 51, 1000));
    // Bad magic: the connection is closed.
    ASSERT_TRUE(raw.send(frame(kOpRead, 6, id, 0, 16, 0xdeadbeef)));
    EXPECT_TRUE(raw.closed_by_peer());
  }
  {
    RawConnection raw(port);  // bad version
    ASSERT_TRUE(raw.send(frame(kOpRead, 1, id, 0, 16, kMagic, 99)));
    EXPECT_TRUE(raw.closed_by_peer());
  }
  {
    RawConnection raw(port);  // unknown op
    ASSERT_TRUE(raw.send(frame(7, 1, id, 0, 16)));
    EXPECT_TRUE(raw.closed_by_peer());
  }
  {
    RawConnection raw(port);  // a length no slice can have: not drained, closed
    ASSERT_TRUE(raw.send(frame(kOpWrite, 1, id, 0, 1ull << 40)));
    EXPECT_TRUE(raw.closed_by_peer());
  }
  {
    RawConnection raw(port);  // half a header, then gone: nothing to answer
    ASSERT_TRUE(raw.send(frame(kOpRead, 1, id, 0, 16).data(), 10));
  }
  EXPECT_EQ(target->stats().remote_accesses_refused, 4u);

  // The engine still serves a normal transfer.
  auto initiator = make_engine(tcp_options("initiator", metadata));
  ASSERT_TRUE(initiator);
  std::byte* local = allocate(*initiator, kBytes);
  auto segment = initiator->open_segment("target/kv");
  ASSERT_TRUE(segment.ok());
  EXPECT_EQ(run_batch(*initiator, {{.op = TransferOp::kRead,
                                    .local_address = local,
                                    .segment = *segment,
                                    .offset_bytes = 0,
                                    .length_bytes = kBytes}})
                .completed,
            1u);
  EXPECT_TRUE(matches_pattern(local, kBytes, 51, 0));
}

// Frames sent back to back, as a lane's window goes out: answered in order, a write's payload taken across
// the target's receive buffer, a refused write's payload drained wherever it ends.
TEST(TcpTransport, PipelinedFramesAreAnsweredInOrder) {
  auto metadata = make_in_process_metadata();
  auto target = make_engine(tcp_options("target", metadata));
  ASSERT_TRUE(target);
  constexpr size_t kBytes = 1 << 20;
  std::byte* memory = allocate(*target, kBytes);
  fill_pattern(memory, kBytes, 61);
  ASSERT_TRUE(target->expose_segment("target/kv", memory, kBytes).ok());
  const auto [port, id] = tcp_endpoint(*metadata, "target/kv");
  ASSERT_NE(port, 0);

  constexpr size_t kWriteBytes = 100 << 10;  // more than the target reads at once
  std::vector<std::byte> written(kWriteBytes);
  fill_pattern(written.data(), kWriteBytes, 62, 300000);
  std::vector<std::byte> stream;
  auto append = [&stream](const std::vector<std::byte>& bytes) {
    stream.insert(stream.end(), bytes.begin(), bytes.end());
  };
  append(frame(kOpRead, 1, id, 1000, 4096));
  append(frame(kOpWrite, 2, id, 300000, kWriteBytes));
  append(written);
  append(frame(kOpRead, 3, id + 1000, 0, 16));         // unknown segment
  append(frame(kOpWrite, 4, id, kBytes - 10, 70000));  // beyond the segment: drained
  stream.resize(stream.size() + 70000, std::byte{0x5a});
  append(frame(kOpRead, 5, id, 77, 16));
  append(frame(kOpRead, 6, id, 300000, kWriteBytes));  // the write, read back

  RawConnection raw(port);
  ASSERT_TRUE(raw.connected());
  ASSERT_TRUE(raw.send(stream));
  std::vector<std::byte> payload(kWriteBytes);
  auto r = raw.response();
  ASSERT_TRUE(r.received);
  EXPECT_EQ(r.tag, 1u);
  EXPECT_EQ(r.status, 0);
  ASSERT_TRUE(raw.receive(payload.data(), 4096));
  EXPECT_TRUE(matches_pattern(payload.data(), 4096, 61, 1000));
  r = raw.response();
  EXPECT_EQ(r.tag, 2u);
  EXPECT_EQ(r.status, 0);
  r = raw.response();
  EXPECT_EQ(r.tag, 3u);
  EXPECT_NE(r.error.find("no segment with id"), std::string::npos) << r.error;
  r = raw.response();
  EXPECT_EQ(r.tag, 4u);
  EXPECT_NE(r.error.find("outside segment"), std::string::npos) << r.error;
  r = raw.response();
  EXPECT_EQ(r.tag, 5u);
  EXPECT_EQ(r.status, 0);
  ASSERT_TRUE(raw.receive(payload.data(), 16));
  EXPECT_TRUE(matches_pattern(payload.data(), 16, 61, 77));
  r = raw.response();
  EXPECT_EQ(r.tag, 6u);
  EXPECT_EQ(r.status, 0);
  ASSERT_TRUE(raw.receive(payload.data(), kWriteBytes));
  EXPECT_EQ(payload, written);
  EXPECT_EQ(target->stats().remote_accesses_refused, 2u);
}

// A segment withdrawn after it was opened: the target refuses, the request fails naming segment and peer.
// Then small requests alternately to it and to a kept segment, which lanes carry in windows: only the
// refused ones fail (their answers' texts read back to back), the others bring the right bytes.
TEST(TcpTransport, WithdrawnSegmentIsRefused) {
  auto metadata = make_in_process_metadata();
  auto target = make_engine(tcp_options("target", metadata));
  auto initiator = make_engine(tcp_options("initiator", metadata));
  ASSERT_TRUE(target && initiator);
  std::byte* remote = allocate(*target, 1 << 20);
  std::byte* local = allocate(*initiator, 1 << 20);
  fill_pattern(remote, 1 << 20, 63);
  ASSERT_TRUE(target->expose_segment("target/gone", remote, 1 << 20).ok());
  ASSERT_TRUE(target->expose_segment("target/kept", remote, 1 << 20).ok());
  auto segment = initiator->open_segment("target/gone");
  auto kept = initiator->open_segment("target/kept");
  ASSERT_TRUE(segment.ok() && kept.ok());
  ASSERT_TRUE(target->withdraw_segment("target/gone").ok());
  std::vector<std::string> errors;
  const BatchSummary summary = run_batch(*initiator,
                                         {{.op = TransferOp::kWrite,
                                           .local_address = local,
                                           .segment = *segment,
                                           .offset_bytes = 0,
                                           .length_bytes = 1 << 20}},
                                         10s, &errors);
  EXPECT_EQ(summary.failed, 1u);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("tcp: peer target 127.0.0.1:"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("target/gone"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("refused"), std::string::npos) << errors[0];
  EXPECT_EQ(target->stats().remote_accesses_refused, 2u);  // two 512 KiB slices
  EXPECT_EQ(initiator->stats().slices_retried, 0u);        // a refusal is an answer, not a lane failure

  std::vector<TransferRequest> requests;
  for (size_t i = 0; i < 64; ++i) {
    requests.push_back({.op = i % 4 == 1 ? TransferOp::kWrite : TransferOp::kRead,
                        .local_address = local + i * 4096,
                        .segment = i % 2 == 0 ? *kept : *segment,
                        .offset_bytes = i * 4096,
                        .length_bytes = 4096});
  }
  errors.clear();
  const BatchSummary mixed = run_batch(*initiator, requests, 10s, &errors);
  EXPECT_EQ(mixed.completed, 32u);
  EXPECT_EQ(mixed.failed, 32u);
  ASSERT_EQ(errors.size(), 32u);
  for (const std::string& error : errors) {
    EXPECT_NE(error.find("target/gone"), std::string::npos) << error;
    EXPECT_NE(error.find("refused by the target"), std::string::npos) << error;
  }
  for (size_t i = 0; i < 64; i += 2) {
    EXPECT_TRUE(matches_pattern(local + i * 4096, 4096, 63, i * 4096)) << "request " << i;
  }
  EXPECT_EQ(target->stats().remote_accesses_refused, 2u + 32u);
  EXPECT_EQ(initiator->stats().slices_retried, 0u);
}

// break_tcp_lane_for_testing on lanes that are not connected.
TEST(TcpTransport, BreakLaneNeedsAConnectedLane) {
  auto metadata = make_in_process_metadata();
  auto target = make_engine(tcp_options("target", metadata));
  auto initiator = make_engine(tcp_options("initiator", metadata));
  ASSERT_TRUE(target && initiator);
  std::byte* remote = allocate(*target, 1 << 20);
  std::byte* local = allocate(*initiator, 1 << 20);
  ASSERT_TRUE(target->expose_segment("target/kv", remote, 1 << 20).ok());
  auto segment = initiator->open_segment("target/kv");
  ASSERT_TRUE(segment.ok());
  EXPECT_EQ(initiator->break_tcp_lane_for_testing(*segment, 0).code(),
            StatusCode::kNotFound);  // lazy connect
  EXPECT_EQ(initiator->break_tcp_lane_for_testing(*segment, 99).code(), StatusCode::kNotFound);
  const TransferRequest read{.op = TransferOp::kRead,
                             .local_address = local,
                             .segment = *segment,
                             .offset_bytes = 0,
                             .length_bytes = 1 << 20};
  EXPECT_EQ(run_batch(*initiator, {read}).completed, 1u);
  // Some lane carried it and is connected now; breaking an idle lane costs no retry: the lane notices the
  // dead connection when it wakes for its next slice and reconnects. (The pause lets the lanes that just
  // finished go idle; a lane broken between two slices of a busy queue would retry, as it should.)
  std::this_thread::sleep_for(50ms);
  int broken = 0;
  for (int lane = 0; lane < 4; ++lane) broken += initiator->break_tcp_lane_for_testing(*segment, lane).ok();
  EXPECT_GT(broken, 0);
  EXPECT_EQ(run_batch(*initiator, {read}).completed, 1u);
  EXPECT_EQ(initiator->stats().slices_retried, 0u);
}

// max_endpoints = 1 with two peers used alternately: both work, and each switch evicts the idle other.
TEST(TcpTransport, EndpointCapEvictsIdlePeer) {
  auto metadata = make_in_process_metadata();
  auto first = make_engine(tcp_options("first", metadata));
  auto second = make_engine(tcp_options("second", metadata));
  EngineOptions options = tcp_options("initiator", metadata);
  options.failure.max_endpoints = 1;
  auto initiator = make_engine(options);
  ASSERT_TRUE(first && second && initiator);
  constexpr size_t kBytes = 4 << 20;
  std::byte* a = allocate(*first, kBytes);
  std::byte* b = allocate(*second, kBytes);
  std::byte* local = allocate(*initiator, kBytes);
  fill_pattern(a, kBytes, 61);
  fill_pattern(b, kBytes, 62);
  ASSERT_TRUE(first->expose_segment("first/kv", a, kBytes).ok());
  ASSERT_TRUE(second->expose_segment("second/kv", b, kBytes).ok());
  auto to_first = initiator->open_segment("first/kv");
  auto to_second = initiator->open_segment("second/kv");
  ASSERT_TRUE(to_first.ok() && to_second.ok());
  for (int round = 0; round < 4; ++round) {
    const bool use_first = round % 2 == 0;
    const BatchSummary summary = run_batch(*initiator, {{.op = TransferOp::kRead,
                                                         .local_address = local,
                                                         .segment = use_first ? *to_first : *to_second,
                                                         .offset_bytes = 0,
                                                         .length_bytes = kBytes}});
    ASSERT_EQ(summary.completed, 1u);
    ASSERT_TRUE(matches_pattern(local, kBytes, use_first ? 61 : 62, 0));
  }
  EXPECT_EQ(initiator->stats().endpoints_evicted, 3u);
  EXPECT_EQ(initiator->stats().slices_retried, 0u);
}

}  // namespace
}  // namespace crescent::transfer
