#include "common/clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <limits>

namespace crescent {
namespace {

// A wait until a time the cost model predicts never comes (infinity, NaN, astronomically far) is a wait as
// long as 1e9 s, not a double converted past int64 nanoseconds (undefined).
TEST(SteadyClock, TimesPastThirtyYearsAreThatFarAndNearOnesExact) {
  const SteadyClock clock;
  const auto farthest = clock.at(1e9);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(clock.at(kInf), farthest);
  EXPECT_EQ(clock.at(std::numeric_limits<double>::quiet_NaN()), farthest);
  EXPECT_EQ(clock.at(1e300), farthest);
  EXPECT_EQ(clock.at(-kInf), clock.at(-1e9));
  EXPECT_EQ(clock.at(1.5) - clock.at(0), std::chrono::milliseconds(1500));
  EXPECT_LT(clock.at(1e8), farthest);
}

}  // namespace
}  // namespace crescent
