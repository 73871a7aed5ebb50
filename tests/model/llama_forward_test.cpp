#include "model/llama_forward.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>

#include "model/sampler.h"
#include "test_support/temp_dir.h"

namespace crescent::model {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kBlockTokens = 16;

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return tokens;
}

LlamaModel make_model(const LlamaConfig& config, uint64_t seed, const std::string& dir) {
  EXPECT_TRUE(init_llama_model(config, seed, dir).ok());
  auto model = load_llama_model(dir);
  EXPECT_TRUE(model.ok()) << model.status().message();
  return std::move(*model);
}

// A sequence's KV blocks in a cache, allocated as it grows.
struct Sequence {
  std::vector<int32_t> tokens;  // prompt, then generated
  std::vector<int32_t> blocks = {};
  void reserve(PagedKvCache& cache, int64_t tokens_total) {
    while (static_cast<int64_t>(blocks.size()) * kBlockTokens < tokens_total) {
      blocks.push_back(cache.allocate().value());
    }
  }
};

// Prefills `prompt` in chunks of `chunk` tokens (0: whole) after `prefix` tokens already in `seq`'s
// blocks, then decodes greedily to `steps` tokens; returns them.
std::vector<int32_t> greedy(LlamaForward& model, PagedKvCache& cache, Sequence& seq, int64_t prefix,
                            int64_t chunk, int64_t steps) {
  const auto n = static_cast<int64_t>(seq.tokens.size());
  seq.reserve(cache, n + steps);
  std::vector<int32_t> out;
  for (int64_t start = prefix; start < n;) {
    const int64_t len = chunk == 0 ? n - start : std::min(chunk, n - start);
    const ForwardSequence f{.tokens = std::span(seq.tokens).subspan(start, len),
                            .start_position = start,
                            .block_table = seq.blocks,
                            .logits = start + len == n ? LogitsWanted::kLast : LogitsWanted::kNone};
    auto logits = model.forward({&f, 1}, cache);
    EXPECT_TRUE(logits.ok()) << logits.status().message();
    start += len;
    if (start == n) out.push_back(Sampler({}).sample(*logits));
  }
  while (static_cast<int64_t>(out.size()) < steps) {
    seq.tokens.push_back(out.back());
    const ForwardSequence f{.tokens = std::span(seq.tokens).last(1),
                            .start_position = static_cast<int64_t>(seq.tokens.size()) - 1,
                            .block_table = seq.blocks};
    out.push_back(Sampler({}).sample(model.forward({&f, 1}, cache).value()));
  }
  return out;
}

class LlamaForwardTest : public ::testing::Test {
 protected:
  test::TempDir dir_{"forward"};
};

// The logits of every position of several prompts against tests/model/reference_llama.py (NumPy, float64,
// dense attention) on the same files: fp32 and bf16 weights, grouped-query and multi-query attention, tied
// and untied LM heads, prompts within one block and across several.
TEST_F(LlamaForwardTest, LogitsMatchTheNumpyReference) {
  LlamaConfig tied = llama_preset("tiny").value();
  tied.num_hidden_layers = 3;
  tied.num_key_value_heads = 1;
  tied.tie_word_embeddings = true;
  tied.rope_theta = 500000;
  LlamaConfig bf16 = llama_preset("tiny").value();
  bf16.dtype = DType::kBF16;
  const std::vector<std::pair<std::string, LlamaConfig>> configs = {
      {"tiny", llama_preset("tiny").value()}, {"bf16", bf16}, {"tied", tied}};
  const std::vector<std::vector<int32_t>> prompts = {
      {7}, random_tokens(13, 256, 1), random_tokens(61, 256, 2)};
  {
    std::ofstream out(dir_.path() + "/prompts.json");
    out << "[";
    for (size_t p = 0; p < prompts.size(); ++p) {
      out << (p ? "," : "") << "[";
      for (size_t i = 0; i < prompts[p].size(); ++i) out << (i ? "," : "") << prompts[p][i];
      out << "]";
    }
    out << "]";
  }
  for (const auto& [name, config] : configs) {
    SCOPED_TRACE(name);
    const std::string model_dir = dir_.path() + "/" + name;
    LlamaForward model(make_model(config, 42, model_dir));
    const std::string reference = dir_.path() + "/" + name + ".bin";
    const std::string command = CRESCENT_NUMPY_PYTHON " " CRESCENT_SOURCE_DIR "/tests/model/reference_llama.py " +
                                model_dir + " " + dir_.path() + "/prompts.json " + reference;
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    std::ifstream in(reference, std::ios::binary);
    for (const std::vector<int32_t>& prompt : prompts) {
      PagedKvCache cache(model.kv_layout(kBlockTokens), 8);
      Sequence seq{.tokens = prompt};
      seq.reserve(cache, static_cast<int64_t>(prompt.size()));
      const ForwardSequence f{.tokens = prompt, .block_table = seq.blocks, .logits = LogitsWanted::kAll};
      auto logits = model.forward({&f, 1}, cache);
      ASSERT_TRUE(logits.ok()) << logits.status().message();
      std::vector<float> expected(logits->size());
      ASSERT_EQ(logits->size(), prompt.size() * 256);
      in.read(reinterpret_cast<char*>(expected.data()), static_cast<std::streamsize>(expected.size() * 4));
      ASSERT_TRUE(in.good());
      for (size_t row = 0; row < prompt.size(); ++row) {
        double max_ref = 0, max_diff = 0;
        for (size_t v = 0; v < 256; ++v) {
          max_ref = std::max(max_ref, std::abs(static_cast<double>(expected[row * 256 + v])));
          max_diff = std::max(
              max_diff, std::abs(static_cast<double>((*logits)[row * 256 + v]) - expected[row * 256 + v]));
        }
        ASSERT_GT(max_ref, 0);
        EXPECT_LE(max_diff, 1e-4 * max_ref) << "prompt of " << prompt.size() << " tokens, position " << row;
      }
    }
  }
}

// Greedy tokens are the same whether the prompt's KV is computed whole, in chunks, or partly copied from
// another cache's blocks (a prefix from the pool: the bytes only), and whether the request runs alone or
// batched with others at other positions.
TEST_F(LlamaForwardTest, GreedyTokensAreTheSameHoweverTheKvWasMade) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    LlamaConfig config = llama_preset("tiny").value();
    config.dtype = dtype;
    LlamaForward model(make_model(config, 7, dir_.path() + "/" + std::string(to_string(dtype))));
    const std::vector<int32_t> prompt = random_tokens(75, 256, 3);
    constexpr int64_t kSteps = 24;

    PagedKvCache cache(model.kv_layout(kBlockTokens), 64);
    Sequence whole{.tokens = prompt};
    const std::vector<int32_t> expected = greedy(model, cache, whole, 0, 0, kSteps);
    ASSERT_EQ(expected.size(), kSteps);

    for (const int64_t chunk : {1, 16, 29}) {
      Sequence chunked{.tokens = prompt};
      EXPECT_EQ(greedy(model, cache, chunked, 0, chunk, kSteps), expected) << "chunks of " << chunk;
    }

    // The first 4 blocks (64 tokens) from `whole`'s blocks into a cache of another process, then the rest.
    PagedKvCache other(model.kv_layout(kBlockTokens), 64);
    Sequence reused{.tokens = prompt};
    reused.reserve(other, 64);
    for (size_t b = 0; b < 4; ++b) {
      std::ranges::copy(cache.block_bytes(whole.blocks[b]), other.block_bytes(reused.blocks[b]).begin());
    }
    EXPECT_EQ(greedy(model, other, reused, 64, 0, kSteps), expected);

    // Batched: the same request's decode steps alongside two others (one prefilling, one decoding).
    Sequence mine{.tokens = prompt}, a{.tokens = random_tokens(40, 256, 4)},
        b{.tokens = random_tokens(9, 256, 5)};
    PagedKvCache shared(model.kv_layout(kBlockTokens), 64);
    for (Sequence* s : {&mine, &a, &b}) s->reserve(shared, static_cast<int64_t>(s->tokens.size()) + kSteps);
    std::vector<int32_t> got;
    {
      const std::vector<ForwardSequence> batch = {{.tokens = mine.tokens, .block_table = mine.blocks},
                                                  {.tokens = b.tokens, .block_table = b.blocks}};
      auto logits = model.forward(batch, shared).value();
      got.push_back(Sampler({}).sample(logits.first(256)));
      b.tokens.push_back(Sampler({}).sample(logits.subspan(256, 256)));
    }
    for (int64_t step = 1; step < kSteps; ++step) {
      mine.tokens.push_back(got.back());
      std::vector<ForwardSequence> batch = {{.tokens = std::span(mine.tokens).last(1),
                                             .start_position = static_cast<int64_t>(mine.tokens.size()) - 1,
                                             .block_table = mine.blocks},
                                            {.tokens = std::span(b.tokens).last(1),
                                             .start_position = static_cast<int64_t>(b.tokens.size()) - 1,
                                             .block_table = b.blocks}};
      if (step == 3) batch.push_back({.tokens = a.tokens, .block_table = a.blocks});
      auto logits = model.forward(batch, shared).value();
      got.push_back(Sampler({}).sample(logits.first(256)));
      b.tokens.push_back(Sampler({}).sample(logits.subspan(256, 256)));
    }
    EXPECT_EQ(got, expected);
  }
}

TEST_F(LlamaForwardTest, KvBlocksAreTheCostModelsBytes) {
  for (const std::string name : {"tiny", "small"}) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      LlamaConfig config = llama_preset(name).value();
      config.dtype = dtype;
      const KvBlockLayout layout{.layers = config.num_hidden_layers,
                                 .kv_heads = config.num_key_value_heads,
                                 .head_dim = config.head_dim(),
                                 .block_size_tokens = 64,
                                 .dtype = dtype};
      EXPECT_EQ(layout.block_bytes(), 64 * config.kv_bytes_per_token());
      // The last element of the last layer's values ends the block.
      EXPECT_EQ(layout.offset(config.num_hidden_layers - 1, 1, config.num_key_value_heads - 1, 63) +
                    config.head_dim(),
                layout.block_elements());
    }
  }
}

TEST_F(LlamaForwardTest, BadBatchesAreRefusedAndWriteNothing) {
  LlamaForward model(make_model(llama_preset("tiny").value(), 1, dir_.path() + "/m"));
  PagedKvCache cache(model.kv_layout(kBlockTokens), 4);
  const std::vector<int32_t> blocks = {0, 1};
  const std::vector<int32_t> ok_tokens = {1, 2, 3};
  const std::vector<int32_t> bad_token = {1, 256};
  const auto error = [&](std::vector<ForwardSequence> batch) {
    auto r = model.forward(batch, cache);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    return r.status().message();
  };
  EXPECT_THAT(error({}), HasSubstr("empty batch"));
  EXPECT_THAT(error({{.tokens = {}, .block_table = blocks}}), HasSubstr("no tokens"));
  EXPECT_THAT(error({{.tokens = bad_token, .block_table = blocks}}), HasSubstr("token id 256"));
  EXPECT_THAT(error({{.tokens = ok_tokens, .start_position = 4094, .block_table = blocks}}),
              HasSubstr("context is 4096"));
  EXPECT_THAT(error({{.tokens = ok_tokens, .start_position = 30, .block_table = blocks}}),
              HasSubstr("needs 3 KV blocks"));
  const std::vector<int32_t> outside = {0, 9};
  EXPECT_THAT(error({{.tokens = ok_tokens, .start_position = 20, .block_table = outside}}),
              HasSubstr("block 1 is 9"));
  for (int32_t b = 0; b < 4; ++b) {
    for (std::byte x : cache.block_bytes(b)) ASSERT_EQ(x, std::byte{0});
  }
  LlamaConfig other = llama_preset("tiny").value();
  other.num_key_value_heads = 4;
  LlamaForward wider(make_model(other, 1, dir_.path() + "/w"));
  PagedKvCache wrong(wider.kv_layout(kBlockTokens), 4);
  const std::vector<ForwardSequence> batch = {{.tokens = ok_tokens, .block_table = blocks}};
  auto r = model.forward(batch, wrong);
  EXPECT_THAT(r.status().message(), HasSubstr("KV cache's blocks are for 2 layers × 4 KV heads"));
}

TEST(PagedKvCache, HandsOutEachBlockOnceUntilReleased) {
  PagedKvCache cache({.layers = 1, .kv_heads = 1, .head_dim = 2, .block_size_tokens = 4}, 3);
  EXPECT_EQ(cache.bytes().size(), 3u * 2 * 4 * 2 * 4);
  std::vector<int32_t> got;
  while (auto b = cache.allocate()) got.push_back(*b);
  std::ranges::sort(got);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(cache.free_blocks(), 0);
  cache.release(1);
  EXPECT_EQ(cache.allocate(), 1);
  EXPECT_EQ(cache.block_bytes(2).data(), cache.bytes().data() + 2 * 64);
}

}  // namespace
}  // namespace crescent::model
