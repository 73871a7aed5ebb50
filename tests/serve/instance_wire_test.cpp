// The multi-process cluster's control messages and KV block bytes.
#include "serve/instance_wire.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "cluster/cluster.h"
#include "serve/kv_blocks.h"

namespace crescent::serve {
namespace {

TEST(InstanceWire, EveryFieldSurvivesTheRoundTrip) {
  InstanceMessage m;
  m.kind = InstanceMessage::Kind::kPrefillDone;
  m.request_id = 1ull << 40;
  m.role = InstanceRole::kDecode;
  m.index = 3;
  m.incarnation = 99;
  m.kv_events_endpoint = "tcp://127.0.0.1:1";
  m.kv_replay_endpoint = "tcp://127.0.0.1:2";
  m.kv_capacity_tokens = 1'000'000;
  m.load.running = {4, 5, 6};
  m.load.waiting = {7, 8, 9};
  m.load.incoming = {10, 11, 12};
  m.load.kv_capacity_tokens = 13;
  m.outstanding = 14;
  m.draining = true;
  m.token_ids = {1, 255, 7};
  m.input_tokens = 15;
  m.output_tokens = 16;
  m.reused_tokens = 17;
  m.fetched_tokens = 18;
  m.ready_in_s = 0.25;
  m.decode_index = 19;
  m.hit_tokens = 20;
  m.pool_hit_tokens = 21;
  m.fetched_tokens_expected = 22;
  m.kv_bytes = 23;
  m.kv_chunks = 3;
  m.kv_transport = "tcp";
  m.pool_read_bytes = 24;
  m.pool_write_bytes = 25;
  m.blocks_verified = 26;
  m.checksum_failures = 27;
  m.segment = "decode-1-9/kv";
  m.offset_bytes = 28;
  m.length_bytes = 29;
  m.request_ids = {30, 31};
  m.block_keys = {32, 33, 34};
  m.error = "boom";
  m.output_offset = 35;
  auto back = decode_instance_message(encode(m));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(encode(*back), encode(m));
  EXPECT_EQ(back->kind, m.kind);
  EXPECT_EQ(back->role, InstanceRole::kDecode);
  EXPECT_EQ(back->load.incoming.kv_tokens, 12);
  EXPECT_EQ(back->token_ids, m.token_ids);
  EXPECT_EQ(back->request_ids, m.request_ids);
  EXPECT_EQ(back->block_keys, m.block_keys);
  EXPECT_EQ(back->ready_in_s, 0.25);
  EXPECT_EQ(back->segment, m.segment);
  EXPECT_EQ(back->error, "boom");
  EXPECT_EQ(back->kv_transport, "tcp");
  EXPECT_EQ(back->output_offset, 35);
  EXPECT_TRUE(back->draining);
}

// Logprobs travel in an optional tail (issue 22 §5): a decode step's, for the requests that asked only, come
// back as sent, and a message without any has the fixed fields only (50).
TEST(InstanceWire, LogprobsTravelOnlyWhenAMessageHasSome) {
  InstanceMessage step;
  step.kind = InstanceMessage::Kind::kTokens;
  step.request_ids = {30, 31, 32};
  step.tokens = {5, 6, 7};
  const std::string plain = encode(step);
  EXPECT_EQ(static_cast<unsigned char>(plain[0]), 0xdc);  // array16
  EXPECT_EQ(static_cast<unsigned char>(plain[2]), 50);
  step.logprob_rows = {0, 2};
  step.logprobs = {{.logprob = -0.5f, .top = {{5, -0.5f}, {9, -1.25f}}}, {.logprob = -3.0f, .top = {}}};
  const std::string with = encode(step);
  EXPECT_EQ(static_cast<unsigned char>(with[2]), 56);
  EXPECT_EQ(with.substr(3, plain.size() - 3), plain.substr(3)) << "the same fields, then the tail";
  auto back = decode_instance_message(with);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->logprob_rows, step.logprob_rows);
  EXPECT_EQ(back->logprobs, step.logprobs);
  EXPECT_EQ(back->top_logprobs, model::kNoLogprobs);
  auto without = decode_instance_message(plain);
  ASSERT_TRUE(without.ok());
  EXPECT_TRUE(without->logprobs.empty() && without->logprob_rows.empty());

  // An order asking for logprobs carries how many alternatives.
  InstanceMessage order;
  order.kind = InstanceMessage::Kind::kPrefill;
  order.top_logprobs = 0;
  auto decoded = decode_instance_message(encode(order));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->top_logprobs, 0);
  InstanceMessage no_logprobs;
  no_logprobs.kind = InstanceMessage::Kind::kPrefill;
  EXPECT_GT(encode(order).size(), encode(no_logprobs).size());

  // Parts that disagree are refused: a row beyond the step's requests, rows out of order, more than 20
  // alternatives.
  const auto refused = [](InstanceMessage m) {
    return decode_instance_message(encode(m)).status().message();
  };
  InstanceMessage bad = step;
  bad.logprob_rows = {0, 3};
  EXPECT_THAT(refused(bad), ::testing::HasSubstr("rows not increasing within request_ids"));
  bad.logprob_rows = {2, 0};
  EXPECT_THAT(refused(bad), ::testing::HasSubstr("rows not increasing"));
  bad = step;
  bad.logprob_rows = {0};
  EXPECT_THAT(refused(bad), ::testing::HasSubstr("1 rows for 2 tokens"));
  bad = step;
  bad.logprobs[1].top.assign(21, {1, -1.0f});
  EXPECT_THAT(refused(bad), ::testing::HasSubstr("21 alternatives"));
  bad = order;
  bad.top_logprobs = 21;
  EXPECT_THAT(refused(bad), ::testing::HasSubstr("top_logprobs 21"));
}

TEST(InstanceWire, MalformedMessagesAreRefusedWithAReason) {
  EXPECT_THAT(decode_instance_message("not msgpack at all").status().message(),
              ::testing::HasSubstr("instance message"));
  std::string bytes = encode(InstanceMessage{});
  bytes[3] = 120;  // the kind (after the array16 header): out of range
  EXPECT_THAT(decode_instance_message(bytes).status().message(), ::testing::HasSubstr("unknown kind 120"));
  EXPECT_FALSE(decode_instance_message(encode(InstanceMessage{}).substr(0, 10)).ok());
  EXPECT_FALSE(decode_instance_message("").ok());
}

TEST(KvBlocks, ABlockCarriesItsChecksumAndAnyChangedByteFailsIt) {
  const uint64_t per_token = scaled_kv_bytes_per_token(327'680, 4096);  // LLaMA3-70B, 1/4096
  EXPECT_EQ(per_token, 80u);
  const uint64_t bytes = kv_block_bytes(512, per_token);
  EXPECT_EQ(bytes, 512u * 80);
  std::vector<std::byte> a(bytes), b(bytes);
  fill_kv_block(42, a);
  fill_kv_block(42, b);
  EXPECT_EQ(a, b) << "a block's bytes are a function of its key";
  EXPECT_TRUE(kv_block_intact(a));
  fill_kv_block(43, b);
  EXPECT_NE(a, b);
  for (size_t at : {size_t{0}, bytes / 2, bytes - 9, bytes - 1}) {
    std::vector<std::byte> bad = a;
    bad[at] ^= std::byte{1};
    EXPECT_FALSE(kv_block_intact(bad)) << "byte " << at;
  }
  EXPECT_FALSE(kv_block_intact(std::vector<std::byte>(bytes)));  // zeroed memory: nothing arrived
  EXPECT_EQ(kv_block_bytes(1, 1), 16u);                          // room for a payload and the checksum
  EXPECT_TRUE(kv_block_matches(42, a));
  EXPECT_FALSE(kv_block_matches(43, a)) << "an intact block of another key is not this one";
}

}  // namespace
}  // namespace crescent::serve
