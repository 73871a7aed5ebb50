// The model bench driver in process on a generated tiny model: the rows it reports are the lengths and
// batches it ran, with the numbers derived from the times as documented, the progress seen row by row; bad
// lengths refused.
#include "bench/model_bench.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/llama.h"
#include "test_support/temp_dir.h"

namespace crescent::bench {
namespace {

using ::testing::HasSubstr;

ModelBenchOptions tiny_model_bench(const std::string& dir) {
  ModelBenchOptions options;
  options.model_dir = dir;
  options.threads = 1;
  options.prefill_tokens = {4, 9};
  options.batch = {1, 2};
  options.context_tokens = {0, 5};
  options.block_size_tokens = 4;
  options.seconds = 0.001;
  options.bandwidth_buffer_bytes = 16 << 20;
  return options;
}

class ModelBenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = model::llama_preset("tiny").value();
    ASSERT_TRUE(model::init_llama_model(config_, 7, dir_.path()).ok());
  }
  test::TempDir dir_;
  model::LlamaConfig config_;
};

TEST_F(ModelBenchTest, ReportsTheTokensAndBatchesItRan) {
  ModelBenchOptions options = tiny_model_bench(dir_.path());
  std::vector<std::pair<size_t, size_t>> progress;  // (prefill rows, decode rows) at each call
  options.progress = [&](const ModelBenchReport& r) {
    progress.push_back({r.prefill.size(), r.decode.size()});
  };
  Result<ModelBenchReport> report = run_model_bench(options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();

  EXPECT_EQ(report->model.layers, config_.num_hidden_layers);
  EXPECT_EQ(report->model.hidden, config_.hidden_size);
  EXPECT_EQ(report->model.parameters, config_.parameters());
  EXPECT_EQ(report->model.kv_bytes_per_token, config_.kv_bytes_per_token());
  EXPECT_EQ(report->threads, 1);
  EXPECT_GT(report->limits.sgemm_flops_per_s, 0);
  EXPECT_EQ(report->limits.sgemm_flops_per_s,
            std::max(report->limits.openblas_sgemm_flops_per_s, report->limits.onednn_matmul_flops_per_s));
  EXPECT_EQ(report->limits.sgemm_rows, 9);  // the longest prompt, below 512
  EXPECT_GT(report->limits.memory_read_bytes_per_s, 0);

  ASSERT_EQ(report->prefill.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const ModelBenchPrefill& p = report->prefill[i];
    EXPECT_EQ(p.tokens, options.prefill_tokens[i]);
    EXPECT_GT(p.seconds, 0);
    EXPECT_DOUBLE_EQ(p.tokens_per_s, static_cast<double>(p.tokens) / p.seconds);
    EXPECT_DOUBLE_EQ(p.of_sgemm, p.flops_per_s / report->limits.sgemm_flops_per_s);
  }
  const int64_t weight_bytes = config_.parameters() * 4;
  ASSERT_EQ(report->decode.size(), 4u);
  const std::vector<std::pair<int64_t, int64_t>> configs = {{1, 0}, {1, 5}, {2, 0}, {2, 5}};
  for (size_t i = 0; i < 4; ++i) {
    const ModelBenchDecode& d = report->decode[i];
    EXPECT_EQ(std::pair(d.batch, d.context_tokens), configs[i]);
    EXPECT_GT(d.step_seconds, 0);
    EXPECT_EQ(d.bytes_read, static_cast<double>(weight_bytes + d.batch * (d.context_tokens + 1) *
                                                                   config_.kv_bytes_per_token()));
    EXPECT_DOUBLE_EQ(d.bound_seconds, d.bytes_read / report->limits.memory_read_bytes_per_s);
  }
  EXPECT_EQ(report->memory.weight_bytes, weight_bytes);
  // KV room for the larger of: 2 sequences of 6 tokens (2 blocks of 4 each), one prompt of 9 (3 blocks).
  EXPECT_EQ(report->memory.kv_cache_blocks, 4);
  EXPECT_GT(report->memory.kv_cache_bytes, 0);
  EXPECT_GT(report->memory.rss_bytes, 0);

  // Once the limits are known, then after every row.
  const std::vector<std::pair<size_t, size_t>> expected = {{0, 0}, {1, 0}, {2, 0}, {2, 1},
                                                           {2, 2}, {2, 3}, {2, 4}};
  EXPECT_EQ(progress, expected);
}

TEST_F(ModelBenchTest, APresetIsGeneratedWhenNoDirectoryIsGiven) {
  ModelBenchOptions options = tiny_model_bench("");
  options.preset = "tiny";
  options.prefill_tokens = {3};
  options.batch = {1};
  options.context_tokens = {2};
  Result<ModelBenchReport> report = run_model_bench(options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->model.layers, config_.num_hidden_layers);
  ASSERT_EQ(report->prefill.size(), 1u);
  EXPECT_EQ(report->prefill[0].tokens, 3);
}

TEST_F(ModelBenchTest, LengthsOutsideTheContextWindowAreRefused) {
  ModelBenchOptions options = tiny_model_bench(dir_.path());
  options.prefill_tokens = {config_.max_position_embeddings + 1};
  EXPECT_THAT(run_model_bench(options).status().message(), HasSubstr("--prefill-tokens"));
  options = tiny_model_bench(dir_.path());
  options.context_tokens = {config_.max_position_embeddings};
  EXPECT_THAT(run_model_bench(options).status().message(), HasSubstr("--context"));
  options = tiny_model_bench(dir_.path());
  options.batch = {};
  EXPECT_EQ(run_model_bench(options).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(run_model_bench(tiny_model_bench("/nonexistent/model")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace crescent::bench
