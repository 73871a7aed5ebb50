#include "model/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>

namespace crescent::model {
namespace {

using ::testing::HasSubstr;

// log(0.5), log(0.3), log(0.2) plus a constant: probabilities 0.5, 0.3, 0.2 at temperature 1.
const std::vector<float> kLogits = {std::log(0.5f) + 3, std::log(0.3f) + 3, std::log(0.2f) + 3};

std::array<double, 3> frequencies(const SamplingParams& params, int draws) {
  Sampler sampler(params);
  std::array<double, 3> f{};
  for (int i = 0; i < draws; ++i) f[static_cast<size_t>(sampler.sample(kLogits))] += 1.0 / draws;
  return f;
}

TEST(Sampler, GreedyTakesTheFirstLargestLogit) {
  Sampler sampler({});
  EXPECT_EQ(sampler.sample(kLogits), 0);
  const std::vector<float> tie = {1, 4, 2, 4};
  EXPECT_EQ(sampler.sample(tie), 1);
}

TEST(Sampler, DrawsInProportionToTheSoftmaxAtItsTemperature) {
  const auto f = frequencies({.temperature = 1, .seed = 1}, 40000);
  EXPECT_NEAR(f[0], 0.5, 0.015);
  EXPECT_NEAR(f[1], 0.3, 0.015);
  EXPECT_NEAR(f[2], 0.2, 0.015);
  // At temperature 0.5 the probabilities go as p²: 25 : 9 : 4.
  const auto sharp = frequencies({.temperature = 0.5, .seed = 2}, 40000);
  EXPECT_NEAR(sharp[0], 25.0 / 38, 0.015);
  EXPECT_NEAR(sharp[2], 4.0 / 38, 0.015);
}

TEST(Sampler, TopPKeepsTheSmallestNucleusReachingIt) {
  // 0.5 < 0.75, 0.5 + 0.3 >= 0.75: tokens 0 and 1 remain, as 5 : 3.
  const auto f = frequencies({.temperature = 1, .top_p = 0.75, .seed = 3}, 40000);
  EXPECT_EQ(f[2], 0);
  EXPECT_NEAR(f[0], 5.0 / 8, 0.015);
  // A nucleus of one token is greedy.
  EXPECT_NEAR(frequencies({.temperature = 1, .top_p = 0.1, .seed = 4}, 1000)[0], 1.0, 1e-9);
}

TEST(Sampler, TheSameSeedDrawsTheSameTokens) {
  const std::vector<float> flat(64, 0.0f);
  const auto draw = [&](uint64_t seed) {
    Sampler sampler({.temperature = 1, .seed = seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 32; ++i) out.push_back(sampler.sample(flat));
    return out;
  };
  EXPECT_EQ(draw(9), draw(9));
  EXPECT_NE(draw(9), draw(10));
}

// A sampler resuming a request (a stream moved off a decode instance that went down) draws what the first
// sampler would have drawn next.
TEST(Sampler, TokensBeforeSkipsTheirDraws) {
  const std::vector<float> flat(64, 0.0f);
  Sampler whole({.temperature = 1, .seed = 9});
  std::vector<int32_t> all;
  for (int i = 0; i < 20; ++i) all.push_back(whole.sample(flat));
  Sampler resumed({.temperature = 1, .seed = 9, .tokens_before = 12});
  for (int i = 12; i < 20; ++i) EXPECT_EQ(resumed.sample(flat), all[i]) << i;
}

TEST(Sampler, ParamsOutsideTheApisRangesAreRefused) {
  EXPECT_TRUE(validate({.temperature = 2, .top_p = 1}).ok());
  EXPECT_THAT(validate({.temperature = -0.1}).message(), HasSubstr("'temperature'"));
  EXPECT_THAT(validate({.temperature = NAN}).message(), HasSubstr("'temperature'"));
  EXPECT_THAT(validate({.top_p = 0}).message(), HasSubstr("'top_p' must be in (0, 1], got 0"));
  EXPECT_THAT(validate({.top_p = 1.5}).message(), HasSubstr("'top_p'"));
  EXPECT_THAT(validate({.tokens_before = -1}).message(), HasSubstr("'tokens_before' must be >= 0"));
}

}  // namespace
}  // namespace crescent::model
