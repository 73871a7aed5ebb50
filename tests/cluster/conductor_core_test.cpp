// The live Conductor's bookkeeping (cluster/conductor_core.h): every way a request can end gives back what it
// held in the Conductor's estimates, so a cancelled or failed prompt never keeps later requests waiting or
// refused.
#include "cluster/conductor_core.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace crescent::cluster {
namespace {

// Orders go nowhere (the test plays the instances); prefills and cancels are recorded.
class NoLinks final : public InstanceLinks {
 public:
  void send_prefill(InstanceId p, uint64_t id, const ClusterRequest& request, std::span<const BlockKey>,
                    const engine::EngineCore::ArrangedPrefix&, InstanceId d, double) override {
    prefills.emplace_back(p, id);
    last_prefill = request;
    last_decode = d;
  }
  void send_expect(InstanceId, uint64_t, const ClusterRequest&, double) override {}
  void send_kv_coming(InstanceId, uint64_t, int64_t, double) override {}
  void send_kv_handoff(InstanceId, uint64_t, int64_t, int64_t, double) override {}
  void send_cancel(InstanceId, InstanceId, uint64_t id) override { cancelled.push_back(id); }
  std::vector<uint64_t> cancelled;
  std::vector<std::pair<InstanceId, uint64_t>> prefills;  // (instance, id) of each send_prefill
  ClusterRequest last_prefill;                            // the last send_prefill's request
  InstanceId last_decode = 0;                             // and its decode instance
};

class ConductorCoreTest : public ::testing::Test {
 protected:
  // configs/local.json (the mock LLaMA3-70B on 8xA800: a 60k-token prompt is ~20 s of prefill), one prefill
  // and one decode instance, both up; stage deadlines of `floor_s` + `factor` x predicted.
  void start(conductor::Admission admission, double floor_s = 30, double factor = 4,
             int prefill_instances = 1, int64_t max_placements = 3, int decode_instances = 1) {
    auto config = load_cluster_config(CRESCENT_SOURCE_DIR "/configs/local.json", 512);
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    config->prefill_instances = prefill_instances;
    config->serve.max_request_placements = max_placements;
    config->decode_instances = decode_instances;
    config->serve.admission = admission;
    config->serve.stage_timeout_floor_s = floor_s;
    config->serve.stage_timeout_factor = factor;
    options_.config = *config;
    options_.block_size_tokens = 512;
    ASSERT_TRUE(validate(options_).ok());
    core_.emplace(options_, links_);
    for (int p = 0; p < prefill_instances; ++p) core_->state().on_prefill_up(static_cast<InstanceId>(p));
    for (int d = 0; d < decode_instances; ++d) core_->state().on_decode_up(static_cast<InstanceId>(d));
  }

  // A prompt of `tokens` tokens of its own (no prefix shared with any other): its id, or nullopt if refused.
  std::optional<uint64_t> submit(int64_t tokens, double now_s, RequestCallbacks callbacks = {}) {
    ClusterRequest r;
    for (int64_t i = 0; i < tokens; ++i) r.prompt_token_ids.push_back(next_token_++);
    r.max_tokens = 16;
    uint64_t id = 0;
    const conductor::Decision d = core_->place(std::move(r), std::move(callbacks), id, now_s);
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

// Issue 25 §2: the prompts of a prefill instance that went down are placed again on another, under a new id
// (the only one the new instance sees), while their owner keeps the first: its cancel still reaches them,
// events naming the old id are ignored, and the dead instance's queue is given back. Past
// serve.max_request_placements, or with nowhere to go, they fail with instance_down.
TEST_F(ConductorCoreTest, APromptWhosePrefillInstanceWentDownIsPlacedAgainUnderANewId) {
  start(conductor::Admission::kPredictive, 30, 4, /*prefill_instances=*/2, /*max_placements=*/2);
  std::vector<int64_t> tokens;
  std::vector<std::string> errors;
  RequestCallbacks callbacks;
  callbacks.on_tokens = [&](std::span<const int64_t> t, std::span<const model::TokenLogprobs>) {
    tokens.insert(tokens.end(), t.begin(), t.end());
    return true;
  };
  callbacks.on_error = [&](const std::string& code, const std::string&) { errors.push_back(code); };
  const uint64_t owner_id = submit(60'000, 0.0, callbacks).value();
  ASSERT_EQ(links_.prefills.size(), 1u);
  const auto [first_instance, first_id] = links_.prefills[0];
  EXPECT_EQ(first_id, owner_id);
  core_->on_prefill_start(owner_id, 0, 0.1);
  const InstanceId other = 1 - first_instance;

  core_->on_prefill_down(first_instance, 1.0);
  ASSERT_EQ(links_.prefills.size(), 2u) << "placed again";
  const auto [second_instance, second_id] = links_.prefills[1];
  EXPECT_EQ(second_instance, other);
  EXPECT_NE(second_id, owner_id);
  EXPECT_THAT(links_.cancelled, ::testing::ElementsAre(owner_id)) << "the old placement is dropped";
  EXPECT_FALSE(core_->has_request(owner_id));
  EXPECT_TRUE(core_->has_request(second_id));
  EXPECT_DOUBLE_EQ(core_->state().prefill_busy_until_s()[first_instance], 1.0) << "its queue is given back";
  EXPECT_GT(core_->state().prefill_busy_until_s()[other], 10.0) << "and the prompt queued on the other";
  EXPECT_THAT(core_->metrics().scrape({}),
              ::testing::HasSubstr(R"(crescent_requests_replaced_total{reason="prefill_down"} 1)"));

  core_->on_first_token(first_instance, owner_id, 5, 2.0);  // a late word from the old placement: ignored
  EXPECT_TRUE(tokens.empty());
  core_->on_prefill_start(second_id, 0, 2.0);
  core_->on_first_token(other, second_id, 7, 3.0);
  EXPECT_THAT(tokens, ::testing::ElementsAre(7));

  // The owner's cancel, by the id it knows, reaches the current placement.
  core_->cancel(owner_id, 3.5);
  EXPECT_EQ(core_->requests_in_flight(), 0u);
  EXPECT_EQ(links_.cancelled.back(), second_id);
  EXPECT_TRUE(errors.empty());

  // Placed twice (the limit here): the next instance death fails it.
  const uint64_t again = submit(60'000, 4.0, callbacks).value();
  const InstanceId on = links_.prefills.back().first;
  ASSERT_EQ(on, other) << "the only instance up";
  core_->state().on_prefill_up(first_instance);
  core_->on_prefill_down(on, 5.0);
  const uint64_t moved = links_.prefills.back().second;
  ASSERT_NE(moved, again);
  core_->on_prefill_down(links_.prefills.back().first, 6.0);
  EXPECT_FALSE(core_->has_request(moved));
  EXPECT_THAT(errors, ::testing::ElementsAre("instance_down"));
  EXPECT_EQ(core_->requests_in_flight(), 0u);

  // Nowhere to go (no prefill instance up): it fails at once.
  core_->state().on_prefill_up(0);
  errors.clear();
  ASSERT_TRUE(submit(1000, 7.0, callbacks).has_value());
  core_->on_prefill_down(0, 7.5);
  EXPECT_THAT(errors, ::testing::ElementsAre("instance_down"));
}

// Issue 25 §2: a stream whose decode instance went down moves: its prompt plus the tokens it gave are
// prefilled again (output_offset says how many), what is left is generated, and its owner sees the tokens go
// on in order and the request finish with all of them.
TEST_F(ConductorCoreTest, AStreamWhoseDecodeInstanceWentDownGoesOnFromItsTokens) {
  start(conductor::Admission::kNone, 30, 4, /*prefill_instances=*/1, /*max_placements=*/3,
        /*decode_instances=*/2);
  std::vector<int64_t> tokens;
  std::optional<RequestSummary> done;
  RequestCallbacks callbacks;
  callbacks.on_tokens = [&](std::span<const int64_t> t, std::span<const model::TokenLogprobs>) {
    tokens.insert(tokens.end(), t.begin(), t.end());
    return true;
  };
  callbacks.on_done = [&](const RequestSummary& s) { done = s; };
  const uint64_t id = submit(100, 0.0, callbacks).value();  // max_tokens 16
  const ClusterRequest original = links_.last_prefill;
  const InstanceId d = links_.last_decode;
  core_->on_prefill_start(id, 0, 0.1);
  core_->on_first_token(0, id, 7, 0.2);
  core_->on_kv_shipped(id, 0.3);
  const std::vector<uint64_t> ids{id};
  core_->on_tokens(ids, std::vector<int64_t>{8}, 0.4);
  core_->on_tokens(ids, std::vector<int64_t>{9}, 0.5);

  core_->on_decode_down(d, 0.6);
  ASSERT_EQ(links_.prefills.size(), 2u);
  const uint64_t moved = links_.prefills.back().second;
  EXPECT_NE(links_.last_decode, d);
  const ClusterRequest& again = links_.last_prefill;
  std::vector<int64_t> prompt = original.prompt_token_ids;
  prompt.insert(prompt.end(), {7, 8, 9});
  EXPECT_EQ(again.prompt_token_ids, prompt);
  EXPECT_EQ(again.output_offset, 3);
  EXPECT_EQ(again.max_tokens, 13);
  EXPECT_EQ(again.seed, original.seed);
  core_->on_tokens(ids, std::vector<int64_t>{99}, 0.65);  // the old placement's: ignored
  core_->on_prefill_start(moved, 0, 0.7);
  core_->on_first_token(0, moved, 10, 0.8);
  core_->on_kv_shipped(moved, 0.9);
  const std::vector<uint64_t> moved_ids{moved};
  for (int64_t t = 11; t <= 16; ++t) core_->on_tokens(moved_ids, std::vector<int64_t>{t}, 1.0);
  EXPECT_FALSE(done.has_value()) << "10 of its 16 so far";
  for (int64_t t = 17; t <= 22; ++t) core_->on_tokens(moved_ids, std::vector<int64_t>{t}, 1.1);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->completion_tokens, 16);
  EXPECT_EQ(done->prompt_tokens, 100) << "the client's prompt, not the moved one";
  std::vector<int64_t> want{7, 8, 9};
  for (int64_t t = 10; t <= 22; ++t) want.push_back(t);
  EXPECT_EQ(tokens, want);
  EXPECT_THAT(core_->metrics().scrape({}),
              ::testing::HasSubstr(R"(crescent_requests_replaced_total{reason="decode_down"} 1)"));
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

// A prefill instance that heartbeats but never answers must not hang its requests (issue 22 §4): each stage
// it owns has a deadline of floor + factor x the stage's prediction, on the core's clock (the test's), and
// past it the request fails like any other failure: its owner hears the stage's code, its instances drop it,
// and the Conductor's estimates give back everything it held.
TEST_F(ConductorCoreTest, AStageThatOverrunsItsDeadlineFailsTheRequestAndGivesBackItsEstimates) {
  start(conductor::Admission::kNone, /*floor_s=*/2, /*factor=*/3);
  std::vector<std::string> errors;
  const auto submit_watched = [&](int64_t tokens, double now_s) {
    ClusterRequest r;
    for (int64_t i = 0; i < tokens; ++i) r.prompt_token_ids.push_back(next_token_++);
    r.max_tokens = 16;
    RequestCallbacks callbacks;
    callbacks.on_error = [&](const std::string& code, const std::string&) { errors.push_back(code); };
    uint64_t id = 0;
    last_decision_ = core_->place(std::move(r), std::move(callbacks), id, now_s);
    EXPECT_EQ(last_decision_.rejected, conductor::RejectReason::kNone);
    return id;
  };
  // Three prompts queue on the one prefill instance, which never answers.
  const uint64_t first = submit_watched(60'000, 0.0);
  const double prefill_s = last_decision_.transfer_s + last_decision_.prefill_s;
  ASSERT_GT(prefill_s, 10.0);
  EXPECT_DOUBLE_EQ(core_->stage_deadline_s(first), 2.0) << "queued behind nothing: the floor";
  const uint64_t second = submit_watched(60'000, 0.0);
  const double second_deadline_s = 2.0 + 3 * last_decision_.queue_s;
  ASSERT_NEAR(last_decision_.queue_s, prefill_s, 1e-6 * prefill_s);
  EXPECT_DOUBLE_EQ(core_->stage_deadline_s(second), second_deadline_s) << "generous for a long queue";
  const uint64_t third = submit_watched(1'000, 0.0);
  const double third_deadline_s = 2.0 + 3 * last_decision_.queue_s;
  EXPECT_DOUBLE_EQ(core_->next_deadline_s(), 2.0);

  // The first starts at once; the prefill stage's deadline replaces its queued one.
  core_->on_prefill_start(first, 0, 0.5);
  const double first_deadline_s = 0.5 + 2.0 + 3 * prefill_s;
  EXPECT_DOUBLE_EQ(core_->stage_deadline_s(first), first_deadline_s);
  EXPECT_EQ(core_->expire_deadlines(2.0), 0u) << "the first moved on; the others wait behind it";
  EXPECT_EQ(core_->requests_in_flight(), 3u);

  // Nothing more comes: each fails at its stage's deadline, not before.
  ASSERT_LT(second_deadline_s, first_deadline_s);
  ASSERT_LT(first_deadline_s, third_deadline_s);
  EXPECT_EQ(core_->expire_deadlines(second_deadline_s - 0.01), 0u);
  EXPECT_EQ(core_->expire_deadlines(second_deadline_s), 1u);
  EXPECT_EQ(core_->expire_deadlines(first_deadline_s), 1u);
  EXPECT_EQ(errors, std::vector<std::string>({"queue_timeout", "prefill_timeout"}));
  EXPECT_FALSE(core_->has_request(first));
  EXPECT_TRUE(core_->has_request(third));
  EXPECT_EQ(core_->expire_deadlines(third_deadline_s), 1u);
  EXPECT_EQ(errors, std::vector<std::string>({"queue_timeout", "prefill_timeout", "queue_timeout"}));
  EXPECT_EQ(core_->requests_in_flight(), 0u);
  EXPECT_EQ(links_.cancelled, std::vector<uint64_t>({second, first, third}))
      << "its instances were told to drop each one";
  EXPECT_DOUBLE_EQ(queue_end_s(), third_deadline_s) << "no estimate is left behind: idle";
  EXPECT_EQ(core_->next_deadline_s(), std::numeric_limits<double>::infinity());
  const std::string metrics = core_->metrics().scrape({});
  EXPECT_NE(metrics.find("crescent_requests_failed_total{reason=\"queue_timeout\"} 2"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("crescent_requests_failed_total{reason=\"prefill_timeout\"} 1"), std::string::npos);
}

// After its first token a request waits for its KV to reach decode (kv_handoff_timeout past the deadline);
// once there, each token moves its decoding deadline on, and a decode instance that stops stepping fails it
// with decode_timeout one window after its last token, not one window after its KV arrived.
TEST_F(ConductorCoreTest, AfterTheFirstTokenTheKvHandoffAndEachDecodeGapHaveADeadline) {
  start(conductor::Admission::kNone, /*floor_s=*/1, /*factor=*/2);
  std::vector<std::string> errors;
  const auto submit_watched = [&](double now_s) {
    ClusterRequest r;
    for (int64_t i = 0; i < 2000; ++i) r.prompt_token_ids.push_back(next_token_++);
    r.max_tokens = 8;
    RequestCallbacks callbacks;
    callbacks.on_tokens = [](std::span<const int64_t>, std::span<const model::TokenLogprobs>) {
      return true;
    };
    callbacks.on_error = [&](const std::string& code, const std::string&) { errors.push_back(code); };
    uint64_t id = 0;
    last_decision_ = core_->place(std::move(r), std::move(callbacks), id, now_s);
    return id;
  };
  const uint64_t shipped = submit_watched(0.0);
  const uint64_t stuck = submit_watched(0.0);
  core_->on_prefill_start(shipped, 0, 0.1);
  core_->on_first_token(0, shipped, 7, 0.2);
  const double handoff_s = core_->cost().kv_transfer_time_s(2000);
  EXPECT_DOUBLE_EQ(core_->stage_deadline_s(shipped), 0.2 + 1 + 2 * handoff_s);
  core_->on_kv_shipped(shipped, 0.25);
  const double window_s = 1 + 2 * core_->cost().decode_step_time_s(1, 2000 + 8);
  EXPECT_DOUBLE_EQ(core_->stage_deadline_s(shipped), 0.25 + window_s);
  core_->on_prefill_start(stuck, 0, 0.3);
  core_->on_first_token(0, stuck, 7, 0.4);  // and its KV never arrives
  const double stuck_deadline_s = core_->stage_deadline_s(stuck);
  EXPECT_DOUBLE_EQ(stuck_deadline_s, 0.4 + 1 + 2 * handoff_s);

  // The decode instance steps for a while: one token every 0.5 s keeps it alive well past its first window.
  double now = 0.25;
  bool stuck_failed = false;
  for (int step = 0; step < 5; ++step) {
    now += 0.5;
    const uint64_t ids[] = {shipped};
    const int64_t tokens[] = {9};
    core_->on_tokens(ids, tokens, now);
    const bool stuck_due = !stuck_failed && now >= stuck_deadline_s;
    stuck_failed = stuck_failed || stuck_due;
    EXPECT_EQ(core_->expire_deadlines(now), stuck_due ? 1u : 0u)
        << "only the stuck hand-off fails, at " << now;
  }
  EXPECT_TRUE(stuck_failed);
  EXPECT_EQ(errors, std::vector<std::string>({"kv_handoff_timeout"}));
  EXPECT_FALSE(core_->has_request(stuck));
  ASSERT_TRUE(core_->has_request(shipped)) << "a request that gets tokens is never cut";
  ASSERT_GT(now, 0.25 + window_s);

  // Then it stops stepping (it still heartbeats: nothing says it is down).
  const double last_token_s = now;
  EXPECT_DOUBLE_EQ(core_->stage_deadline_s(shipped), last_token_s + window_s) << "moved on by its tokens";
  EXPECT_EQ(core_->expire_deadlines(last_token_s + window_s - 0.01), 0u);
  EXPECT_EQ(core_->expire_deadlines(last_token_s + window_s), 1u);
  EXPECT_EQ(errors, std::vector<std::string>({"kv_handoff_timeout", "decode_timeout"}));
  EXPECT_FALSE(core_->has_request(shipped));
  EXPECT_EQ(core_->requests_in_flight(), 0u);
  EXPECT_EQ(links_.cancelled, std::vector<uint64_t>({stuck, shipped}))
      << "its instances were told to drop it";
  EXPECT_EQ(core_->next_deadline_s(), std::numeric_limits<double>::infinity());
  const std::string metrics = core_->metrics().scrape({});
  EXPECT_NE(metrics.find("crescent_requests_failed_total{reason=\"decode_timeout\"} 1"), std::string::npos)
      << metrics;
}

// With the defaults (30 s + 4 x predicted), instances 3.9 times slower than the cost model says still have
// every request of a long queue pass every stage: each prefill, and each decode step after it.
TEST_F(ConductorCoreTest, AnInstanceSlowerThanPredictedByLessThanTheFactorMeetsEveryDeadline) {
  start(conductor::Admission::kNone);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(submit(60'000, 0.0).value());
  const double predicted_s = queue_end_s() / static_cast<double>(ids.size());  // each prompt's prefill
  const double step_s = 3.9 * core_->cost().decode_step_time_s(1, 60'000 + 16);
  double now = 0;
  for (uint64_t id : ids) {
    core_->on_prefill_start(id, 0, now);
    now += 3.9 * predicted_s;
    EXPECT_EQ(core_->expire_deadlines(now), 0u);
    core_->on_first_token(0, id, 1, now);
    core_->on_kv_shipped(id, now);
    for (int token = 1; token < 16; ++token) {
      now += step_s;
      const uint64_t decoded[] = {id};
      const int64_t tokens[] = {1};
      core_->on_tokens(decoded, tokens, now);
      EXPECT_EQ(core_->expire_deadlines(now), 0u);
    }
    EXPECT_FALSE(core_->has_request(id)) << "finished";
  }
  EXPECT_EQ(core_->requests_in_flight(), 0u);
  EXPECT_EQ(core_->metrics().scrape({}).find("crescent_requests_failed_total{"), std::string::npos);
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
