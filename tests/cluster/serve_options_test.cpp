// How a config and the command line become a live run's options (cluster/serve_options.h): names into
// enums, and with the cpu executor the model directory and the KV cache budget that bounds the capacities.
#include "cluster/serve_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/llama.h"
#include "test_support/temp_dir.h"

namespace crescent::cluster {
namespace {

using ::testing::HasSubstr;

class ServeOptions : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(model::init_llama_model(model::llama_preset("tiny").value(), 3, dir_.file("m")).ok());
    auto config = load_cluster_config(CRESCENT_SOURCE_DIR "/configs/local.json", 16);
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    config_ = *config;
  }
  Result<ServeSetup> resolve(ServeOverrides overrides) {
    overrides.block_size_tokens = 16;
    return resolve_serve_options(config_, CRESCENT_SOURCE_DIR "/configs/local.json", overrides);
  }
  test::TempDir dir_;
  ClusterConfig config_;
};

TEST_F(ServeOptions, NamesAreParsedOnceAndErrorsListTheValidOnes) {
  auto s = resolve({.policy = "cache-aware", .admission = "early"});
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->cluster.config.serve.policy, conductor::PrefillPolicy::kCacheAware);
  EXPECT_EQ(s->cluster.config.serve.admission, conductor::Admission::kEarly);
  EXPECT_EQ(s->cluster.model_name, "mock");
  EXPECT_THAT(resolve({.policy = "fastest"}).status().message(),
              HasSubstr("--policy: unknown prefill policy 'fastest' (valid: random, round-robin, least-loaded"));
  EXPECT_THAT(resolve({.executor = "gpu"}).status().message(),
              HasSubstr("--executor: unknown executor 'gpu' (valid: mock, cpu)"));
  EXPECT_THAT(resolve({.executor = "cpu"}).status().message(), HasSubstr("--executor cpu needs a model"));
}

// tiny: 2 layers x 2 (K, V) x 1 KV head x 32 dims x 4 bytes = 512 bytes per token; context 4096 tokens.
TEST_F(ServeOptions, TheKvCacheBudgetBoundsTheCapacities) {
  const int64_t budget = 64 << 20;  // 131072 tokens
  auto s = resolve({.executor = "cpu", .model_dir = dir_.file("m"), .kv_cache_bytes = budget});
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const ClusterConfig& c = s->cluster.config;
  EXPECT_EQ(cost_model(c).kv_bytes_per_token(), 512);
  const int64_t tokens = budget / 512, rounding = kDecodeRoundingBlocks * 16;
  // Decode: half for its batch, half to receive, each less a block of rounding per request.
  EXPECT_EQ(c.decode_kv_capacity_tokens, (tokens - 2 * rounding) / 2);
  EXPECT_EQ(decode_kv_capacity_tokens(c), c.decode_kv_capacity_tokens);
  // Prefill: the rest after two prompts of the model's context (the one it computes, its staging copy).
  EXPECT_EQ(c.prefill_cache_capacity_tokens, tokens - 2 * (4096 + 16));
  EXPECT_EQ(c.serve.kv_cache_bytes, budget);
  EXPECT_EQ(s->cluster.model_context_tokens, 4096);
  EXPECT_EQ(max_context_tokens(s->cluster), 4096);
  EXPECT_THAT(s->kv_cache_note, HasSubstr("KV cache 0.06 GiB per instance (--kv-cache-bytes)"));

  // A config's own capacities below the budget's stand.
  config_.prefill_cache_capacity_tokens = 1024;
  s = resolve({.executor = "cpu", .model_dir = dir_.file("m"), .kv_cache_bytes = budget});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->cluster.config.prefill_cache_capacity_tokens, 1024);

  // Too small for one request of the context: the numbers, and what to give.
  auto refused = resolve({.executor = "cpu", .model_dir = dir_.file("m"), .kv_cache_bytes = 4 << 20});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(
      refused.status().message(),
      HasSubstr("a KV cache budget of 4194304 bytes per instance (--kv-cache-bytes) holds 8192 tokens"));
  EXPECT_THAT(refused.status().message(),
              HasSubstr("Give --kv-cache-bytes " + std::to_string(2 * (4096 + rounding) * 512)));
}

TEST_F(ServeOptions, WithoutABudgetItComesFromThisMachinesMemory) {
  auto one = resolve({.executor = "cpu", .model_dir = dir_.file("m")});
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_THAT(one->kv_cache_note, HasSubstr("available on this machine, shared by 1 instance,"));
  auto all = resolve({.executor = "cpu", .model_dir = dir_.file("m"), .all_instances_on_this_machine = true});
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(all->kv_cache_note, HasSubstr("shared by 4 instances"));
  // Four instances share what one would have (the machine's memory moves a little between the two reads).
  const double ratio = static_cast<double>(one->cluster.config.serve.kv_cache_bytes) /
                       static_cast<double>(all->cluster.config.serve.kv_cache_bytes);
  EXPECT_NEAR(ratio, 4, 0.2);
}

}  // namespace
}  // namespace crescent::cluster
