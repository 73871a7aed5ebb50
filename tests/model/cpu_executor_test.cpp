#include "model/cpu_executor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>

#include "test_support/temp_dir.h"

namespace crescent::model {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kBlock = 16;

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 256);
  return tokens;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Chained keys of the full blocks (only equality matters here: equal prefixes, equal keys).
std::vector<BlockKey> keys_of(const std::vector<int32_t>& prompt) {
  std::vector<BlockKey> keys;
  BlockKey parent = 0;
  for (size_t b = 0; (b + 1) * kBlock <= prompt.size(); ++b) {
    for (size_t i = b * kBlock; i < (b + 1) * kBlock; ++i) {
      parent = parent * 1099511628211ULL + static_cast<BlockKey>(prompt[i]) + 1;
    }
    keys.push_back(parent);
  }
  return keys;
}

// An engine with the CPU executor, driven on its own timeline (each iteration ends when the executor says).
class Instance : public engine::EngineListener {
 public:
  Instance(LlamaForward& model, engine::EngineOptions options, int64_t capacity_blocks = 64)
      : executor_(model, {.block_size_tokens = kBlock, .capacity_blocks = capacity_blocks}),
        engine_(options, executor_, *this) {}

  void submit(engine::RequestId id, const std::vector<int32_t>& prompt, int64_t output_tokens,
              SamplingParams sampling = {}) {
    const std::vector<BlockKey> keys = keys_of(prompt);
    ASSERT_TRUE(
        executor_
            .add_request(
                id,
                {.prompt = prompt, .block_keys = keys, .output_tokens = output_tokens, .sampling = sampling})
            .ok());
    engine_.submit_prompt(id, static_cast<int64_t>(prompt.size()), output_tokens, keys, now_s_);
  }
  // Submits a request registered with the executor already.
  void submit_only(engine::RequestId id, const std::vector<int32_t>& prompt, int64_t output_tokens) {
    engine_.submit_prompt(id, std::ssize(prompt), output_tokens, keys_of(prompt), now_s_);
  }
  // A disaggregated decode: the request's KV is in the executor (add_decoding); it joins the batch now.
  void decode(engine::RequestId id, int64_t input_tokens, int64_t output_tokens) {
    engine_.expect(id, input_tokens, output_tokens, now_s_);
    ASSERT_TRUE(engine_.submit_decode(id, now_s_, now_s_));
    run();
  }
  void run() {
    while (engine_.busy()) {
      now_s_ = engine_.next_event_s();
      engine_.advance_until(now_s_);
    }
  }
  CpuExecutor& executor() { return executor_; }
  std::map<engine::RequestId, std::vector<int32_t>> outputs;
  std::map<engine::RequestId, int64_t> hits, reused;
  std::map<engine::RequestId, std::string> errors;
  std::map<engine::RequestId, std::vector<TokenLogprobs>> logprobs;

  void on_prefill_start(engine::RequestId id, double, const engine::PrefillStart& start) override {
    hits[id] = start.hit_tokens;
  }
  void on_first_token(engine::RequestId id, double) override { reused[id] = executor_.reused_tokens(id); }
  void on_finished(engine::RequestId id, double, const std::optional<engine::StepLog::Gaps>&) override {
    const auto out = executor_.output(id);
    outputs[id].assign(out.begin(), out.end());
    errors[id] = executor_.error(id);
    const auto lps = executor_.logprobs(id);
    logprobs[id].assign(lps.begin(), lps.end());
  }

 private:
  CpuExecutor executor_;
  engine::EngineCore engine_;
  double now_s_ = 0;
};

const engine::EngineOptions kColocated{
    .kv_capacity_tokens = 64 * kBlock, .prefix_cache = true, .block_size_tokens = kBlock};

class CpuExecutorTest : public ::testing::Test {
 protected:
  CpuExecutorTest() {
    auto loaded = load_or_init();
    model_ = std::make_unique<LlamaForward>(loaded);
  }
  LlamaModel load_or_init() {
    EXPECT_TRUE(init_llama_model(llama_preset("tiny").value(), 11, dir_.path()).ok());
    return load_llama_model(dir_.path()).value();
  }
  // Each prompt alone on a fresh instance.
  std::vector<int32_t> alone(const std::vector<int32_t>& prompt, int64_t output_tokens,
                             SamplingParams sampling = {}) {
    Instance instance(*model_, kColocated);
    instance.submit(1, prompt, output_tokens, sampling);
    instance.run();
    return instance.outputs.at(1);
  }

  // The logprobs (with `top` alternatives) of each prompt's tokens alone on a fresh instance.
  std::vector<TokenLogprobs> alone_logprobs(const std::vector<int32_t>& prompt, int64_t output_tokens,
                                            SamplingParams sampling, int32_t top) {
    Instance instance(*model_, kColocated);
    EXPECT_TRUE(instance.executor()
                    .add_request(1, {.prompt = prompt,
                                     .block_keys = keys_of(prompt),
                                     .output_tokens = output_tokens,
                                     .sampling = sampling,
                                     .top_logprobs = top})
                    .ok());
    instance.submit_only(1, prompt, output_tokens);
    instance.run();
    return instance.logprobs.at(1);
  }

  // Greedy tokens straight from the forward pass: the whole prompt, then one token at a time.
  std::vector<int32_t> direct(std::vector<int32_t> tokens, int64_t output_tokens) {
    PagedKvCache cache(model_->kv_layout(kBlock), 16);
    std::vector<int32_t> blocks;
    while (auto b = cache.allocate()) blocks.push_back(*b);
    std::vector<int32_t> out;
    int64_t start = 0;
    while (static_cast<int64_t>(out.size()) < output_tokens) {
      const ForwardSequence seq{.tokens = std::span(tokens).subspan(static_cast<size_t>(start)),
                                .start_position = start,
                                .block_table = blocks};
      out.push_back(Sampler({}).sample(model_->forward({&seq, 1}, cache).value()));
      start = static_cast<int64_t>(tokens.size());
      tokens.push_back(out.back());
    }
    return out;
  }

  test::TempDir dir_{"executor"};
  std::unique_ptr<LlamaForward> model_;
};

// A second prompt sharing 3 blocks with a finished one starts from them (the engine's prefix hit is the
// executor's: 48 tokens not computed), and its tokens are those it gets alone on a fresh instance.
TEST_F(CpuExecutorTest, ASharedPrefixIsReusedAndGivesTheSameTokens) {
  const std::vector<int32_t> prefix = random_tokens(3 * kBlock, 1);
  const auto first = concat(prefix, random_tokens(10, 2));
  const auto second = concat(prefix, random_tokens(13, 3));
  Instance instance(*model_, kColocated);
  instance.submit(1, first, 8);
  instance.run();
  instance.submit(2, second, 12);
  instance.run();
  EXPECT_EQ(instance.reused[1], 0);
  EXPECT_EQ(instance.hits[2], 3 * kBlock);
  EXPECT_EQ(instance.reused[2], 3 * kBlock);
  EXPECT_EQ(instance.outputs[1], direct(first, 8));
  EXPECT_EQ(alone(first, 8), direct(first, 8));
  EXPECT_EQ(instance.outputs[2], alone(second, 12));
  EXPECT_EQ(instance.outputs[2].size(), 12u);
}

// Requests prefilled in chunks while others decode (one forward pass per iteration for all of them) get
// the tokens each gets alone with whole-prompt prefill.
TEST_F(CpuExecutorTest, ChunkedAndBatchedRequestsGetTheirTokensAlone) {
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(70, 4), random_tokens(5, 5),
                                                     random_tokens(33, 6)};
  for (const int64_t chunk : {0, 16, 40}) {
    engine::EngineOptions options = kColocated;
    options.chunk_tokens = chunk;
    Instance instance(*model_, options);
    for (size_t i = 0; i < prompts.size(); ++i) instance.submit(i, prompts[i], 6 + static_cast<int64_t>(i));
    instance.run();
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(instance.outputs[i], alone(prompts[i], 6 + static_cast<int64_t>(i))) << "chunk " << chunk;
    }
  }
}

// KV blocks copied out of one executor (what a prefill instance writes to the pool) and imported into
// another (what reads the pool) are used there as computed: the prompt reuses them and its tokens match.
TEST_F(CpuExecutorTest, ImportedBlocksAreUsedLikeComputedOnes) {
  const auto prompt = random_tokens(2 * kBlock + 7, 7);
  Instance source(*model_, kColocated);
  source.submit(1, prompt, 9);
  source.run();
  Instance target(*model_, kColocated);
  ASSERT_TRUE(target.executor()
                  .add_request(2, {.prompt = prompt, .block_keys = keys_of(prompt), .output_tokens = 9})
                  .ok());
  const std::vector<BlockKey> keys = keys_of(prompt);
  for (size_t b = 0; b < keys.size(); ++b) {
    const auto bytes = source.executor().cached_block(keys[b]);
    ASSERT_TRUE(bytes.has_value());
    ASSERT_TRUE(target.executor().import_block(2, static_cast<int64_t>(b), *bytes).ok());
  }
  // Blocks of another size, outside the prompt's full blocks, or for an unknown request are refused.
  EXPECT_THAT(target.executor().import_block(2, 0, std::vector<std::byte>(10)).message(),
              HasSubstr("10 bytes"));
  EXPECT_THAT(target.executor().import_block(2, 2, *source.executor().cached_block(keys[0])).message(),
              HasSubstr("block 2 is not one of its 2 full blocks"));
  EXPECT_THAT(target.executor().import_block(3, 0, *source.executor().cached_block(keys[0])).message(),
              HasSubstr("request 3: not registered"));
  target.submit_only(2, prompt, 9);
  target.run();
  EXPECT_EQ(target.reused[2], 2 * kBlock);
  EXPECT_EQ(target.outputs[2], source.outputs[1]);
  // Once computed, they are the target's cached blocks like any it computed.
  EXPECT_EQ(target.executor().cached_blocks(), 2);
}

// Prefill on one executor, decode on another (the P/D split: the prompt's KV blocks copied as a prefill
// instance ships them): the tokens are those of one colocated run, greedy and sampled.
TEST_F(CpuExecutorTest, PrefillHereDecodeThereGivesTheColocatedTokens) {
  const auto prompt = random_tokens(3 * kBlock + 5, 12);
  for (const SamplingParams sampling : {SamplingParams{}, SamplingParams{.temperature = 1.2, .seed = 5}}) {
    Instance prefill(*model_, {.kv_capacity_tokens = 64 * kBlock,
                               .prefix_cache = true,
                               .block_size_tokens = kBlock,
                               .prefix_in_dram = true});
    ASSERT_TRUE(prefill.executor()
                    .add_request(1, {.prompt = prompt,
                                     .block_keys = keys_of(prompt),
                                     .output_tokens = 1,
                                     .sampling = sampling,
                                     .keep_after_release = true,
                                     .top_logprobs = 3})
                    .ok());
    prefill.submit_only(1, prompt, 1);
    prefill.run();
    ASSERT_EQ(prefill.outputs[1].size(), 1u);
    std::vector<std::byte> shipped;
    for (int64_t b = 0; b < 4; ++b) {
      const auto block = prefill.executor().kv_block(1, b);
      ASSERT_FALSE(block.empty());
      shipped.insert(shipped.end(), block.begin(), block.end());
    }
    EXPECT_TRUE(prefill.executor().kv_block(1, 9).empty());
    prefill.executor().drop(1);
    EXPECT_TRUE(prefill.executor().kv_block(1, 0).empty());

    Instance decode(*model_, {.kv_capacity_tokens = 64 * kBlock, .report_tokens = true});
    ASSERT_TRUE(decode.executor()
                    .add_decoding(7,
                                  {.prompt_tokens = std::ssize(prompt),
                                   .first_token = prefill.outputs[1][0],
                                   .output_tokens = 10,
                                   .sampling = sampling,
                                   .top_logprobs = 3},
                                  shipped)
                    .ok());
    decode.decode(7, std::ssize(prompt), 10);
    EXPECT_EQ(decode.outputs[7], alone(prompt, 10, sampling));
    // Logprobs: the first token's from the prefill, the other 9 from the decode instance, as colocated.
    const std::vector<TokenLogprobs> colocated = alone_logprobs(prompt, 10, sampling, 3);
    ASSERT_EQ(colocated.size(), 10u);
    ASSERT_EQ(prefill.logprobs[1].size(), 1u);
    ASSERT_EQ(decode.logprobs[7].size(), 9u);
    for (size_t t = 0; t < colocated.size(); ++t) {
      const TokenLogprobs& got = t == 0 ? prefill.logprobs[1][0] : decode.logprobs[7][t - 1];
      EXPECT_NEAR(got.logprob, colocated[t].logprob, 1e-4) << "token " << t;
      ASSERT_EQ(got.top.size(), 3u);
      EXPECT_EQ(got.top[0].first, colocated[t].top[0].first) << "token " << t;
    }
    EXPECT_THAT(
        decode.executor().add_decoding(8, {.prompt_tokens = 10, .output_tokens = 2}, shipped).message(),
        HasSubstr("blocks of"));
  }
}

TEST_F(CpuExecutorTest, SeededSamplingRepeatsAndDiffersFromGreedy) {
  const auto prompt = random_tokens(20, 8);
  const SamplingParams hot{.temperature = 1.5, .top_p = 0.95, .seed = 3};
  const auto a = alone(prompt, 16, hot);
  EXPECT_EQ(alone(prompt, 16, hot), a);
  EXPECT_NE(alone(prompt, 16, {.temperature = 1.5, .top_p = 0.95, .seed = 4}), a);
  EXPECT_NE(alone(prompt, 16), a);
}

// The engine's prefix cache decides what stays: when it is full, a prompt's blocks replace the cached ones
// tail first (kv::BlockCache's rule, so what is kept is what a prefix match can reach), and the executor
// frees exactly the bytes it drops. The old executor-side LRU dropped a's head and kept its tail, which no
// prefix match reaches.
TEST_F(CpuExecutorTest, CachedBlocksGoTailFirstWhenTheEnginesCacheIsFull) {
  engine::EngineOptions options = kColocated;
  options.kv_capacity_tokens = 6 * kBlock;  // the engine's 6 blocks: running prompts and cached ones
  Instance instance(*model_, options, /*capacity_blocks=*/12);
  const auto a = random_tokens(2 * kBlock + 1, 9);  // 2 cached blocks
  instance.submit(1, a, 1);
  instance.run();
  EXPECT_EQ(instance.executor().cached_blocks(), 2);
  const auto b = random_tokens(4 * kBlock + 1, 10);  // 5 blocks: one of a's must go
  instance.submit(2, b, 1);
  instance.run();
  EXPECT_EQ(instance.errors[2], "");
  EXPECT_EQ(instance.outputs[2], alone(b, 1));
  EXPECT_EQ(instance.executor().cached_blocks(), 5);  // b's 4 and a's first
  EXPECT_TRUE(instance.executor().cached_block(keys_of(a)[0]).has_value());
  EXPECT_FALSE(instance.executor().cached_block(keys_of(a)[1]).has_value());
  EXPECT_EQ(instance.executor().free_blocks(), 12 - 5);
  // a again: a hit of its first block, which the executor reuses.
  instance.submit(3, a, 1);
  instance.run();
  EXPECT_EQ(instance.hits[3], kBlock);
  EXPECT_EQ(instance.reused[3], kBlock);
  EXPECT_EQ(instance.outputs[3], alone(a, 1));
}

// An executor with fewer blocks than a prompt needs: a clear error, nothing produced, and what it took is
// returned.
TEST_F(CpuExecutorTest, APromptBeyondTheExecutorsBlocksFailsCleanly) {
  Instance instance(*model_, kColocated, /*capacity_blocks=*/6);
  instance.submit(1, random_tokens(6 * kBlock + 1, 11), 1);
  instance.run();
  EXPECT_THAT(instance.errors[1], HasSubstr("no free KV block"));
  EXPECT_TRUE(instance.outputs[1].empty());
  EXPECT_EQ(instance.executor().free_blocks(), 6);
}

// One block cache (issue 21 §2): a prefill instance's engine reports prefix hits and KV events from its
// kv::BlockCache, and the executor's KV bytes are indexed by that same cache, so a reported hit is always
// bytes present, and a full cache drops a prefix's tail before its head. A workload of prompts from a few
// prefix families through a small cache: every prompt's hit is exactly the KV the executor reused, and its
// tokens are those it gets alone.
TEST_F(CpuExecutorTest, AReportedHitIsAlwaysKvPresent) {
  const engine::EngineOptions prefill_instance{.kv_capacity_tokens = 6 * kBlock,
                                               .prefix_cache = true,
                                               .block_size_tokens = kBlock,
                                               .prefix_in_dram = true};
  // The cache's 6 blocks, and room for one prompt being computed (5 blocks) beside them.
  Instance instance(*model_, prefill_instance, /*capacity_blocks=*/11);
  std::vector<std::vector<int32_t>> families;
  for (uint64_t f = 0; f < 3; ++f) families.push_back(random_tokens(4 * kBlock, 100 + f));
  std::mt19937_64 rng(5);
  std::vector<std::vector<int32_t>> prompts;
  for (engine::RequestId id = 1; id <= 24; ++id) {
    // A family's first 1..4 blocks, then a tail of its own (the last token is always computed).
    const auto& family = families[rng() % families.size()];
    const auto shared = static_cast<int64_t>(1 + rng() % 4) * kBlock;
    prompts.push_back(concat(std::vector<int32_t>(family.begin(), family.begin() + shared),
                             random_tokens(1 + static_cast<int64_t>(rng() % 5), 1000 + id)));
    instance.submit(id, prompts.back(), 1);
    instance.run();
  }
  int64_t hit_tokens = 0;
  for (engine::RequestId id = 1; id <= 24; ++id) {
    EXPECT_EQ(instance.hits[id], instance.reused[id]) << "request " << id;
    EXPECT_EQ(instance.errors[id], "") << "request " << id;
    EXPECT_EQ(instance.outputs[id], alone(prompts[id - 1], 1)) << "request " << id;
    hit_tokens += instance.hits[id];
  }
  EXPECT_GT(hit_tokens, 0) << "the workload reuses prefixes";
}

// Logprobs (issue 22 §5) against an independent model: each generated token's logprob and its top list are
// the log-softmax of tests/model/reference_llama.py's logits (NumPy, float64, dense attention) at the
// position that token was drawn from, for requests batched together, prefilled in chunks of 16, greedy and
// sampled, with 0, 5 and 20 alternatives; a request that did not ask has none. Greedy tokens are the top-1.
TEST_F(CpuExecutorTest, LogprobsAreTheLogSoftmaxOfTheNumpyModelsLogits) {
  struct Asked {
    std::vector<int32_t> prompt;
    SamplingParams sampling;
    int32_t top;
  };
  const std::vector<Asked> asked = {{random_tokens(37, 21), {}, 5},
                                    {random_tokens(9, 22), {.temperature = 1, .seed = 9}, kMaxTopLogprobs},
                                    {random_tokens(20, 23), {}, 0},
                                    {random_tokens(12, 24), {}, kNoLogprobs}};
  constexpr int64_t kOutput = 6;
  engine::EngineOptions options = kColocated;
  options.chunk_tokens = 16;
  Instance instance(*model_, options);
  for (size_t i = 0; i < asked.size(); ++i) {
    ASSERT_TRUE(instance.executor()
                    .add_request(i, {.prompt = asked[i].prompt,
                                     .block_keys = keys_of(asked[i].prompt),
                                     .output_tokens = kOutput,
                                     .sampling = asked[i].sampling,
                                     .top_logprobs = asked[i].top})
                    .ok());
    instance.submit_only(i, asked[i].prompt, kOutput);
  }
  instance.run();
  // The reference reads each prompt and its output but the last token: a row per position whose next token
  // was drawn.
  const std::string prompts = dir_.path() + "/prompts.json", reference = dir_.path() + "/logprobs.bin";
  {
    std::ofstream out(prompts);
    out << "[";
    for (size_t i = 0; i < asked.size(); ++i) {
      std::vector<int32_t> tokens = concat(asked[i].prompt, instance.outputs[i]);
      tokens.pop_back();
      out << (i ? "," : "") << "[";
      for (size_t t = 0; t < tokens.size(); ++t) out << (t ? "," : "") << tokens[t];
      out << "]";
    }
    out << "]";
  }
  const std::string command = CRESCENT_NUMPY_PYTHON " " CRESCENT_SOURCE_DIR
                                                    "/tests/model/reference_llama.py " +
                              dir_.path() + " " + prompts + " " + reference + " --log-softmax";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream in(reference, std::ios::binary);
  constexpr size_t kVocab = 256;
  // float32 against float64 through the whole model: measured under 1e-6 on the tiny model; a BLAS that
  // sums in another order moves it by as much again, not 100 times.
  constexpr double kTolerance = 1e-4;
  double worst = 0;
  for (size_t i = 0; i < asked.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "request " << i << ", top " << asked[i].top);
    const size_t rows = asked[i].prompt.size() + kOutput - 1;
    std::vector<float> ref(rows * kVocab);
    in.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * 4));
    ASSERT_TRUE(in.good());
    const std::vector<int32_t>& output = instance.outputs[i];
    const std::vector<TokenLogprobs>& got = instance.logprobs[i];
    ASSERT_EQ(output.size(), static_cast<size_t>(kOutput));
    if (asked[i].top == kNoLogprobs) {
      EXPECT_TRUE(got.empty());
      continue;
    }
    ASSERT_EQ(got.size(), static_cast<size_t>(kOutput));
    for (size_t t = 0; t < got.size(); ++t) {
      const float* row = ref.data() + (asked[i].prompt.size() - 1 + t) * kVocab;
      std::vector<float> sorted(row, row + kVocab);
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      const auto check = [&](float value, float want) {
        worst = std::max(worst, std::abs(static_cast<double>(value) - want));
        EXPECT_NEAR(value, want, kTolerance) << "token " << t;
      };
      check(got[t].logprob, row[output[t]]);
      EXPECT_LE(got[t].logprob, 0.0f);
      ASSERT_EQ(got[t].top.size(), static_cast<size_t>(asked[i].top));
      for (size_t r = 0; r < got[t].top.size(); ++r) {
        const auto [id, value] = got[t].top[r];
        check(value, row[id]);    // its token's
        check(value, sorted[r]);  // and the r-th largest (near ties may swap ids, not values)
        if (r > 0) {
          EXPECT_GE(got[t].top[r - 1].second, value);
        }
        if (id == output[t]) {
          EXPECT_EQ(value, got[t].logprob);
        }
      }
      if (asked[i].sampling.temperature == 0 && !got[t].top.empty()) {
        EXPECT_EQ(got[t].top[0].first, output[t]) << "the greedy token is the most likely";
      }
    }
  }
  std::printf("worst logprob error against NumPy: %.3g\n", worst);
}

TEST_F(CpuExecutorTest, BadRequestsAreRefused) {
  CpuExecutor executor(*model_, {.block_size_tokens = kBlock, .capacity_blocks = 4});
  const auto error = [&](engine::RequestId id, ExecutorRequest r) {
    return executor.add_request(id, std::move(r)).message();
  };
  EXPECT_THAT(error(1, {.prompt = {}}), HasSubstr("the prompt is empty"));
  EXPECT_THAT(error(1, {.prompt = {3, 300}}),
              HasSubstr("token id 300 is outside the model's vocabulary of 256"));
  EXPECT_THAT(
      error(1, {.prompt = {3}, .output_tokens = 4096}),
      HasSubstr("a prompt of 1 tokens and 4096 output tokens is 4097 tokens, the model's context is 4096"));
  EXPECT_THAT(error(1, {.prompt = random_tokens(17, 1)}), HasSubstr("0 block keys for 1 full blocks"));
  EXPECT_THAT(error(1, {.prompt = {3}, .sampling = {.top_p = 2}}), HasSubstr("'top_p'"));
  EXPECT_THAT(error(1, {.prompt = {3}, .top_logprobs = 21}), HasSubstr("top_logprobs 21 (at most 20)"));
  EXPECT_TRUE(executor.add_request(1, {.prompt = {3}}).ok());
  EXPECT_THAT(error(1, {.prompt = {3}}), HasSubstr("already registered"));
}

}  // namespace
}  // namespace crescent::model
