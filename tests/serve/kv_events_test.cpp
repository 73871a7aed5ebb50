#include "serve/kv_events.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <msgpack.hpp>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "conductor/cluster_state.h"

namespace crescent::serve {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

KvEventBatch sample_batch(BlockKey first) {
  KvEventBatch batch;
  batch.timestamp_s = 1700000000.25;
  KvEvent stored;
  stored.kind = KvEvent::Kind::kStored;
  stored.block_hashes = {first, first + 1};
  stored.parent_block_hash = 7;
  stored.token_ids = {1, 2, 3, 4};
  stored.block_size = 2;
  stored.medium = "CPU";
  KvEvent removed;
  removed.kind = KvEvent::Kind::kRemoved;
  removed.block_hashes = {0xFFFFFFFFFFFFFFFFull};
  KvEvent cleared;
  cleared.kind = KvEvent::Kind::kAllCleared;
  batch.events = {stored, removed, cleared};
  batch.data_parallel_rank = 0;
  return batch;
}

TEST(KvEvents, EncodeDecodeRoundTripsEveryEventKind) {
  const KvEventBatch batch = sample_batch(100);
  auto decoded = decode_kv_event_batch(encode_kv_event_batch(batch));
  ASSERT_TRUE(decoded.ok()) << decoded.status().message();
  EXPECT_DOUBLE_EQ(decoded->timestamp_s, batch.timestamp_s);
  ASSERT_EQ(decoded->events.size(), 3u);
  const KvEvent& s = decoded->events[0];
  EXPECT_EQ(s.kind, KvEvent::Kind::kStored);
  EXPECT_THAT(s.block_hashes, ElementsAre(100u, 101u));
  EXPECT_EQ(s.parent_block_hash, 7u);
  EXPECT_THAT(s.token_ids, ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(s.block_size, 2);
  EXPECT_EQ(s.medium, "CPU");
  EXPECT_EQ(decoded->events[1].kind, KvEvent::Kind::kRemoved);
  EXPECT_THAT(decoded->events[1].block_hashes, ElementsAre(0xFFFFFFFFFFFFFFFFull));
  EXPECT_FALSE(decoded->events[1].medium.has_value());
  EXPECT_EQ(decoded->events[2].kind, KvEvent::Kind::kAllCleared);
  EXPECT_EQ(decoded->data_parallel_rank, 0);
}

TEST(KvEvents, ReadsWhatVllmSendsAndNamesWhatIsMalformed) {
  // As vLLM's msgspec encodes it: arrays, a BlockStored with one more trailing field, hashes as bytes.
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pk(buffer);
  pk.pack_array(2);
  pk.pack_double(5.5);
  pk.pack_array(1);
  pk.pack_array(8);
  pk.pack(std::string_view("BlockStored"));
  pk.pack_array(1);
  const char hash[8] = {0, 0, 0, 0, 0, 0, 1, 2};
  pk.pack_bin(8);
  pk.pack_bin_body(hash, 8);
  pk.pack_nil();
  pk.pack_array(0);
  pk.pack(16);
  pk.pack_nil();
  pk.pack(std::string_view("GPU"));
  pk.pack(std::string_view("lora-name"));
  auto decoded = decode_kv_event_batch(std::string_view(buffer.data(), buffer.size()));
  ASSERT_TRUE(decoded.ok()) << decoded.status().message();
  EXPECT_THAT(decoded->events[0].block_hashes, ElementsAre(0x102u));
  EXPECT_FALSE(decoded->data_parallel_rank.has_value());

  EXPECT_THAT(decode_kv_event_batch("\xc1 junk").status().message(), HasSubstr("not msgpack"));
  EXPECT_THAT(decode_kv_event_batch("\x05 junk").status().message(), HasSubstr("bytes after the batch"));
  EXPECT_THAT(decode_kv_event_batch("\x05").status().message(), HasSubstr("expected an array"));
  msgpack::sbuffer wrong;
  msgpack::packer<msgpack::sbuffer> w(wrong);
  w.pack_array(2);
  w.pack_double(1);
  w.pack_array(1);
  w.pack_array(1);
  w.pack(std::string_view("BlockExploded"));
  EXPECT_THAT(decode_kv_event_batch(std::string_view(wrong.data(), wrong.size())).status().message(),
              HasSubstr("unknown event tag 'BlockExploded'"));
}

TEST(KvEvents, ApplyingThemKeepsTheClusterStatesIndex) {
  conductor::ClusterState state(2, 1, 512, 1000);
  apply_kv_events(sample_batch(100), 1, state, 3.0);  // stored 100, 101; removed one; then all cleared
  EXPECT_EQ(state.block_index().blocks(), 0);
  KvEventBatch stored;
  KvEvent event;
  event.block_hashes = {5, 6};
  event.block_size = 512;
  stored.events.push_back(event);
  apply_kv_events(stored, 0, state, 4.0);
  EXPECT_THAT(state.block_index().holders(6), ElementsAre(0u));
  EXPECT_DOUBLE_EQ(state.prefix_ready_s(0, std::vector<BlockKey>{5, 6}), 4.0);
}

// Polls until `n` batches arrived or 5 s passed.
std::vector<uint64_t> receive(KvEventSubscriber& sub, size_t n,
                              std::vector<std::pair<uint64_t, uint64_t>>* gaps,
                              std::vector<BlockKey>* firsts = nullptr) {
  std::vector<uint64_t> seqs;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (seqs.size() < n && std::chrono::steady_clock::now() < deadline) {
    sub.poll(
        std::chrono::milliseconds(50),
        [&](uint64_t seq, const KvEventBatch& batch) {
          seqs.push_back(seq);
          if (firsts) firsts->push_back(batch.events[0].block_hashes[0]);
        },
        [&](uint64_t from, uint64_t to) {
          if (gaps) gaps->emplace_back(from, to);
        });
  }
  return seqs;
}

TEST(KvEvents, ASubscriberGetsEveryBatchInOrderReplayingWhatItMissed) {
  auto pub = KvEventPublisher::start("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "kv@prefill-0");
  ASSERT_TRUE(pub.ok()) << pub.status().message();
  // Published before anyone subscribed: the subscriber must replay them.
  for (BlockKey i = 0; i < 5; ++i) (*pub)->publish(sample_batch(1000 + i));
  auto sub = KvEventSubscriber::connect((*pub)->endpoint(), (*pub)->replay_endpoint(), "kv@prefill-0");
  ASSERT_TRUE(sub.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the SUB socket joins
  for (BlockKey i = 5; i < 10; ++i) (*pub)->publish(sample_batch(1000 + i));
  std::vector<std::pair<uint64_t, uint64_t>> gaps;
  std::vector<BlockKey> firsts;
  const auto seqs = receive(**sub, 10, &gaps, &firsts);
  EXPECT_THAT(seqs, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  EXPECT_EQ(firsts.front(), 1000u);
  EXPECT_EQ(firsts.back(), 1009u);
  EXPECT_TRUE(gaps.empty());
  EXPECT_EQ((*sub)->malformed(), 0u);
}

TEST(KvEvents, AGapTheReplayBufferNoLongerHoldsIsReported) {
  auto pub = KvEventPublisher::start("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "", /*buffer_batches=*/3);
  ASSERT_TRUE(pub.ok());
  for (BlockKey i = 0; i < 8; ++i) (*pub)->publish(sample_batch(i));
  auto sub = KvEventSubscriber::connect((*pub)->endpoint(), (*pub)->replay_endpoint());
  ASSERT_TRUE(sub.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  (*pub)->publish(sample_batch(8));
  std::vector<std::pair<uint64_t, uint64_t>> gaps;
  const auto seqs = receive(**sub, 3, &gaps);
  // The buffer holds the last 3 (6, 7, 8): 0-5 are reported as a gap, then 6-8 come in order.
  EXPECT_THAT(seqs, ElementsAre(6, 7, 8));
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0], std::make_pair(uint64_t{0}, uint64_t{6}));
}

// What was published before a subscriber connected, with nothing published since, is seen at once by
// catch_up (poll() alone would wait for a later batch to show the gap): a Conductor learns an instance's full
// cache report without waiting for its next event. A gap before the buffer's oldest batch is reported.
TEST(KvEvents, CatchingUpGetsWhatWasPublishedBeforeWithoutALaterBatch) {
  auto pub = KvEventPublisher::start("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "", /*buffer_batches=*/3);
  ASSERT_TRUE(pub.ok());
  for (BlockKey i = 0; i < 5; ++i) (*pub)->publish(sample_batch(100 + i));
  auto sub = KvEventSubscriber::connect((*pub)->endpoint(), (*pub)->replay_endpoint());
  ASSERT_TRUE(sub.ok());
  std::vector<uint64_t> seqs;
  std::vector<std::pair<uint64_t, uint64_t>> gaps;
  const auto on_batch = [&](uint64_t seq, const KvEventBatch&) { seqs.push_back(seq); };
  const auto on_gap = [&](uint64_t from, uint64_t to) { gaps.emplace_back(from, to); };
  (*sub)->poll(std::chrono::milliseconds(300), on_batch, on_gap);
  EXPECT_TRUE(seqs.empty()) << "poll alone sees nothing: no batch came since it connected";
  (*sub)->catch_up(on_batch, on_gap);
  EXPECT_THAT(seqs, ElementsAre(2, 3, 4));
  EXPECT_THAT(gaps, ElementsAre(std::make_pair(uint64_t{0}, uint64_t{2})));
  // Caught up: a second call gets nothing new, and the next batch comes once, in order.
  (*sub)->catch_up(on_batch, on_gap);
  EXPECT_THAT(seqs, ElementsAre(2, 3, 4));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the SUB socket joins
  (*pub)->publish(sample_batch(105));
  for (int i = 0; i < 50 && seqs.size() < 4; ++i)
    (*sub)->poll(std::chrono::milliseconds(20), on_batch, on_gap);
  EXPECT_THAT(seqs, ElementsAre(2, 3, 4, 5));
  EXPECT_EQ(gaps.size(), 1u);
}

// The wire's 8-byte big-endian sequence number.
std::string seq_frame(int64_t seq) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>(static_cast<uint64_t>(seq) >> (56 - 8 * i));
  return out;
}

// A replay that answers after the subscriber gave up (2 s) must not be read as the answer to its next replay
// request. The publisher here is played by hand: a PUB socket and a ROUTER that answers late the first time.
TEST(KvEvents, ALateReplayIsNotTakenForTheNextOne) {
  zmq::context_t context;
  zmq::socket_t pub(context, zmq::socket_type::pub), router(context, zmq::socket_type::router);
  pub.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::linger, 0);
  pub.bind("tcp://127.0.0.1:*");
  router.bind("tcp://127.0.0.1:*");
  auto sub = KvEventSubscriber::connect(pub.get(zmq::sockopt::last_endpoint),
                                        router.get(zmq::sockopt::last_endpoint));
  ASSERT_TRUE(sub.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the SUB socket joins
  const auto publish = [&](int64_t seq) {
    const std::string payload = encode_kv_event_batch(sample_batch(static_cast<BlockKey>(100 * seq)));
    pub.send(zmq::buffer(std::string()), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(seq_frame(seq)), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(payload), zmq::send_flags::none);
  };
  // Answers one replay request with `seqs`, then the end marker.
  const auto answer = [&](std::vector<int64_t> seqs) {
    std::vector<zmq::message_t> request;
    ASSERT_TRUE(zmq::recv_multipart(router, std::back_inserter(request)));
    const std::string client(static_cast<const char*>(request[0].data()), request[0].size());
    seqs.push_back(-1);
    for (int64_t seq : seqs) {
      const std::string payload =
          seq < 0 ? std::string() : encode_kv_event_batch(sample_batch(static_cast<BlockKey>(100 * seq)));
      router.send(zmq::buffer(client), zmq::send_flags::sndmore);
      router.send(zmq::message_t(), zmq::send_flags::sndmore);
      router.send(zmq::buffer(seq_frame(seq)), zmq::send_flags::sndmore);
      router.send(zmq::buffer(payload), zmq::send_flags::none);
    }
  };
  std::vector<std::pair<uint64_t, uint64_t>> gaps;
  std::vector<uint64_t> seqs;
  const auto poll = [&] {
    (*sub)->poll(
        std::chrono::milliseconds(100), [&](uint64_t seq, const KvEventBatch&) { seqs.push_back(seq); },
        [&](uint64_t from, uint64_t to) { gaps.emplace_back(from, to); });
  };
  publish(0);
  poll();
  // 1 is lost; 2 makes the subscriber ask for it, and the answer comes only after it gave up.
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // the subscriber gives up after 2 s
    answer({1});
  });
  publish(2);
  poll();
  late.join();
  EXPECT_THAT(gaps, ElementsAre(std::make_pair(uint64_t{1}, uint64_t{2})));
  // 3 is lost; 4 makes it ask again, and this time the answer is prompt: 3 must be delivered, not a gap.
  std::thread prompt([&] { answer({3}); });
  publish(4);
  poll();
  prompt.join();
  EXPECT_THAT(seqs, ElementsAre(0, 2, 3, 4));
  EXPECT_EQ(gaps.size(), 1u);
}

}  // namespace
}  // namespace crescent::serve
