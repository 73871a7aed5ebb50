// Router mode's pieces alone: the engines file, what an engine's KV events say it caches (under crescent's
// own block keys), and what its /metrics say.
#include "router/engines.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/temp_dir.h"
#include "kv/block_key.h"
#include "router/engine_cache.h"
#include "router/engine_metrics.h"
#include "router/router.h"

namespace crescent::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;
using nlohmann::json;

json engine(std::string name, std::string role = "both") {
  return {{"name", name},
          {"url", "http://10.0.0.5:8000"},
          {"role", role},
          {"model", "llama"},
          {"block_size", 16},
          {"kv_events", "tcp://10.0.0.5:5557"},
          {"kv_replay", "tcp://10.0.0.5:5558"}};
}

std::string error_of(const json& entry) {
  auto e = engine_from_json(entry, "engines.json: engines[0]");
  return e.ok() ? "" : e.status().message();
}

TEST(Engines, AnEntryReadsBackAsItWasWritten) {
  json j = engine("gpu-0", "prefill");
  j["profile"] = "p.json";
  j["cache_blocks"] = 4096;
  j["token_ids"] = false;
  j["kv_pool"] = "lmcache";
  auto e = engine_from_json(j, "x");
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->name, "gpu-0");
  EXPECT_EQ(e->role, EngineRole::kPrefill);
  EXPECT_EQ(e->block_size_tokens, 16);
  EXPECT_EQ(e->cache_blocks, 4096);
  EXPECT_FALSE(e->token_ids);
  EXPECT_EQ(e->kv_pool, "lmcache");
  EXPECT_EQ(to_json(*e), j);
}

TEST(Engines, EveryBadFieldIsNamedWithItsEngine) {
  json j = engine("gpu-0");
  j.erase("url");
  j.erase("model");
  EXPECT_THAT(error_of(j), HasSubstr("engines[0] ('gpu-0'): missing fields 'url', 'model'"));
  j = engine("gpu-0");
  j["role"] = "prefil";
  EXPECT_THAT(error_of(j), HasSubstr("('gpu-0'): field 'role': unknown engine role 'prefil' (valid: prefill, decode, both)"));
  j = engine("gpu-0");
  j["url"] = "https://10.0.0.5:8000";
  EXPECT_THAT(error_of(j), HasSubstr("field 'url' 'https://10.0.0.5:8000' is not http://HOST:PORT"));
  j["url"] = "http://10.0.0.5";
  EXPECT_THAT(error_of(j), HasSubstr("no port"));
  j["url"] = "http://10.0.0.5:99999";
  EXPECT_THAT(error_of(j), HasSubstr("port '99999' is not 1..65535"));
  j = engine("gpu-0");
  j["block_size"] = 0;
  EXPECT_THAT(error_of(j), HasSubstr("block_size"));
  j = engine("gpu-0");
  j["blocksize"] = 16;
  EXPECT_THAT(error_of(j), HasSubstr("blocksize"));
  j = engine("gpu-0");
  j["kv_events"] = "tcp://10.9.9.9:5557";  // someone else's publisher speaking for this engine
  EXPECT_THAT(error_of(j), HasSubstr("field 'kv_events': host '10.9.9.9' is not the url's host '10.0.0.5'"));
  j = engine("gpu-0");
  j.erase("kv_events");
  EXPECT_THAT(error_of(j), HasSubstr("'kv_replay' is given without 'kv_events'"));
  j = engine("gpu-0");
  j["token_ids"] = "yes";
  EXPECT_THAT(error_of(j), HasSubstr("'token_ids' must be true or false"));
  EXPECT_THAT(error_of(json::array()), HasSubstr("an engine must be a JSON object"));
}

TEST(Engines, TheEnginesTogetherMakeOneCluster) {
  const auto check = [](std::vector<json> entries) {
    std::vector<EngineEntry> engines;
    for (const json& j : entries) engines.push_back(*engine_from_json(j, "x"));
    Status s = check_engines(engines, "engines.json");
    return s.ok() ? std::string() : s.message();
  };
  EXPECT_EQ(check({engine("a"), engine("b")}), "");
  EXPECT_EQ(check({engine("p", "prefill"), engine("d", "decode")}), "");
  EXPECT_THAT(check({engine("a"), engine("a")}), HasSubstr("engines[1] ('a'): the name is taken"));
  json other = engine("b");
  other["block_size"] = 32;
  EXPECT_THAT(check({engine("a"), other}), HasSubstr("engines[1] ('b'): block_size 32 differs from engine 'a''s 16"));
  other = engine("b");
  other["model"] = "qwen";
  EXPECT_THAT(check({engine("a"), other}), HasSubstr("model 'qwen' differs from engine 'a''s 'llama'"));
  other = engine("b");
  other["kv_pool"] = "lmcache";
  EXPECT_THAT(
      check({engine("a"), other}),
      HasSubstr("engines[1] ('b'): kv_pool 'lmcache' differs from engine 'a''s '' (the engines share one"));
  json pooled = engine("a");
  pooled["kv_pool"] = "lmcache";
  EXPECT_EQ(check({pooled, other}), "");
  EXPECT_THAT(check({engine("a"), engine("p", "prefill")}), HasSubstr("either all colocated"));
  EXPECT_THAT(check({engine("p", "prefill")}), HasSubstr("1 prefill and 0 decode engines"));
  EXPECT_THAT(check({}), HasSubstr("no engines"));
}

TEST(Engines, GlobalCacheAwarePlacesByFetchesOnlyWhenTheEnginesShareAKvPool) {
  RouterOptions options;
  options.engines.push_back(*engine_from_json(engine("a"), "x"));
  options.config.serve.policy = conductor::PrefillPolicy::kGlobalCacheAware;
  EXPECT_EQ(placement_policy(options), conductor::PrefillPolicy::kCacheAware);
  options.engines.front().kv_pool = "lmcache";
  EXPECT_EQ(placement_policy(options), conductor::PrefillPolicy::kGlobalCacheAware);
  options.config.serve.policy = conductor::PrefillPolicy::kLeastLoaded;
  EXPECT_EQ(placement_policy(options), conductor::PrefillPolicy::kLeastLoaded);
}

TEST(Engines, AFileNamesItselfInItsErrors) {
  auto dir = TempDir::create("engines-test");
  ASSERT_TRUE(dir.ok());
  const std::string path = dir->path() + "/engines.json";
  std::ofstream(path) << json{{"engines", {engine("a"), {{"name", "b"}}}}}.dump();
  auto bad = load_engines_file(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr(path + ": engines[1] ('b'): missing fields"));
  std::ofstream(path) << json{{"engines", {engine("a"), engine("b")}}, {"engine", 1}}.dump();
  EXPECT_THAT(load_engines_file(path).status().message(), HasSubstr("engine"));
  std::ofstream(path) << json::array({engine("a"), engine("b")}).dump();
  auto good = load_engines_file(path);
  ASSERT_TRUE(good.ok()) << good.status().message();
  EXPECT_EQ(good->size(), 2u);
}

// ---- What an engine caches, from its KV events -----------------------------------------------------------

constexpr BlockKey kSeed = 77;
constexpr int64_t kBlock = 4;

std::vector<int64_t> tokens(int64_t n, int64_t from = 0) {
  std::vector<int64_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(from + i);
  return t;
}

// A BlockStored event as an engine sends it: its own hashes (anything), the parent's hash, the tokens.
serve::KvEvent stored(std::vector<BlockKey> engine_hashes, std::optional<BlockKey> parent,
                      std::vector<int64_t> token_ids, std::optional<std::string> medium = std::nullopt) {
  serve::KvEvent e;
  e.kind = serve::KvEvent::Kind::kStored;
  e.block_hashes = std::move(engine_hashes);
  e.parent_block_hash = parent;
  e.token_ids = std::move(token_ids);
  e.block_size = kBlock;
  e.medium = std::move(medium);
  return e;
}
serve::KvEvent removed(std::vector<BlockKey> engine_hashes, std::optional<std::string> medium = std::nullopt) {
  serve::KvEvent e;
  e.kind = serve::KvEvent::Kind::kRemoved;
  e.block_hashes = std::move(engine_hashes);
  e.medium = std::move(medium);
  return e;
}
serve::KvEvent all_cleared() {
  serve::KvEvent e;
  e.kind = serve::KvEvent::Kind::kAllCleared;
  return e;
}
serve::KvEventBatch batch(std::vector<serve::KvEvent> events) {
  serve::KvEventBatch b;
  b.events = std::move(events);
  return b;
}

TEST(EngineCache, StoredBlocksAreKeyedAsCrescentKeysThePromptWhateverTheEngineHashes) {
  EngineCache cache(kSeed, kBlock, 0);
  EXPECT_EQ(cache.tracking(), CacheTracking::kEvents);
  const std::vector<int64_t> prompt = tokens(14);  // 3 full blocks and 2 tokens
  const std::vector<BlockKey> keys = kv::prompt_block_keys(prompt, kBlock, kSeed);
  CacheChanges changes;
  // Two blocks, then the third as a child of the second (engine hashes 900, 901, 902).
  cache.apply(batch({stored({900, 901}, std::nullopt, tokens(8))}), changes);
  cache.apply(batch({stored({902}, 901, tokens(4, 8))}), changes);
  EXPECT_EQ(changes.stored, keys);
  EXPECT_EQ(cache.blocks(), 3);
  // Removing the engine's 902 removes crescent's third key.
  changes.clear();
  cache.apply(batch({removed({902, 12345})}), changes);
  EXPECT_THAT(changes.removed, ElementsAre(keys[2]));
  EXPECT_EQ(cache.blocks(), 2);
}

TEST(EngineCache, ABlockStaysWhileAnyTierHoldsIt) {
  EngineCache cache(kSeed, kBlock, 0);
  CacheChanges changes;
  cache.apply(batch({stored({1}, std::nullopt, tokens(4), "GPU"), stored({1}, std::nullopt, tokens(4), "CPU")}),
              changes);
  EXPECT_EQ(changes.stored.size(), 1u);  // one block, in two tiers
  changes.clear();
  cache.apply(batch({removed({1}, "GPU")}), changes);  // offloaded: still in CPU memory
  EXPECT_THAT(changes.removed, IsEmpty());
  cache.apply(batch({removed({1}, "CPU")}), changes);
  EXPECT_EQ(changes.removed.size(), 1u);
}

TEST(EngineCache, WhatCannotBeKeyedIsCountedNotIndexed) {
  EngineCache cache(kSeed, kBlock, 0);
  CacheChanges changes;
  cache.apply(batch({stored({5}, 4, tokens(4))}), changes);  // parent 4 never seen
  serve::KvEvent wrong_size = stored({6}, std::nullopt, tokens(8));
  wrong_size.block_size = 8;
  cache.apply(batch({wrong_size}), changes);
  cache.apply(batch({stored({7, 8}, std::nullopt, tokens(7))}), changes);  // 7 tokens for 2 blocks of 4
  EXPECT_THAT(changes.stored, IsEmpty());
  EXPECT_EQ(cache.problems().unknown_parent_blocks, 1u);
  EXPECT_EQ(cache.problems().wrong_block_size, 1u);
  EXPECT_EQ(cache.problems().wrong_token_count, 1u);
}

TEST(EngineCache, AllBlocksClearedForgetsWhatCameBeforeInTheBatch) {
  EngineCache cache(kSeed, kBlock, 0);
  CacheChanges changes;
  cache.apply(batch({stored({1}, std::nullopt, tokens(4)), all_cleared(),
                     stored({2}, std::nullopt, tokens(4, 100))}),
              changes);
  EXPECT_TRUE(changes.cleared);
  EXPECT_THAT(changes.stored, ElementsAre(kv::chain_block_key(kSeed, tokens(4, 100))));
  EXPECT_EQ(cache.blocks(), 1);
}

TEST(EngineCache, WithoutEventsAnLruOfTheEnginesSizeFollowsWhatWasRouted) {
  EngineCache cache(kSeed, kBlock, /*approximate_capacity_blocks=*/3);
  EXPECT_EQ(cache.tracking(), CacheTracking::kApproximate);
  const auto a = kv::prompt_block_keys(tokens(8), kBlock, kSeed);        // 2 blocks
  const auto b = kv::prompt_block_keys(tokens(8, 50), kBlock, kSeed);    // 2 others
  CacheChanges changes;
  cache.on_prefill_done(a, changes);
  EXPECT_THAT(changes.stored, UnorderedElementsAreArray(a));
  changes.clear();
  cache.on_prefill_done(b, changes);  // 4 blocks for 3 places: a's least recent goes
  EXPECT_THAT(changes.stored, UnorderedElementsAreArray(b));
  ASSERT_EQ(changes.removed.size(), 1u);
  EXPECT_EQ(cache.blocks(), 3);
  cache.clear();
  EXPECT_EQ(cache.blocks(), 0);
}

// ---- What an engine's /metrics say -------------------------------------------------------------------

TEST(EngineMetrics, ReadsVllmsNamesSummingLabelSets) {
  const std::string text = R"(# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 2.0
vllm:num_requests_waiting{model_name="llama"} 7
vllm:kv_cache_usage_perc{model_name="llama"} 0.25
vllm:prefix_cache_queries_total{model_name="llama"} 1000
vllm:prefix_cache_hits_total{model_name="llama"} 400
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048",num_cpu_blocks="None"} 1.0
garbage line without a value
vllm:num_requests_waiting{model_name="llama"} NaN
)";
  const EngineMetrics m = parse_engine_metrics(text);
  EXPECT_EQ(m.requests_running, 5.0);
  EXPECT_EQ(m.requests_waiting, 7.0);
  EXPECT_EQ(m.kv_cache_usage, 0.25);
  EXPECT_EQ(m.prefix_cache_queries_tokens, 1000.0);
  EXPECT_EQ(m.prefix_cache_hits_tokens, 400.0);
  EXPECT_EQ(m.block_size_tokens, 16);
  EXPECT_EQ(m.gpu_blocks, 2048);
}

TEST(EngineMetrics, ReadsSglangsNamesAndLeavesTheRestAbsent) {
  const EngineMetrics m =
      parse_engine_metrics("sglang:num_running_reqs{model_name=\"q\"} 4\nsglang:num_queue_reqs 1\nsglang:token_usage 0.5\n");
  EXPECT_EQ(m.requests_running, 4.0);
  EXPECT_EQ(m.requests_waiting, 1.0);
  EXPECT_EQ(m.kv_cache_usage, 0.5);
  EXPECT_FALSE(m.block_size_tokens);
  EXPECT_FALSE(m.prefix_cache_hits_tokens);
  EXPECT_FALSE(parse_engine_metrics("").requests_running);
}

}  // namespace
}  // namespace crescent::router
