// End-to-end correctness over every transport: two engines in one process and in two processes, random
// sizes 1 B .. 64 MiB at unaligned offsets, batches of 1 .. 1,024, reads and writes; every byte checked by
// XXH3 checksums computed where the bytes landed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>

#include "test_util.h"
#include "transfer/transfer_engine.h"

namespace crescent::transfer {
namespace {

using test::TransportCase;

constexpr uint64_t kSegmentBytes = 160ull << 20;
constexpr uint64_t kLocalBytes = 160ull << 20;
constexpr uint64_t kMaxRequestBytes = 64ull << 20;

struct Placement {
  uint64_t local_offset;
  uint64_t remote_offset;
  uint64_t length;
};

// `count` non-overlapping requests with log-uniform sizes in [1, max_bytes] at unaligned offsets, each
// within [0, kSegmentBytes) remotely and [0, kLocalBytes) locally.
std::vector<Placement> random_layout(std::mt19937_64& rng, size_t count, uint64_t max_bytes) {
  const uint64_t per_request = std::min<uint64_t>(max_bytes, kSegmentBytes / count - 64);
  std::uniform_real_distribution<double> log_size(0.0, std::log(static_cast<double>(per_request)));
  std::uniform_int_distribution<uint64_t> gap(0, 63);
  std::vector<Placement> layout;
  uint64_t local = gap(rng), remote = gap(rng);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t length =
        std::clamp<uint64_t>(static_cast<uint64_t>(std::exp(log_size(rng))), 1, per_request);
    layout.push_back({local, remote, length});
    local += length + gap(rng);
    remote += length + gap(rng);
  }
  std::shuffle(layout.begin(), layout.end(), rng);  // submission order differs from address order
  return layout;
}

// The target side of a test: where the segment lives and how to checksum what landed there.
class Target {
 public:
  virtual ~Target() = default;
  virtual uint64_t checksum(uint64_t offset, uint64_t length) = 0;
};

class InProcessTarget final : public Target {
 public:
  explicit InProcessTarget(const std::byte* data) : data_(data) {}
  uint64_t checksum(uint64_t offset, uint64_t length) override {
    return test::checksum(data_ + offset, length);
  }

 private:
  const std::byte* data_;
};

class PeerTarget final : public Target {
 public:
  explicit PeerTarget(test::PeerProcess* peer) : peer_(peer) {}
  uint64_t checksum(uint64_t offset, uint64_t length) override {
    return peer_->remote_checksum(offset, length);
  }

 private:
  test::PeerProcess* peer_;
};

enum class Mode { kInProcess, kTwoProcesses };

class TransferCorrectnessTest : public testing::TestWithParam<std::tuple<TransportCase, Mode>> {
 protected:
  void SetUp() override {
    const auto& [transport, mode] = GetParam();
    const EngineOptions base{.transports = {transport.kind}};
    auto options_for = [&](std::string name, std::shared_ptr<MetadataService> metadata) {
      EngineOptions options = base;
      options.name = std::move(name);
      options.metadata = std::move(metadata);
      options.ucx.tls = transport.ucx_tls;
      options.failure.request_timeout = std::chrono::seconds(60);
      return options;
    };
    if (mode == Mode::kInProcess) {
      auto metadata = make_in_process_metadata();
      auto target = TransferEngine::create(options_for("target", metadata));
      ASSERT_TRUE(target.ok()) << target.status().to_string();
      target_engine_ = std::move(target).value();
      auto memory = target_engine_->allocate_memory(kSegmentBytes);
      ASSERT_TRUE(memory.ok()) << memory.status().to_string();
      test::fill_pattern(static_cast<std::byte*>(*memory), kSegmentBytes, /*seed=*/7);
      ASSERT_TRUE(target_engine_->expose_segment("target/kv", *memory, kSegmentBytes).ok());
      target_ = std::make_unique<InProcessTarget>(static_cast<std::byte*>(*memory));
      initiator_ = TransferEngine::create(options_for("initiator", metadata)).value();
    } else {
      auto metadata = make_directory_metadata(dir_.path());
      ASSERT_TRUE(metadata.ok());
      std::string error;
      ASSERT_TRUE(peer_.start(dir_.path(), "target", "target/kv", kSegmentBytes, 7, transport, &error))
          << error;
      target_ = std::make_unique<PeerTarget>(&peer_);
      auto initiator = TransferEngine::create(options_for("initiator", *metadata));
      ASSERT_TRUE(initiator.ok()) << initiator.status().to_string();
      initiator_ = std::move(initiator).value();
    }
    auto local = initiator_->allocate_memory(kLocalBytes);
    ASSERT_TRUE(local.ok());
    local_ = static_cast<std::byte*>(*local);
    auto segment = initiator_->open_segment("target/kv");
    ASSERT_TRUE(segment.ok()) << segment.status().to_string();
    segment_ = *segment;
    ASSERT_EQ(initiator_->segment_transport(segment_).value(), transport.kind);
  }

  // Submits `layout` as one batch of `op`s, waits, and checks every request completed.
  void run_batch(TransferOp op, const std::vector<Placement>& layout) {
    std::vector<TransferRequest> requests;
    for (const Placement& p : layout) {
      requests.push_back({.op = op,
                          .local_address = local_ + p.local_offset,
                          .segment = segment_,
                          .offset_bytes = p.remote_offset,
                          .length_bytes = p.length});
    }
    const BatchId batch = initiator_->allocate_batch(requests.size()).value();
    ASSERT_TRUE(initiator_->submit(batch, requests).ok());
    const BatchSummary summary = initiator_->wait(batch, std::chrono::seconds(120)).value();
    ASSERT_EQ(summary.completed, requests.size())
        << "failed " << summary.failed << ", first error: " << first_error(batch, requests.size());
    ASSERT_TRUE(initiator_->free_batch(batch).ok());
  }

  std::string first_error(BatchId batch, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      auto status = initiator_->status(batch, i);
      if (status.ok() && status->state == TransferState::kFailed) return status->error;
    }
    return "none";
  }

  // Reads `layout` and checks each local range against the target's bytes.
  void check_reads(const std::vector<Placement>& layout) {
    run_batch(TransferOp::kRead, layout);
    for (const Placement& p : layout) {
      ASSERT_EQ(test::checksum(local_ + p.local_offset, p.length),
                target_->checksum(p.remote_offset, p.length))
          << "read of " << p.length << " bytes at remote offset " << p.remote_offset;
    }
  }

  // Fills the local ranges of `layout` with fresh bytes, writes them, and checks each remote range.
  void check_writes(const std::vector<Placement>& layout, uint64_t seed) {
    for (const Placement& p : layout)
      test::fill_pattern(local_ + p.local_offset, p.length, seed, p.local_offset);
    run_batch(TransferOp::kWrite, layout);
    for (const Placement& p : layout) {
      ASSERT_EQ(target_->checksum(p.remote_offset, p.length),
                test::checksum(local_ + p.local_offset, p.length))
          << "write of " << p.length << " bytes at remote offset " << p.remote_offset;
    }
  }

  test::TempDir dir_;
  test::PeerProcess peer_;
  std::unique_ptr<TransferEngine> target_engine_;
  std::unique_ptr<TransferEngine> initiator_;
  std::unique_ptr<Target> target_;
  std::byte* local_ = nullptr;
  SegmentHandle segment_ = 0;
};

TEST_P(TransferCorrectnessTest, LargestRequestAtUnalignedOffsets) {
  const std::vector<Placement> one = {
      {.local_offset = 13, .remote_offset = 4099, .length = kMaxRequestBytes}};
  check_reads(one);
  check_writes(one, /*seed=*/11);
}

TEST_P(TransferCorrectnessTest, RandomSizesAndBatches) {
  std::mt19937_64 rng(42);
  for (size_t batch : {1, 7, 64}) {
    check_reads(random_layout(rng, batch, kMaxRequestBytes));
    check_writes(random_layout(rng, batch, kMaxRequestBytes), /*seed=*/100 + batch);
  }
}

TEST_P(TransferCorrectnessTest, BatchOf1024SmallRequests) {
  std::mt19937_64 rng(1024);
  check_reads(random_layout(rng, 1024, 64 << 10));
  check_writes(random_layout(rng, 1024, 64 << 10), /*seed=*/3);
}

TEST_P(TransferCorrectnessTest, SingleBytes) {
  const std::vector<Placement> bytes = {{0, 0, 1}, {5, kSegmentBytes - 1, 1}, {9, 12345, 1}};
  check_reads(bytes);
  check_writes(bytes, /*seed=*/5);
}

std::string case_name(const testing::TestParamInfo<std::tuple<TransportCase, Mode>>& info) {
  return std::get<0>(info.param).label +
         (std::get<1>(info.param) == Mode::kInProcess ? "_in_process" : "_two_processes");
}

INSTANTIATE_TEST_SUITE_P(AllTransports, TransferCorrectnessTest,
                         testing::Combine(testing::ValuesIn(test::all_transport_cases()),
                                          testing::Values(Mode::kInProcess, Mode::kTwoProcesses)),
                         case_name);

}  // namespace
}  // namespace crescent::transfer
