// The engine's API contract: registration, segments, batches, and the errors bad calls get.
#include "transfer/transfer_engine.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "test_util.h"

namespace crescent::transfer {
namespace {

using namespace std::chrono_literals;

class TransferEngineTest : public testing::Test {
 protected:
  void SetUp() override {
    metadata_ = make_in_process_metadata();
    a_ = TransferEngine::create({.name = "a", .metadata = metadata_, .transports = {TransportKind::kShm}})
             .value();
    b_ = TransferEngine::create({.name = "b", .metadata = metadata_, .transports = {TransportKind::kShm}})
             .value();
  }

  std::shared_ptr<MetadataService> metadata_;
  std::unique_ptr<TransferEngine> a_, b_;
};

TEST_F(TransferEngineTest, OptionsAreChecked) {
  EXPECT_EQ(TransferEngine::create({.name = "", .metadata = metadata_}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(TransferEngine::create({.name = "c"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TransferEngine::create({.name = "c", .metadata = metadata_, .transports = {}}).status().code(),
            StatusCode::kInvalidArgument);
  EngineOptions twice{
      .name = "c", .metadata = metadata_, .transports = {TransportKind::kShm, TransportKind::kShm}};
  EXPECT_EQ(TransferEngine::create(twice).status().code(), StatusCode::kInvalidArgument);
  EngineOptions lanes{.name = "c", .metadata = metadata_};
  lanes.tcp.lanes_per_peer = 0;
  EXPECT_NE(TransferEngine::create(lanes).status().message().find("lanes_per_peer"), std::string::npos);
  // A taken name is refused, and the refusal leaves the owner's claim alone.
  EXPECT_EQ(TransferEngine::create({.name = "a", .metadata = metadata_}).status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(metadata_->claim_engine("a").code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(parse_transport("rdma").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_transport("ucx").value(), TransportKind::kUcx);
}

TEST_F(TransferEngineTest, OverlappingRegionsAreRefused) {
  std::vector<std::byte> memory(1 << 16);
  std::byte* base = memory.data();
  ASSERT_TRUE(a_->register_memory(base + 4096, 8192).ok());
  EXPECT_EQ(a_->register_memory(base + 4096, 8192).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(a_->register_memory(base, 4097).code(), StatusCode::kAlreadyExists);        // overlaps its start
  EXPECT_EQ(a_->register_memory(base + 12287, 10).code(), StatusCode::kAlreadyExists);  // its end
  EXPECT_EQ(a_->register_memory(base + 5000, 10).code(), StatusCode::kAlreadyExists);   // inside
  EXPECT_EQ(a_->register_memory(base, 1 << 16).code(), StatusCode::kAlreadyExists);     // around
  EXPECT_TRUE(a_->register_memory(base, 4096).ok());                                    // adjacent: fine
  EXPECT_TRUE(a_->register_memory(base + 12288, 4096).ok());
  EXPECT_EQ(a_->register_memory(nullptr, 10).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->register_memory(base + 20000, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->register_memory(reinterpret_cast<void*>(UINTPTR_MAX - 10), 100).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->unregister_memory(base + 1).code(), StatusCode::kNotFound);
  EXPECT_TRUE(a_->unregister_memory(base + 4096).ok());
  EXPECT_TRUE(a_->register_memory(base + 4096, 8192).ok());  // free again once unregistered
}

TEST_F(TransferEngineTest, SegmentsMustLieInRegisteredMemory) {
  std::vector<std::byte> memory(8192);
  EXPECT_EQ(a_->expose_segment("a/kv", memory.data(), 4096).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(a_->register_memory(memory.data(), memory.size()).ok());
  // Plain memory cannot be mapped by a peer: shm alone cannot serve it.
  EXPECT_EQ(a_->expose_segment("a/kv", memory.data(), 4096).code(), StatusCode::kInvalidArgument);
  void* shared = a_->allocate_memory(10000).value();
  EXPECT_EQ(a_->expose_segment("a/kv", shared, 1 << 20).code(), StatusCode::kInvalidArgument);  // beyond it
  ASSERT_TRUE(a_->expose_segment("a/kv", static_cast<std::byte*>(shared) + 100, 5000).ok());
  EXPECT_EQ(a_->expose_segment("a/kv", shared, 100).code(), StatusCode::kAlreadyExists);
  void* other = b_->allocate_memory(4096).value();
  EXPECT_EQ(b_->expose_segment("a/kv", other, 4096).code(),
            StatusCode::kAlreadyExists);                                       // another owner's name
  EXPECT_EQ(a_->free_memory(shared).code(), StatusCode::kFailedPrecondition);  // still exposed
  EXPECT_EQ(a_->unregister_memory(shared).code(),
            StatusCode::kInvalidArgument);  // allocate_memory's: free it
  EXPECT_EQ(b_->open_segment("a/kv").value(), 0u);
  EXPECT_EQ(b_->open_segment("a/kv").value(), 0u);  // the same segment again: the same handle
  EXPECT_EQ(b_->open_segment("missing").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(a_->withdraw_segment("a/kv").ok());
  EXPECT_EQ(a_->withdraw_segment("a/kv").code(), StatusCode::kNotFound);
  EXPECT_EQ(b_->open_segment("a/kv").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(a_->expose_segment("a/kv", shared, 200).ok());  // re-exposed elsewhere: a new handle
  EXPECT_EQ(b_->open_segment("a/kv").value(), 1u);
  ASSERT_TRUE(a_->withdraw_segment("a/kv").ok());
  EXPECT_TRUE(a_->free_memory(shared).ok());
  EXPECT_EQ(a_->free_memory(shared).code(), StatusCode::kNotFound);
}

TEST_F(TransferEngineTest, BadRequestsAreRefusedWholeBatchAtATime) {
  auto* remote = static_cast<std::byte*>(a_->allocate_memory(1 << 20).value());
  test::fill_pattern(remote, 1 << 20, 1);
  ASSERT_TRUE(a_->expose_segment("a/kv", remote, 1 << 20).ok());
  auto* local = static_cast<std::byte*>(b_->allocate_memory(1 << 20).value());
  const SegmentHandle segment = b_->open_segment("a/kv").value();
  const BatchId batch = b_->allocate_batch(4).value();
  std::vector<std::byte> unregistered(16);

  const TransferRequest good{.op = TransferOp::kRead,
                             .local_address = local,
                             .segment = segment,
                             .offset_bytes = 0,
                             .length_bytes = 4096};
  auto with = [&](auto change) {
    std::vector<TransferRequest> requests = {good, good};
    change(requests[1]);
    return b_->submit(batch, requests);
  };
  auto expect_refused = [&](const Status& status, const char* needle) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_NE(status.message().find("request 1"), std::string::npos) << status.to_string();
    EXPECT_NE(status.message().find(needle), std::string::npos) << status.to_string();
  };
  expect_refused(with([](auto& r) { r.length_bytes = 0; }), "zero length");
  expect_refused(with([&](auto& r) { r.local_address = unregistered.data(); }),
                 "not inside registered memory");
  expect_refused(with([&](auto& r) { r.local_address = local + (1 << 20) - 10; }),
                 "not inside registered memory");
  expect_refused(with([](auto& r) { r.segment = 99; }), "unknown segment handle");
  expect_refused(with([](auto& r) { r.offset_bytes = (1 << 20) - 100; }), "outside segment");
  expect_refused(with([](auto& r) { r.offset_bytes = UINT64_MAX - 10; }), "outside segment");
  EXPECT_EQ(b_->wait(batch, 0ms).value().submitted, 0u);  // nothing of a refused call was submitted

  std::vector<TransferRequest> five(5, good);
  EXPECT_EQ(b_->submit(batch, five).code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(b_->submit(batch, std::vector<TransferRequest>(4, good)).ok());
  EXPECT_EQ(b_->submit(batch, std::vector<TransferRequest>(1, good)).code(), StatusCode::kOutOfRange);
  const BatchSummary summary = b_->wait(batch, 10s).value();
  EXPECT_EQ(summary.completed, 4u);
  EXPECT_EQ(b_->status(batch, 3).value().state, TransferState::kCompleted);
  EXPECT_EQ(b_->status(batch, 4).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(std::memcmp(local, remote, 4096), 0);
  ASSERT_TRUE(b_->free_batch(batch).ok());
  // A freed batch is gone for every call.
  EXPECT_EQ(b_->submit(batch, std::vector<TransferRequest>(1, good)).code(), StatusCode::kNotFound);
  EXPECT_EQ(b_->status(batch, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(b_->wait(batch, 0ms).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(b_->free_batch(batch).code(), StatusCode::kNotFound);
  EXPECT_EQ(b_->allocate_batch(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b_->stats().requests_completed, 4u);
  EXPECT_EQ(b_->stats().bytes_transferred, 4u * 4096);
}

TEST_F(TransferEngineTest, ShmPeerThatExitedFailsRequests) {
  test::TempDir dir;
  test::PeerProcess peer;
  std::string error;
  ASSERT_TRUE(peer.start(dir.path(), "peer", "peer/kv", 1 << 20, 3, {"shm", TransportKind::kShm, ""}, &error))
      << error;
  auto metadata = make_directory_metadata(dir.path()).value();
  auto engine =
      TransferEngine::create({.name = "me", .metadata = metadata, .transports = {TransportKind::kShm}});
  ASSERT_TRUE(engine.ok());
  auto* local = static_cast<std::byte*>((*engine)->allocate_memory(1 << 20).value());
  const SegmentHandle segment = (*engine)->open_segment("peer/kv").value();
  const std::vector<TransferRequest> read = {{.op = TransferOp::kRead,
                                              .local_address = local,
                                              .segment = segment,
                                              .offset_bytes = 0,
                                              .length_bytes = 1 << 20}};
  BatchId batch = (*engine)->allocate_batch(1).value();
  ASSERT_TRUE((*engine)->submit(batch, read).ok());
  EXPECT_EQ((*engine)->wait(batch, 10s).value().completed, 1u);
  EXPECT_EQ(test::checksum(local, 1 << 20), peer.remote_checksum(0, 1 << 20));
  peer.kill_now();
  batch = (*engine)->allocate_batch(1).value();
  ASSERT_TRUE((*engine)->submit(batch, read).ok());
  EXPECT_EQ((*engine)->wait(batch, 10s).value().failed, 1u);
  EXPECT_NE((*engine)->status(batch, 0).value().error.find("exited"), std::string::npos);
}

// A TCP peer that accepts connections and never answers: requests stay pending until their deadline.
TEST(TransferEngineHungPeerTest, PendingBatchCannotBeFreedAndTimesOut) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 16), 0);
  socklen_t length = sizeof(address);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);

  auto metadata = make_in_process_metadata();
  ASSERT_TRUE(metadata->claim_engine("hung").ok());
  ASSERT_TRUE(
      metadata
          ->publish(
              {.name = "hung/kv",
               .engine = "hung",
               .host_id = "elsewhere",
               .length_bytes = 1 << 20,
               .transports =
                   {{"tcp", {{"host", "127.0.0.1"}, {"port", ntohs(address.sin_port)}, {"segment_id", 1}}}}})
          .ok());
  EngineOptions options{.name = "me", .metadata = metadata, .transports = {TransportKind::kTcp}};
  options.failure.request_timeout = 1500ms;
  auto engine = TransferEngine::create(options).value();
  auto* local = static_cast<std::byte*>(engine->allocate_memory(1 << 20).value());
  const SegmentHandle segment = engine->open_segment("hung/kv").value();
  const BatchId batch = engine->allocate_batch(2).value();
  const std::vector<TransferRequest> reads(2, {.op = TransferOp::kRead,
                                               .local_address = local,
                                               .segment = segment,
                                               .offset_bytes = 0,
                                               .length_bytes = 4096});
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(engine->submit(batch, reads).ok());
  EXPECT_EQ(engine->status(batch, 0).value().state, TransferState::kPending);
  EXPECT_EQ(engine->free_batch(batch).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->unregister_memory(local).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->free_memory(local).code(), StatusCode::kFailedPrecondition);  // requests use it
  // milliseconds::max() must mean "until done", not overflow the clock and return at once.
  const BatchSummary summary = engine->wait(batch, std::chrono::milliseconds::max()).value();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(summary.failed, 2u);
  EXPECT_LT(elapsed, 1500ms + 1500ms);
  EXPECT_TRUE(engine->free_batch(batch).ok());
  EXPECT_TRUE(engine->free_memory(local).ok());
  ::close(listener);
}

}  // namespace
}  // namespace crescent::transfer
