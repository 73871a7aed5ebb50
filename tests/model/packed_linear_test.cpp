#include "model/packed_linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace crescent::model {
namespace {

// Against the product written out, for row counts from one (a decode step) to thousands (a long prompt),
// writing and accumulating (fewer than 4 rows are computed padded to 4: the rows around that edge too).
TEST(PackedLinear, ComputesXTimesWTransposedForAnyRowCount) {
  constexpr int64_t kOut = 48, kIn = 40;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> w(kOut * kIn);
  for (float& v : w) v = u(rng);
  const PackedLinear linear(w, kOut, kIn);
  EXPECT_EQ(linear.out(), kOut);
  EXPECT_EQ(linear.in(), kIn);
  EXPECT_GE(linear.bytes(), kOut * kIn * 4);
  for (const int64_t rows : {1, 2, 3, 4, 5, 70, 3000}) {
    std::vector<float> x(static_cast<size_t>(rows * kIn));
    for (float& v : x) v = u(rng);
    std::vector<float> y(static_cast<size_t>(rows * kOut), 0.5f);
    linear.apply(x.data(), rows, y.data(), /*accumulate=*/false);
    std::vector<float> acc(y.size(), 0.5f);
    linear.apply(x.data(), rows, acc.data(), /*accumulate=*/true);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < kOut; ++o) {
        double expected = 0;
        for (int64_t i = 0; i < kIn; ++i) expected += static_cast<double>(x[r * kIn + i]) * w[o * kIn + i];
        ASSERT_NEAR(y[r * kOut + o], expected, 1e-4) << rows << " rows, row " << r << ", out " << o;
        ASSERT_NEAR(acc[r * kOut + o], expected + 0.5, 1e-4) << rows << " rows, row " << r << ", out " << o;
      }
    }
  }
}

}  // namespace
}  // namespace crescent::model
