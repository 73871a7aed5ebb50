#include "conductor/placement_history.h"

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>
#include <vector>

namespace crescent::conductor {
namespace {

TEST(PlacementHistory, NeverPlacedInstancesGoRoundRobin) {
  PlacementHistory history;
  const std::vector<InstanceId> all{0, 1, 2};
  std::vector<InstanceId> order;
  for (int i = 0; i < 6; ++i) {
    const InstanceId pick = history.pick(all);
    order.push_back(pick);
    history.record(pick, 0.0);
  }
  EXPECT_EQ(order, (std::vector<InstanceId>{0, 1, 2, 0, 1, 2}));
}

TEST(PlacementHistory, FewestRecentPlacementsBeatsRoundRobin) {
  PlacementHistory history;
  history.record(1, 0.0);
  history.record(0, 0.0);
  history.record(0, 0.0);  // round robin would now start at 1; 2 has the fewest placements
  EXPECT_EQ(history.pick(std::vector<InstanceId>{0, 1, 2}), 2u);
  EXPECT_EQ(history.pick(std::vector<InstanceId>{0, 1}), 1u);
  // Ids the history has never seen count as never placed on.
  EXPECT_EQ(history.pick(std::vector<InstanceId>{0, 40}), 40u);
}

TEST(PlacementHistory, OldPlacementsCountLess) {
  PlacementHistory history(/*half_life_s=*/60);
  history.record(0, 0.0);
  history.record(0, 0.0);
  history.record(1, 120.0);  // two placements two half-lives ago weigh 0.5 against one just now
  EXPECT_NEAR(history.recent_placements(0, 120.0), 0.5, 1e-12);
  EXPECT_NEAR(history.recent_placements(1, 120.0), 1.0, 1e-12);
  EXPECT_NEAR(history.recent_placements(1, 180.0), 0.5, 1e-12);
  EXPECT_EQ(history.recent_placements(7, 180.0), 0.0);
  EXPECT_EQ(history.pick(std::vector<InstanceId>{1, 0}), 0u);
}

TEST(PlacementHistory, StaysFiniteOverLongRuns) {
  PlacementHistory history(/*half_life_s=*/1);
  history.record(0, 0.0);
  for (int i = 1; i <= 5000; ++i) history.record(i % 2 == 0 ? 0 : 1, i * 1.0);  // 5000 half-lives
  const double w0 = history.recent_placements(0, 5000.0), w1 = history.recent_placements(1, 5000.0);
  EXPECT_TRUE(std::isfinite(w0) && std::isfinite(w1));
  // Each sums 1 + 1/4 + 1/16 + ... (placed every other second) = 4/3, instance 1 starting a second earlier.
  EXPECT_NEAR(w0, 4.0 / 3, 1e-9);
  EXPECT_NEAR(w1, 2.0 / 3, 1e-9);
  EXPECT_EQ(history.pick(std::vector<InstanceId>{0, 1}), 1u);
}

}  // namespace
}  // namespace crescent::conductor

namespace crescent::conductor {
namespace {

// pick is prefer() over the candidates, whatever the weights (ties included), the round-robin position and
// which instances are candidates: checked against a fold keeping the preferred so far.
TEST(PlacementHistory, PickIsPreferOverTheCandidates) {
  std::mt19937 rng(3);
  for (int round = 0; round < 300; ++round) {
    PlacementHistory history(10.0);
    const uint32_t count = 1 + rng() % 70;
    double now_s = 0;
    for (int p = 0, placements = static_cast<int>(rng() % 100); p < placements; ++p) {
      if (rng() % 3 == 0) now_s += 1;  // several placements at one time: equal weights
      history.record(static_cast<InstanceId>(rng() % (count + 5)), now_s);  // ids past count too
    }
    std::vector<char> candidate(count);
    for (auto& c : candidate) c = rng() % 4 != 0;
    std::optional<InstanceId> expected;
    for (InstanceId i = 0; i < count; ++i) {
      if (candidate[i] && (!expected || history.prefer(i, *expected))) expected = i;
    }
    std::vector<InstanceId> tied;
    for (InstanceId i = 0; i < count; ++i) {
      if (candidate[i]) tied.push_back(i);
    }
    if (tied.empty()) continue;
    EXPECT_EQ(history.pick(tied), expected) << "round " << round;
  }
}

}  // namespace
}  // namespace crescent::conductor
