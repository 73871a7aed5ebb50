// The decision to start a simulating command again with a heap of huge pages (common/huge_pages.h). The
// re-execution itself is tested end to end (tests/cli/simulate_cli_test.cpp).
#include "common/huge_pages.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>

namespace crescent {
namespace {

TEST(HugePageTunables, AreAddedWhereTransparentHugePagesMustBeAskedFor) {
  EXPECT_EQ(huge_page_tunables(nullptr, "madvise", nullptr), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(huge_page_tunables("", "madvise", nullptr), "glibc.malloc.hugetlb=1");  // no leading ':'
  EXPECT_EQ(huge_page_tunables(nullptr, "madvise", "1"), "glibc.malloc.hugetlb=1");
}

TEST(HugePageTunables, KeepTheTunablesGiven) {
  EXPECT_EQ(huge_page_tunables("glibc.malloc.arena_max=2", "madvise", nullptr),
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
  EXPECT_EQ(huge_page_tunables("glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0", "madvise", nullptr),
            "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=1");
  // Only the whole name counts.
  EXPECT_EQ(huge_page_tunables("glibc.malloc.hugetlbx=0", "madvise", nullptr),
            "glibc.malloc.hugetlbx=0:glibc.malloc.hugetlb=1");
}

TEST(HugePageTunables, ChangeNothingWhenSetAlreadyOptedOutOrOff) {
  // Set already: by the user (any value), or by this program before its second start (no third).
  EXPECT_EQ(huge_page_tunables("glibc.malloc.hugetlb=0", "madvise", nullptr), std::nullopt);
  EXPECT_EQ(huge_page_tunables("glibc.malloc.hugetlb=1", "madvise", nullptr), std::nullopt);
  EXPECT_EQ(huge_page_tunables("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2", "madvise", nullptr),
            std::nullopt);
  EXPECT_EQ(huge_page_tunables("glibc.malloc.hugetlb=1:glibc.malloc.arena_max=2", "madvise", nullptr),
            std::nullopt);
  const std::string ours = *huge_page_tunables("glibc.malloc.arena_max=2", "madvise", nullptr);
  EXPECT_EQ(huge_page_tunables(ours.c_str(), "madvise", nullptr), std::nullopt);
  EXPECT_EQ(huge_page_tunables(nullptr, "madvise", "0"), std::nullopt);
  // Under "always" the kernel gives huge pages unasked; under "never" not at all.
  EXPECT_EQ(huge_page_tunables(nullptr, "always", nullptr), std::nullopt);
  EXPECT_EQ(huge_page_tunables(nullptr, "never", nullptr), std::nullopt);
  EXPECT_EQ(huge_page_tunables(nullptr, "", nullptr), std::nullopt);
}

TEST(HugePageTunables, TheKernelsModeIsOneOfItsThree) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled"))
    GTEST_SKIP() << "this kernel does not say its THP mode";
  const std::string mode = transparent_huge_page_mode();
  EXPECT_TRUE(mode == "always" || mode == "madvise" || mode == "never") << mode;
}

}  // namespace
}  // namespace crescent
