// The live Conductor's bookkeeping (cluster/conductor_core.h): every way a request can end gives back what it
// held in the Conductor's estimates, so a cancelled or failed prompt never keeps later requests waiting or
// refused.
#include "cluster/conductor_core.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace crescent::cluster {
namespace {

// Orders go nowhere: the test plays the instances.
class NoLinks final : public InstanceLinks {
 public:
  void send_prefill(InstanceId, uint64_t, const ClusterRequest&, std::span<const BlockKey>,
                    const engine::EngineCore::ArrangedPrefix&, InstanceId, double) override {}
  void send_expect(InstanceId, uint64_t, const ClusterRequest&, double) override {}
  void send_kv_coming(InstanceId, uint64_t, int64_t, double) override {}
  void send_kv_handoff(InstanceId, uint64_t, int64_t, int64_t, double) override {}
  void send_cancel(InstanceId, InstanceId, uint64_t id) override { cancelled.push_back(id); }
  std::vector<uint64_t> cancelled;
};

class ConductorCoreTest : public ::testing::Test {
 protected:
  // configs/local.json (the mock LLaMA3-70B on 8xA800: a 60k-token prompt is ~20 s of prefill), one prefill
  // and one decode instance, both up.
  void start(conductor::Admission admission) {
    auto config = load_cluster_config(CRESCENT_SOURCE_DIR "/configs/local.json", 512);
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    config->prefill_instances = 1;
    config->decode_instances = 1;
    config->serve.admission = admission;
    options_.config = *config;
    options_.block_size_tokens = 512;
    ASSERT_TRUE(validate(options_).ok());
    core_.emplace(options_, links_);
    core_->state().on_prefill_up(0);
    core_->state().on_decode_up(0);
  }

  // A prompt of `tokens` tokens of its own (no prefix shared with any other): its id, or nullopt if refused.
  std::optional<uint64_t> submit(int64_t tokens, double now_s) {
    ClusterRequest r;
    for (int64_t i = 0; i < tokens; ++i) r.prompt_token_ids.push_back(next_token_++);
    r.max_tokens = 16;
    uint64_t id = 0;
    const conductor::Decision d = core_->place(std::move(r), {}, id, now_s);
    last_decision_ = d;
    if (d.rejected != conductor::RejectReason::kNone) return std::nullopt;
    return id;
  }
  double queue_end_s() { return core_->state().prefill_busy_until_s()[0]; }

  ClusterOptions options_;
  NoLinks links_;
  std::optional<ConductorCore> core_;
  conductor::Decision last_decision_;
  int64_t next_token_ = 0;
};

// Four long prompts queue ~80 s of prefill; however each of them ends before its prefill is done, the queue
// the next request is judged against is empty again.
TEST_F(ConductorCoreTest, EveryWayAPromptEndsEarlyGivesBackItsShareOfThePrefillQueue) {
  start(conductor::Admission::kNone);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(submit(60'000, 0.0).value());
  const double queued_s = queue_end_s();
  ASSERT_GT(queued_s, 40.0);

  core_->on_prefill_start(ids[0], 0, 0.0);  // the first one computes; the others wait
  core_->cancel(ids[1], 0.5);               // the client left while it was queued
  EXPECT_NEAR(queue_end_s(), queued_s * 3 / 4, 1e-6 * queued_s);
  core_->fail(ids[2], "kv_transfer_failed", "its KV did not reach decode-0", 0.5);  // e.g. a KV timeout
  EXPECT_NEAR(queue_end_s(), queued_s / 2, 1e-6 * queued_s);
  core_->on_decode_down(0, 0.5);  // its decode instance went down: ids[0] and ids[3] fail
  EXPECT_EQ(core_->requests_in_flight(), 0u);
  EXPECT_DOUBLE_EQ(queue_end_s(), 0.5) << "nothing is left pending there: the instance is idle now";
  EXPECT_EQ(links_.cancelled.size(), 4u) << "every instance was told to drop them";

  core_->state().on_decode_up(0);
  ASSERT_TRUE(submit(1000, 0.6).has_value());
  EXPECT_DOUBLE_EQ(last_decision_.queue_s, 0) << "the next request does not wait behind ghosts";
}

// A prompt cancelled while it computes gives back what was left of its predicted prefill, not all of it and
// not the prompts queued behind it.
TEST_F(ConductorCoreTest, APromptCancelledWhileComputingGivesBackWhatWasLeftOfIt) {
  start(conductor::Admission::kNone);
  const uint64_t first = submit(60'000, 0.0).value();
  const double one_s = queue_end_s();
  const uint64_t second = submit(60'000, 0.0).value();
  ASSERT_NEAR(queue_end_s(), 2 * one_s, 1e-6 * one_s);
  core_->on_prefill_start(first, 0, 0.0);
  core_->cancel(first, one_s / 4);
  EXPECT_NEAR(queue_end_s(), one_s / 4 + one_s, 1e-6 * one_s) << "the second still needs all of its time";
  // The prefill instance goes down under the second: its queue is forgotten, the request fails.
  core_->on_prefill_down(0, one_s / 2);
  EXPECT_FALSE(core_->has_request(second));
  EXPECT_EQ(core_->requests_in_flight(), 0u);
  EXPECT_DOUBLE_EQ(queue_end_s(), one_s / 2);
}

// A prompt that ends normally leaves the queue at its end, as predicted or as it happened.
TEST_F(ConductorCoreTest, APromptThatIsDoneLeavesTheInstanceIdle) {
  start(conductor::Admission::kNone);
  const uint64_t id = submit(60'000, 0.0).value();
  const double predicted_s = queue_end_s();
  core_->on_prefill_start(id, 0, 0.0);
  core_->on_first_token(0, id, 7, predicted_s / 2);  // faster than the cost model said
  EXPECT_DOUBLE_EQ(queue_end_s(), predicted_s / 2);
  EXPECT_EQ(core_->requests_in_flight(), 1u) << "it decodes now";
}

// Predictive admission judges a request by its TTFT on the predicted queue: four long prompts dropped after
// half a second must not make an idle cluster refuse everyone (issue 22 §4).
TEST_F(ConductorCoreTest, DroppedPromptsDoNotMakeAnIdleClusterRefuseEveryone) {
  start(conductor::Admission::kPredictive);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    auto id = submit(60'000, 0.0);
    if (id) ids.push_back(*id);
  }
  ASSERT_GE(ids.size(), 2u);
  EXPECT_FALSE(submit(60'000, 0.1).has_value()) << "while they are queued, another long one is refused";
  for (uint64_t id : ids) core_->cancel(id, 0.5);
  EXPECT_TRUE(submit(60'000, 0.6).has_value())
      << "refused with reason " << conductor::to_string(last_decision_.rejected);
}

// Logprobs reach the owner with their token (issue 22 §5): the first token's from the prefill, a decode
// step's by row to the requests that asked, and none to a request that did not ask, even if an instance
// sent some.
TEST_F(ConductorCoreTest, LogprobsGoWithTheirTokensToTheRequestsThatAsked) {
  start(conductor::Admission::kNone);
  struct Heard {
    std::vector<int64_t> tokens;
    std::vector<model::TokenLogprobs> logprobs;
  };
  std::vector<Heard> heard(2);
  std::vector<uint64_t> ids;
  for (int32_t top : {2, model::kNoLogprobs}) {
    ClusterRequest r{
        .prompt_token_ids = {next_token_++, next_token_++}, .max_tokens = 3, .top_logprobs = top};
    Heard& h = heard[ids.size()];
    RequestCallbacks callbacks;
    callbacks.on_tokens = [&h](std::span<const int64_t> tokens, std::span<const model::TokenLogprobs> lps) {
      h.tokens.insert(h.tokens.end(), tokens.begin(), tokens.end());
      h.logprobs.insert(h.logprobs.end(), lps.begin(), lps.end());
      return true;
    };
    uint64_t id = 0;
    ASSERT_EQ(core_->place(std::move(r), std::move(callbacks), id, 0.0).rejected,
              conductor::RejectReason::kNone);
    ids.push_back(id);
  }
  const model::TokenLogprobs first{.logprob = -0.5f, .top = {{7, -0.5f}, {8, -1.0f}}};
  const model::TokenLogprobs second{.logprob = -2.0f, .top = {{3, -0.25f}, {9, -2.0f}}};
  const model::TokenLogprobs stray{.logprob = -1.0f};
  core_->on_first_token(0, ids[0], 7, 0.1, &first);
  core_->on_first_token(0, ids[1], 5, 0.1, &stray);  // it did not ask: dropped
  // A decode step for both, in the other order: row 1 is ids[0]'s.
  const std::vector<uint64_t> step = {ids[1], ids[0]};
  const std::vector<uint32_t> rows = {1};
  core_->on_tokens(step, std::vector<int64_t>{6, 9}, 0.2, rows, std::vector<model::TokenLogprobs>{second});
  EXPECT_EQ(heard[0].tokens, (std::vector<int64_t>{7, 9}));
  EXPECT_EQ(heard[0].logprobs, (std::vector<model::TokenLogprobs>{first, second}));
  EXPECT_EQ(heard[1].tokens, (std::vector<int64_t>{5, 6}));
  EXPECT_TRUE(heard[1].logprobs.empty());
}

}  // namespace
}  // namespace crescent::cluster
