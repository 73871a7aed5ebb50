// model::token_logprobs against NumPy's log_softmax (tests/model/reference_logprobs.py, float64), and the
// properties the API relies on: a greedy token is the top-1, the sampled token's entry equals its logprob,
// ties go to the lower id.
#include "model/logprobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>

#include "model/sampler.h"
#include "test_support/temp_dir.h"

namespace crescent::model {
namespace {

// Rows of `vocab` logits ~ N(shift, scale).
std::vector<float> random_logits(int64_t rows, int64_t vocab, double shift, double scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(shift, scale);
  std::vector<float> out(static_cast<size_t>(rows * vocab));
  for (float& v : out) v = static_cast<float>(normal(rng));
  return out;
}

// NumPy's log_softmax of each row, in float64.
std::vector<double> numpy_log_softmax(const std::vector<float>& logits, int64_t vocab,
                                      const test::TempDir& dir) {
  const std::string in = dir.file("logits.bin"), out = dir.file("logprobs.bin");
  std::ofstream(in, std::ios::binary)
      .write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
  const std::string command = CRESCENT_NUMPY_PYTHON " " CRESCENT_SOURCE_DIR
                                                    "/tests/model/reference_logprobs.py " +
                              in + " " + std::to_string(vocab) + " " + out;
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::vector<double> expected(logits.size());
  std::ifstream(out, std::ios::binary)
      .read(reinterpret_cast<char*>(expected.data()), static_cast<std::streamsize>(expected.size() * 8));
  return expected;
}

// Every row's sampled token (the greedy one and a random one) and its top 20 against NumPy: values to a few
// float32 ulps (the result is a float), the top ids those of NumPy's descending order, over vocabularies of
// 256 and 32,000 and logits near 0, spread wide (scale 30) and shifted far (5,000: a float's step there is
// 0.0005, the max taken out keeps the precision).
TEST(Logprobs, MatchNumpysLogSoftmax) {
  test::TempDir dir("logprobs");
  struct Case {
    int64_t vocab;
    double shift, scale;
  };
  for (const Case c : {Case{256, 0, 1}, Case{256, 0, 30}, Case{32000, 0, 3}, Case{1000, 5000, 2}}) {
    SCOPED_TRACE(testing::Message() << "vocab " << c.vocab << ", N(" << c.shift << ", " << c.scale << ")");
    constexpr int64_t kRows = 6;
    const std::vector<float> logits = random_logits(kRows, c.vocab, c.shift, c.scale, 17);
    const std::vector<double> expected = numpy_log_softmax(logits, c.vocab, dir);
    std::mt19937_64 rng(3);
    for (int64_t row = 0; row < kRows; ++row) {
      const std::span<const float> l(logits.data() + row * c.vocab, static_cast<size_t>(c.vocab));
      const double* ref = expected.data() + row * c.vocab;
      std::vector<int32_t> order(static_cast<size_t>(c.vocab));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ref[a] > ref[b]; });
      const auto near = [&](float got, double want) {
        return std::abs(static_cast<double>(got) - want) <= 4e-7 * std::max(1.0, std::abs(want));
      };
      const int32_t greedy = Sampler({}).sample(l);
      const auto sampled = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab));
      for (const int32_t token : {greedy, sampled}) {
        const TokenLogprobs got = token_logprobs(l, token, kMaxTopLogprobs);
        EXPECT_TRUE(near(got.logprob, ref[token])) << got.logprob << " vs " << ref[token];
        ASSERT_EQ(got.top.size(), static_cast<size_t>(kMaxTopLogprobs));
        for (size_t r = 0; r < got.top.size(); ++r) {
          EXPECT_EQ(got.top[r].first, order[r]) << "rank " << r;
          EXPECT_TRUE(near(got.top[r].second, ref[order[r]])) << got.top[r].second << " vs " << ref[order[r]];
          if (r > 0) {
            EXPECT_GE(got.top[r - 1].second, got.top[r].second);
          }
        }
        EXPECT_LE(got.top.front().second, 0.0f);
      }
      // The greedy token is the top-1, and its entry is its logprob exactly.
      const TokenLogprobs g = token_logprobs(l, greedy, 3);
      EXPECT_EQ(g.top.front().first, greedy);
      EXPECT_EQ(g.top.front().second, g.logprob);
    }
  }
}

TEST(Logprobs, EdgesOfTheTopList) {
  // Equal logits: the lower id first (the greedy sampler's choice is the first index of the max).
  const std::vector<float> ties = {1, 3, 3, 0, 3};
  const TokenLogprobs t = token_logprobs(ties, 2, 4);
  ASSERT_EQ(t.top.size(), 4u);
  EXPECT_EQ(t.top[0].first, 1);
  EXPECT_EQ(t.top[1].first, 2);
  EXPECT_EQ(t.top[2].first, 4);
  EXPECT_EQ(t.top[3].first, 0);
  EXPECT_EQ(Sampler({}).sample(ties), t.top[0].first);
  EXPECT_EQ(t.top[1].second, t.logprob);
  // The whole vocabulary sums to 1.
  double sum = 0;
  for (const auto& [id, lp] : t.top) sum += std::exp(static_cast<double>(lp));
  sum += std::exp(static_cast<double>(token_logprobs(ties, 3, 0).logprob));
  EXPECT_NEAR(sum, 1.0, 1e-6);
  // No alternatives asked: the sampled token's only. More than the vocabulary: all of it.
  EXPECT_TRUE(token_logprobs(ties, 0, 0).top.empty());
  EXPECT_EQ(token_logprobs(ties, 0, kMaxTopLogprobs).top.size(), ties.size());
  // A one-token vocabulary is certain.
  EXPECT_EQ(token_logprobs(std::vector<float>{4}, 0, 1).logprob, 0.0f);
}

}  // namespace
}  // namespace crescent::model
