#include "engine/engine_core.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace crescent::engine {
namespace {

using ::testing::ElementsAre;

// Every iteration takes 1 s; the plans are kept for the test to read.
class OneSecondExecutor final : public Executor {
 public:
  double run_iteration_s(const IterationPlan& plan) override {
    plans.push_back(plan);
    return 1.0;
  }
  std::vector<IterationPlan> plans;
};

struct Seen {
  double prefill_start_s = -1;
  PrefillStart start;
  double first_token_s = -1;
  double finish_s = -1;
  std::optional<StepLog::Gaps> gaps;
};

class Recorder : public EngineListener {
 public:
  void on_prefill_start(RequestId id, double now_s, const PrefillStart& start) override {
    seen[id].prefill_start_s = now_s;
    seen[id].start = start;
  }
  void on_first_token(RequestId id, double now_s) override { seen[id].first_token_s = now_s; }
  void on_finished(RequestId id, double now_s, const std::optional<StepLog::Gaps>& gaps) override {
    seen[id].finish_s = now_s;
    seen[id].gaps = gaps;
    finished_order.push_back(id);
  }
  std::map<RequestId, Seen> seen;
  std::vector<RequestId> finished_order;
};

class EngineCoreTest : public ::testing::Test {
 protected:
  EngineCore make(EngineOptions options) { return EngineCore(options, executor_, recorder_); }
  OneSecondExecutor executor_;
  Recorder recorder_;
};

TEST_F(EngineCoreTest, DecodeJoinsAtStepBoundariesAndLeavesAfterItsTokens) {
  EngineCore engine = make({.kv_capacity_tokens = 10'000});
  engine.expect(1, 100, 4);  // 3 decode steps
  engine.expect(2, 50, 2);   // 1 decode step
  EXPECT_EQ(engine.decode_load().incoming.requests, 2);
  EXPECT_EQ(engine.decode_load().incoming.kv_tokens, 104 + 52);
  engine.submit_decode(1, /*first_token_s=*/-0.5, /*now_s=*/0);  // idle: starts a step now, ending at 1
  engine.advance_until(0.5);
  engine.submit_decode(2, 0.2, 0.5);  // joins at the next boundary (1 s)
  EXPECT_EQ(engine.decode_load().waiting.requests, 1);
  EXPECT_EQ(engine.outstanding(), 2);
  engine.advance_until(100);
  EXPECT_FALSE(engine.busy());
  EXPECT_EQ(engine.outstanding(), 0);
  // Request 1 decodes in steps ending at 1, 2, 3; request 2 in the step ending at 2.
  EXPECT_DOUBLE_EQ(recorder_.seen[1].finish_s, 3.0);
  EXPECT_DOUBLE_EQ(recorder_.seen[2].finish_s, 2.0);
  EXPECT_THAT(recorder_.finished_order, ElementsAre(2u, 1u));
  // Request 2's only gap runs from its first token (0.2) to the end of its step (2.0).
  ASSERT_TRUE(recorder_.seen[2].gaps.has_value());
  EXPECT_DOUBLE_EQ(recorder_.seen[2].gaps->max_gap_s, 1.8);
  // Batch sizes and contexts per step: [1: 100], [1+2: 101 + 50], [1: 102].
  ASSERT_EQ(executor_.plans.size(), 3u);
  EXPECT_EQ(executor_.plans[0].decode_requests, 1);
  EXPECT_EQ(executor_.plans[0].decode_context_tokens, 100);
  EXPECT_EQ(executor_.plans[1].decode_requests, 2);
  EXPECT_EQ(executor_.plans[1].decode_context_tokens, 151);
  EXPECT_EQ(executor_.plans[2].decode_context_tokens, 102);
  EXPECT_EQ(engine.iterations(), 3);
  EXPECT_EQ(engine.decode_steps(), 3);
}

TEST_F(EngineCoreTest, DecodeWaitsForHbmRoom) {
  EngineCore engine = make({.kv_capacity_tokens = 1'000});
  engine.expect(1, 500, 101);  // 601 tokens reserved
  engine.expect(2, 300, 101);  // 401: does not fit beside the first
  engine.submit_decode(1, 0, 0);
  engine.submit_decode(2, 0, 0);
  EXPECT_EQ(engine.decode_load().running.requests, 1);
  EXPECT_EQ(engine.decode_load().waiting.requests, 1);
  engine.advance_until(100);  // request 1 leaves after 100 steps, at 100 s
  EXPECT_DOUBLE_EQ(recorder_.seen[1].finish_s, 100.0);
  EXPECT_EQ(engine.decode_load().running.requests, 1);
  EXPECT_EQ(engine.decode_load().running.kv_tokens, 401);
  engine.advance_until(1'000);
  EXPECT_DOUBLE_EQ(recorder_.seen[2].finish_s, 200.0);
}

TEST_F(EngineCoreTest, WholePromptPrefillStallsTheBatch) {
  EngineCore engine = make({.kv_capacity_tokens = 10'000});
  const std::vector<BlockKey> keys{1};
  engine.submit_prompt(1, 100, 3, keys, 0);  // prefill [0, 1], decodes at 2 and ...
  engine.advance_until(1.5);
  EXPECT_DOUBLE_EQ(recorder_.seen[1].first_token_s, 1.0);
  engine.submit_prompt(2, 200, 1, keys, 1.5);  // one token: finishes at its first token
  engine.advance_until(100);
  // Iterations: prefill 1, decode (1), prefill 2 alone (the batch stalls), decode (1).
  ASSERT_EQ(executor_.plans.size(), 4u);
  EXPECT_EQ(executor_.plans[0].prefill_tokens, 100);
  EXPECT_EQ(executor_.plans[1].decode_requests, 1);
  EXPECT_EQ(executor_.plans[2].prefill_tokens, 200);
  EXPECT_EQ(executor_.plans[2].decode_requests, 0);
  EXPECT_EQ(executor_.plans[3].decode_requests, 1);
  EXPECT_DOUBLE_EQ(recorder_.seen[2].finish_s, 3.0);
  EXPECT_FALSE(recorder_.seen[2].gaps.has_value());
  EXPECT_DOUBLE_EQ(recorder_.seen[2].prefill_start_s, 2.0);
  EXPECT_DOUBLE_EQ(recorder_.seen[1].finish_s, 4.0);
  ASSERT_TRUE(recorder_.seen[1].gaps.has_value());
  EXPECT_DOUBLE_EQ(recorder_.seen[1].gaps->max_gap_s, 2.0);  // the stalled step
}

TEST_F(EngineCoreTest, ChunkedPrefillSharesEachIterationWithDecodes) {
  EngineCore engine = make({.kv_capacity_tokens = 10'000, .chunk_tokens = 64});
  const std::vector<BlockKey> keys{1};
  engine.submit_prompt(1, 10, 5, keys, 0);
  engine.advance_until(1);  // first token at 1; decoding from then on (an iteration [1, 2] has started)
  engine.submit_prompt(2, 150, 2, keys, 1);
  engine.advance_until(100);
  // From the next iteration on, with one request decoding, each iteration prefills what is left of the
  // 64-token budget: 63, 63, 24 tokens of request 2.
  ASSERT_GE(executor_.plans.size(), 5u);
  EXPECT_EQ(executor_.plans[1].prefill_tokens, 0);
  for (size_t i = 1; i <= 4; ++i) EXPECT_EQ(executor_.plans[i].decode_requests, 1) << i;
  EXPECT_EQ(executor_.plans[2].prefill_tokens, 63);
  EXPECT_EQ(executor_.plans[3].prefill_tokens, 63);
  EXPECT_EQ(executor_.plans[3].prefill_prefix_tokens, 63);
  EXPECT_EQ(executor_.plans[4].prefill_tokens, 24);
  EXPECT_DOUBLE_EQ(recorder_.seen[2].first_token_s, 5.0);
}

TEST_F(EngineCoreTest, PrefixCacheReusesAPromptsBlocks) {
  EngineCore engine = make({.kv_capacity_tokens = 10'000, .prefix_cache = true, .block_size_tokens = 16});
  const std::vector<BlockKey> first{1, 2, 3};
  const std::vector<BlockKey> second{1, 2, 4, 5};
  engine.submit_prompt(1, 48, 1, first, 0);
  engine.advance_until(10);
  engine.submit_prompt(2, 64, 1, second, 10);
  engine.advance_until(100);
  EXPECT_EQ(recorder_.seen[1].start.hit_tokens, 0);
  EXPECT_EQ(recorder_.seen[2].start.hit_tokens, 32);
  EXPECT_EQ(recorder_.seen[2].start.prefill_tokens, 32);
  EXPECT_EQ(recorder_.seen[2].start.reused_tokens, 32);
  EXPECT_EQ(executor_.plans.back().prefill_prefix_tokens, 32);
}

// A prefill instance's cache is DRAM: a prompt longer than it still runs (it computes in HBM), the cache
// keeps the prompt's head, and a reused prefix is loaded before the compute.
TEST_F(EngineCoreTest, ADramPrefixCacheBoundsOnlyWhatItKeeps) {
  EngineCore engine =
      make({.kv_capacity_tokens = 32, .prefix_cache = true, .block_size_tokens = 16, .prefix_in_dram = true});
  engine.submit_prompt(1, 64, 1, std::vector<BlockKey>{1, 2, 3, 4}, 0);
  engine.advance_until(10);
  EXPECT_DOUBLE_EQ(recorder_.seen[1].first_token_s, 1.0);
  engine.submit_prompt(2, 64, 1, std::vector<BlockKey>{1, 2, 3, 4}, 10);
  engine.advance_until(100);
  EXPECT_EQ(recorder_.seen[2].start.hit_tokens, 32);  // blocks 1 and 2: the head, in 32 tokens of cache
  EXPECT_EQ(executor_.plans.back().load_tokens, 32);
  EXPECT_EQ(executor_.plans.back().prefill_tokens, 32);
  EXPECT_EQ(engine.outstanding(), 0);
}

// A prefill instance computes a prompt in chunks, one iteration each, and says after each chunk but the last
// how much of the prompt's KV exists (the reused prefix included): that KV can stream to decode.
TEST_F(EngineCoreTest, ChunkedPrefillReportsEachChunkAsItsIterationEnds) {
  struct ChunkRecorder : Recorder {
    void on_prefill_chunk(RequestId, int64_t computed_tokens, double now_s) override {
      chunks.emplace_back(computed_tokens, now_s);
    }
    std::vector<std::pair<int64_t, double>> chunks;
  } recorder;
  EngineCore engine({.kv_capacity_tokens = 1000,
                     .chunk_tokens = 16,
                     .prefix_cache = true,
                     .block_size_tokens = 16,
                     .prefix_in_dram = true},
                    executor_, recorder);
  engine.submit_prompt(1, 64, 1, std::vector<BlockKey>{1, 2, 3, 4}, 0, {.reused_tokens = 16});
  engine.advance_until(100);
  EXPECT_THAT(recorder.chunks, ElementsAre(std::make_pair(32, 1.0), std::make_pair(48, 2.0)));
  EXPECT_DOUBLE_EQ(recorder.seen[1].first_token_s, 3.0);
  ASSERT_EQ(executor_.plans.size(), 3u);
  EXPECT_EQ(executor_.plans[0].load_tokens, 16);  // the reused prefix is loaded in the first iteration only
  EXPECT_EQ(executor_.plans[1].load_tokens, 0);
  EXPECT_EQ(executor_.plans[2].prefill_prefix_tokens, 48);
}

// A DRAM cache stores a queued prompt's blocks before they are computed. A prompt cancelled in the queue
// takes out the blocks nobody else uses (reported removed); blocks a later prompt counted on stay, and that
// prompt computes them. Blocks already held are announced again as stored (a listener that forgot them
// relearns).
TEST_F(EngineCoreTest, ADramCacheForgetsWhatACancelledPromptNeverComputed) {
  struct KvRecorder : Recorder {
    void on_kv_event(std::span<const BlockKey> stored_keys, std::span<const BlockKey> removed_keys,
                     double) override {
      stored.assign(stored_keys.begin(), stored_keys.end());
      removed.insert(removed.end(), removed_keys.begin(), removed_keys.end());
    }
    std::vector<BlockKey> stored, removed;
  } recorder;
  EngineCore engine(
      {.kv_capacity_tokens = 1000, .prefix_cache = true, .block_size_tokens = 16, .prefix_in_dram = true},
      executor_, recorder);
  engine.submit_prompt(1, 32, 1, std::vector<BlockKey>{10, 11}, 0);   // prefilling until 1 s
  engine.submit_prompt(2, 32, 1, std::vector<BlockKey>{1, 2}, 0);     // queued: stores 1, 2
  engine.submit_prompt(3, 48, 1, std::vector<BlockKey>{1, 2, 3}, 0);  // queued: counts on 1, 2
  engine.submit_prompt(4, 16, 1, std::vector<BlockKey>{5}, 0);
  engine.cancel(4);
  EXPECT_THAT(recorder.removed, ElementsAre(5u));  // nobody else uses block 5
  engine.cancel(2);
  EXPECT_THAT(recorder.removed, ElementsAre(5u));  // 1 and 2 stay: prompt 3 pinned them
  engine.advance_until(100);
  EXPECT_EQ(recorder.seen[3].start.local_hit_tokens, 0);  // nobody computed 1 and 2: prompt 3 does
  EXPECT_EQ(recorder.seen[3].start.prefill_tokens, 48);
  engine.submit_prompt(5, 48, 1, std::vector<BlockKey>{1, 2, 3}, 100);
  EXPECT_THAT(recorder.stored, ElementsAre(1u, 2u, 3u));  // held already, announced again
  engine.advance_until(200);
  EXPECT_EQ(recorder.seen[5].start.local_hit_tokens, 48);
  EXPECT_EQ(engine.outstanding(), 0);
}

// A small DRAM cache under churn: prompts sharing prefixes, longer than the room left (their tails are
// skipped), cancelled while queued or prefilling. A prompt's local hit at admission is a run of blocks the
// cache holds.
TEST_F(EngineCoreTest, ADramCacheUnderChurnAdmitsOnlyBlocksItHolds) {
  struct HitChecker : Recorder {
    void on_prefill_start(RequestId id, double now_s, const PrefillStart& start) override {
      Recorder::on_prefill_start(id, now_s, start);
      const auto& keys = prompts->at(id);
      for (int64_t b = 0; b < start.local_hit_tokens / 16; ++b)
        EXPECT_TRUE(engine->prefix_cache_contains(keys[static_cast<size_t>(b)])) << "prompt " << id;
      ++admitted;
    }
    const std::map<RequestId, std::vector<BlockKey>>* prompts = nullptr;
    const EngineCore* engine = nullptr;
    int admitted = 0;
  } recorder;
  std::map<RequestId, std::vector<BlockKey>> prompts;
  EngineCore engine(
      {.kv_capacity_tokens = 16 * 24, .prefix_cache = true, .block_size_tokens = 16, .prefix_in_dram = true},
      executor_, recorder);
  recorder.prompts = &prompts;
  recorder.engine = &engine;
  std::mt19937_64 rng(3);
  double now_s = 0;
  for (RequestId id = 0; id < 3000; ++id) {
    now_s += 0.25 * static_cast<double>(rng() % 4);
    engine.advance_until(now_s);
    std::vector<BlockKey> keys(1 + rng() % 12);
    const BlockKey prefix = 100 * (rng() % 6);  // six shared prefixes of varied length
    const size_t shared = rng() % (keys.size() + 1);
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = i < shared ? prefix + i : 1000 + rng() % 5000;
    prompts[id] = keys;
    engine.submit_prompt(id, static_cast<int64_t>(keys.size()) * 16, 1, keys, now_s);
    if (rng() % 5 == 0) engine.cancel(rng() % (id + 1));  // anywhere: queued, prefilling or gone
  }
  engine.advance_until(std::numeric_limits<double>::infinity());
  EXPECT_EQ(engine.outstanding(), 0);
  EXPECT_GT(recorder.admitted, 2000);
  int64_t hits = 0;
  for (const auto& [id, seen] : recorder.seen) hits += seen.start.local_hit_tokens;
  EXPECT_GT(hits, 0);
}

// An engine told which of a prompt's blocks no later prompt names (submit_prompt's keyed_blocks, as the
// simulator tells its prefill instances) keeps them unkeyed and does what one keying every block does: the
// same prefill starts, hits, first tokens and finishes, and the same keyed blocks cached, under churn with
// cancels anywhere, for a DRAM cache (a prefill instance's) and an HBM one (a colocated node's).
TEST_F(EngineCoreTest, UnkeyedBlocksChangeNothingElse) {
  for (const bool in_dram : {true, false}) {
    SCOPED_TRACE(in_dram ? "DRAM cache" : "HBM cache");
    struct Prompt {
      RequestId id;
      std::vector<BlockKey> keys;
      size_t keyed_blocks = 0;
      double at_s;
      std::optional<RequestId> cancel;
    };
    std::mt19937_64 rng(7);
    std::vector<Prompt> prompts;
    BlockKey fresh = 1'000'000;
    double now_s = 0;
    for (RequestId id = 0; id < 3000; ++id) {
      now_s += 0.5 * static_cast<double>(rng() % 8);  // about as fast as the engine serves them
      std::vector<BlockKey> keys(1 + rng() % 12);
      const BlockKey prefix = 100 * (rng() % 6);
      const size_t shared = rng() % (keys.size() + 1), own = rng() % (keys.size() + 1);
      for (size_t i = 0; i < keys.size(); ++i)
        keys[i] = i < shared ? prefix + i : i >= keys.size() - own ? fresh++ : 1000 + rng() % 3000;
      std::optional<RequestId> cancel;  // one of the last few: queued, prefilling, decoding or gone
      if (rng() % 5 == 0) cancel = id - std::min<RequestId>(id, rng() % 4);
      prompts.push_back({id, keys, 0, now_s, cancel});
    }
    // Last prompt first: one past the last block a later prompt names; the others are never named again.
    std::set<BlockKey> named_later, tail_keys;
    for (auto p = prompts.rbegin(); p != prompts.rend(); ++p) {
      for (size_t k = 0; k < p->keys.size(); ++k)
        if (!named_later.insert(p->keys[k]).second) p->keyed_blocks = k + 1;
      tail_keys.insert(p->keys.begin() + static_cast<ptrdiff_t>(p->keyed_blocks), p->keys.end());
    }
    Recorder keyed_seen, unkeyed_seen;
    const EngineOptions options{.kv_capacity_tokens = 16 * 40,
                                .prefix_cache = true,
                                .block_size_tokens = 16,
                                .prefix_in_dram = in_dram};
    EngineCore keyed(options, executor_, keyed_seen), unkeyed(options, executor_, unkeyed_seen);
    // The unkeyed engine holds what the keyed one does but for blocks no later prompt names.
    const auto check_keys = [&](RequestId after) {
      const auto held = keyed.prefix_cache_keys(), held_keyed = unkeyed.prefix_cache_keys();
      const std::set<BlockKey> a(held.begin(), held.end()), b(held_keyed.begin(), held_keyed.end());
      for (BlockKey k : b) ASSERT_TRUE(a.contains(k)) << "after prompt " << after << ": block " << k;
      for (BlockKey k : a) {
        if (!b.contains(k)) {
          ASSERT_TRUE(tail_keys.contains(k)) << "after prompt " << after << ": block " << k;
        }
      }
    };
    int64_t tail_blocks_cached = 0, tail_blocks_keyed = 0;
    for (const Prompt& p : prompts) {
      keyed.advance_until(p.at_s);
      unkeyed.advance_until(p.at_s);
      const auto input_tokens = static_cast<int64_t>(p.keys.size()) * 16;
      keyed.submit_prompt(p.id, input_tokens, 1 + p.id % 3, p.keys, p.at_s);
      unkeyed.submit_prompt(p.id, input_tokens, 1 + p.id % 3, p.keys, p.at_s, {}, p.keyed_blocks);
      if (p.cancel) {
        keyed.cancel(*p.cancel);
        unkeyed.cancel(*p.cancel);
      }
      check_keys(p.id);
      ASSERT_FALSE(::testing::Test::HasFailure());
      const auto is_tail = [&](BlockKey k) { return tail_keys.contains(k); };
      tail_blocks_cached += std::ranges::count_if(keyed.prefix_cache_keys(), is_tail);
      tail_blocks_keyed += std::ranges::count_if(unkeyed.prefix_cache_keys(), is_tail);
    }
    // Unkeyed blocks took room: the keyed engine held many blocks no later prompt names, and the other engine
    // kept many of them unkeyed (those it held already, named by earlier prompts, stay keyed: about half).
    EXPECT_GT(tail_blocks_cached, 20000);
    EXPECT_LT(tail_blocks_keyed * 4, tail_blocks_cached * 3);
    keyed.advance_until(std::numeric_limits<double>::infinity());
    unkeyed.advance_until(std::numeric_limits<double>::infinity());
    ASSERT_EQ(unkeyed_seen.seen.size(), keyed_seen.seen.size());
    int64_t hits = 0;
    for (const auto& [id, a] : keyed_seen.seen) {
      const Seen& b = unkeyed_seen.seen.at(id);
      EXPECT_EQ(b.prefill_start_s, a.prefill_start_s) << id;
      EXPECT_EQ(b.start.hit_tokens, a.start.hit_tokens) << id;
      EXPECT_EQ(b.start.local_hit_tokens, a.start.local_hit_tokens) << id;
      EXPECT_EQ(b.start.prefill_tokens, a.start.prefill_tokens) << id;
      EXPECT_EQ(b.first_token_s, a.first_token_s) << id;
      EXPECT_EQ(b.finish_s, a.finish_s) << id;
      hits += a.start.local_hit_tokens;
    }
    EXPECT_EQ(unkeyed_seen.finished_order, keyed_seen.finished_order);
    check_keys(prompts.size());
    EXPECT_GT(hits, 0);
    EXPECT_GT(keyed_seen.finished_order.size(), 2000u);
  }
}

TEST_F(EngineCoreTest, ReportsEachStepsTokensAndCancelsAnywhere) {
  struct TokenRecorder : Recorder {
    void on_tokens(std::span<const RequestId> ids, double now_s) override {
      for (RequestId id : ids) tokens[id].push_back(now_s);
    }
    std::map<RequestId, std::vector<double>> tokens;
  } recorder;
  EngineCore engine({.kv_capacity_tokens = 1'000, .report_tokens = true}, executor_, recorder);
  engine.expect(1, 100, 5);
  engine.expect(2, 100, 5);
  engine.expect(3, 100, 5);  // never arrives: cancelled while incoming
  engine.submit_decode(1, 0, 0);
  engine.submit_decode(2, 0, 0);
  engine.advance_until(2);  // steps end at 1 and 2
  EXPECT_THAT(recorder.tokens[1], ElementsAre(1.0, 2.0));
  engine.cancel(2);  // mid-decode: the step under way (ending at 3) no longer counts it
  engine.cancel(3);
  EXPECT_EQ(engine.decode_load().running.requests, 1);
  EXPECT_EQ(engine.decode_load().running.kv_tokens, 105);
  EXPECT_EQ(engine.decode_load().incoming.requests, 0);
  engine.advance_until(100);
  EXPECT_THAT(recorder.tokens[1], ElementsAre(1.0, 2.0, 3.0, 4.0));
  // It joined at the step boundary at 1 (request 1's first step was under way), then nothing after the
  // cancel.
  EXPECT_THAT(recorder.tokens[2], ElementsAre(2.0));
  EXPECT_THAT(recorder.finished_order, ElementsAre(1u));
  EXPECT_EQ(engine.outstanding(), 0);
  EXPECT_FALSE(engine.busy());
  // A queued prompt and one being prefilled can be cancelled too; the engine then idles.
  const std::vector<BlockKey> keys{7};
  engine.submit_prompt(4, 100, 3, keys, 100);
  engine.submit_prompt(5, 100, 3, keys, 100);
  engine.cancel(5);
  engine.cancel(4);
  engine.advance_until(1'000);
  EXPECT_EQ(recorder.seen.count(4) ? recorder.seen[4].first_token_s : -1, -1);
  EXPECT_EQ(engine.outstanding(), 0);
  EXPECT_EQ(engine.decode_load().running.kv_tokens, 0);
}

// Steps no request joins or leaves after run on advance_until's fast path; an engine that reports each
// step's tokens takes the general path every step. Both give the same times, loads and gaps, under decodes
// arriving, prompts prefilled in chunks beside the batch, and cancels anywhere, with iteration times that
// depend on the batch and its context.
TEST_F(EngineCoreTest, TheFastDecodePathRunsStepsAsTheGeneralOne) {
  struct BatchExecutor final : Executor {
    double run_iteration_s(const IterationPlan& plan) override {
      return 0.01 + 0.001 * static_cast<double>(plan.decode_requests) +
             1e-6 * static_cast<double>(plan.decode_context_tokens + plan.prefill_tokens);
    }
  } executor;
  Recorder fast_seen, general_seen;
  EngineOptions options{.kv_capacity_tokens = 200'000, .chunk_tokens = 256};
  EngineCore fast(options, executor, fast_seen);
  options.report_tokens = true;
  EngineCore general(options, executor, general_seen);
  std::mt19937_64 rng(9);
  double now_s = 0;
  for (RequestId id = 0; id < 3000; ++id) {
    now_s += 0.2 * static_cast<double>(rng() % 8);
    for (EngineCore* e : {&fast, &general}) e->advance_until(now_s);
    if (rng() % 6 == 0) {  // mostly a request decoding in a steady batch
      const RequestId victim = id - std::min<RequestId>(id, rng() % 20);
      for (EngineCore* e : {&fast, &general}) e->cancel(victim);
    }
    const auto input = static_cast<int64_t>(1 + rng() % 1000), output = static_cast<int64_t>(2 + rng() % 200);
    switch (rng() % 4) {
      case 0:  // a prompt computed here, in chunks beside the batch
        for (EngineCore* e : {&fast, &general}) e->submit_prompt(id, input, output, {}, now_s);
        break;
      case 1:  // a request that never arrives, cancelled later or not
        for (EngineCore* e : {&fast, &general}) e->expect(id, input, output, now_s);
        break;
      default:
        for (EngineCore* e : {&fast, &general}) {
          e->expect(id, input, output, now_s);
          e->submit_decode(id, now_s, now_s);
        }
    }
    ASSERT_EQ(fast.decode_load(), general.decode_load()) << id;
    ASSERT_EQ(fast.next_event_s(), general.next_event_s()) << id;
  }
  for (EngineCore* e : {&fast, &general}) e->advance_until(std::numeric_limits<double>::infinity());
  EXPECT_EQ(fast.decode_steps(), general.decode_steps());
  EXPECT_EQ(fast.iterations(), general.iterations());
  EXPECT_GT(fast.decode_steps(), 10'000);
  EXPECT_GT(fast.fast_decode_steps() * 2, fast.decode_steps());  // most steps took the fast path
  EXPECT_EQ(general.fast_decode_steps(), 0);
  EXPECT_EQ(fast_seen.finished_order, general_seen.finished_order);
  EXPECT_GT(fast_seen.finished_order.size(), 1000u);
  for (const auto& [id, a] : general_seen.seen) {
    const Seen& b = fast_seen.seen.at(id);
    EXPECT_EQ(b.first_token_s, a.first_token_s) << id;
    EXPECT_EQ(b.finish_s, a.finish_s) << id;
    ASSERT_EQ(b.gaps.has_value(), a.gaps.has_value()) << id;
    if (a.gaps) {
      EXPECT_EQ(b.gaps->tbt_s, a.gaps->tbt_s) << id;
      EXPECT_EQ(b.gaps->max_gap_s, a.gaps->max_gap_s) << id;
    }
  }
}

struct TimeoutRecorder : Recorder {
  void on_kv_timeout(RequestId id, double now_s) override { timed_out.emplace_back(id, now_s); }
  std::vector<std::pair<RequestId, double>> timed_out;
};

TEST_F(EngineCoreTest, AReservationWhoseKvNeverCameIsFreedAfterTheTimeout) {
  TimeoutRecorder recorder;
  EngineCore engine({.kv_capacity_tokens = 1'000, .kv_transfer_timeout_s = 5}, executor_, recorder);
  engine.expect(1, 100, 3, /*now_s=*/0);
  engine.expect(2, 100, 3, /*now_s=*/1);
  EXPECT_DOUBLE_EQ(engine.next_event_s(), 5);  // the driver wakes for the deadline
  engine.submit_decode(2, 1.5, 2);             // request 2's KV arrives in time
  engine.advance_until(5);
  EXPECT_THAT(recorder.timed_out, ElementsAre(std::make_pair(RequestId{1}, 5.0)));
  EXPECT_EQ(engine.decode_load().incoming.requests, 0);
  EXPECT_FALSE(engine.submit_decode(1, 6, 6));  // too late: nothing changes
  engine.advance_until(100);
  EXPECT_THAT(recorder.finished_order, ElementsAre(2u));
  EXPECT_EQ(engine.outstanding(), 0);
  EXPECT_EQ(engine.decode_load().running.kv_tokens, 0);
}

// A live decode instance holds a reservation while its prompt is queued for prefill (no deadline), then
// counts the timeout from the prefill's predicted end; deadlines that move leave no stale timeout behind.
TEST_F(EngineCoreTest, AKvDeadlineCanBeHeldAndMoved) {
  TimeoutRecorder recorder;
  EngineCore engine({.kv_capacity_tokens = 1'000, .kv_transfer_timeout_s = 5}, executor_, recorder);
  engine.expect(1, 100, 3, /*now_s=*/0);
  engine.expect(2, 100, 3, /*now_s=*/0);
  engine.set_kv_deadline(1, std::numeric_limits<double>::infinity());
  engine.set_kv_deadline(2, 20);
  engine.advance_until(19);
  EXPECT_THAT(recorder.timed_out, ::testing::IsEmpty()) << "held and moved: neither times out at 5";
  engine.set_kv_deadline(1, 30);
  engine.advance_until(25);
  EXPECT_THAT(recorder.timed_out, ElementsAre(std::make_pair(RequestId{2}, 20.0)));
  engine.advance_until(30);
  EXPECT_THAT(recorder.timed_out,
              ElementsAre(std::make_pair(RequestId{2}, 20.0), std::make_pair(RequestId{1}, 30.0)));
  EXPECT_EQ(engine.decode_load().incoming.requests, 0);
  EXPECT_FALSE(engine.set_kv_deadline(1, 40));  // gone: nothing changes
  EXPECT_EQ(engine.next_event_s(), std::numeric_limits<double>::infinity());
}

TEST_F(EngineCoreTest, MockExecutorTakesTheCostModelsIterationTime) {
  const perf::CostModel cost(*perf::model_preset("llama3-70b"), *perf::hardware_preset("8xA800"));
  MockExecutor mock(cost);
  IterationPlan plan;
  plan.decode_requests = 8;
  plan.decode_context_tokens = 80'000;
  EXPECT_DOUBLE_EQ(mock.run_iteration_s(plan), cost.decode_step_time_s(8, 80'000));
  plan.prefill_tokens = 512;
  plan.prefill_prefix_tokens = 1024;
  EXPECT_DOUBLE_EQ(mock.run_iteration_s(plan), cost.iteration_time_s(8, 80'000, 512, 1024));
}

// StepLog's gaps against a plain reading of paper §5.1: every gap of the request's steps, sorted, the mean of
// the longest ceil(n / 10). Requests long and short, in turn, and across trims: its scratch only grows, so a
// short request after a long one must not see the long one's gaps.
TEST(StepLogTest, GapsAreTheRequestsStepsAndTheTbtTheMeanOfTheLongestTenth) {
  std::mt19937_64 rng(5);
  StepLog log;
  double end_s = 0;
  auto append = [&] {
    end_s += 0.01 + static_cast<double>(rng() % 1000) * 1e-5;
    log.append(end_s);
  };
  for (int round = 0; round < 400; ++round) {
    const int64_t length = round % 2 == 0 ? 1 + static_cast<int64_t>(rng() % 300) : 1 + round % 7;
    const double first_token_s = end_s;
    const int64_t join_step = log.next_step();
    std::vector<double> ends;
    for (int64_t s = 0; s < length; ++s) {
      append();
      ends.push_back(end_s);
    }
    std::vector<double> expected{ends[0] - first_token_s};
    for (size_t i = 1; i < ends.size(); ++i) expected.push_back(ends[i] - ends[i - 1]);
    std::sort(expected.begin(), expected.end(), std::greater<>());
    const size_t k = std::max<size_t>(1, (expected.size() + 9) / 10);
    double sum = 0;
    for (size_t i = 0; i < k; ++i) sum += expected[i];

    const StepLog::Gaps got = log.gaps(first_token_s, join_step, log.next_step() - 1);
    ASSERT_DOUBLE_EQ(got.tbt_s, sum / static_cast<double>(k)) << "round " << round;
    ASSERT_EQ(got.max_gap_s, expected.front()) << "round " << round;
    log.trim_before(log.next_step());
  }
}

}  // namespace
}  // namespace crescent::engine
