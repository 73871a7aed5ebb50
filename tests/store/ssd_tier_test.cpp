#include "store/ssd_tier.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "test_support/temp_dir.h"

namespace crescent::store {
namespace {

std::vector<char> bytes(size_t n, char seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(seed + i * 7);
  return v;
}

size_t files_in(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.is_regular_file();
  return n;
}

TEST(SsdTier, KeepsBytesAndDropsTheLeastRecentlyUsedFilesBeyondItsCapacity) {
  crescent::test::TempDir dir("crescent-ssd");
  { std::ofstream(dir.file("crescent-ssd-99")) << "left by an earlier run"; }
  auto tier = SsdTier::open(dir.path(), 3000);
  ASSERT_TRUE(tier.ok()) << tier.status().to_string();
  EXPECT_EQ(files_in(dir.path()), 0u);  // an earlier run's files have no index: gone
  SsdTier& t = **tier;
  std::vector<char> a = bytes(1000, 1), b = bytes(1000, 2), c = bytes(1000, 3), d = bytes(1500, 4);
  for (auto [key, value] : {std::pair{"a", &a}, {"b", &b}, {"c", &c}}) {
    std::vector<std::string> dropped;
    ASSERT_TRUE(t.write(key, value->data(), value->size(), dropped).ok());
    EXPECT_TRUE(dropped.empty());
  }
  std::vector<char> out(1000);
  ASSERT_TRUE(t.read("a", out.data(), out.size()).ok());  // a becomes the most recent; b is the oldest
  EXPECT_EQ(out, a);
  std::vector<std::string> dropped;
  ASSERT_TRUE(t.write("d", d.data(), d.size(), dropped).ok());  // needs 1500 of 3000: b and c go
  EXPECT_EQ(dropped, (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(t.used_bytes(), 2500u);
  EXPECT_EQ(files_in(dir.path()), 2u);
  EXPECT_EQ(t.read("b", out.data(), out.size()).code(), StatusCode::kNotFound);
  EXPECT_EQ(t.read("a", out.data(), 999).code(), StatusCode::kIoError);  // wrong size
  std::vector<char> big(3001);
  EXPECT_EQ(t.write("big", big.data(), big.size(), dropped).code(), StatusCode::kNoSpace);
  t.remove("a");
  t.remove("d");
  EXPECT_EQ(t.used_bytes(), 0u);
  EXPECT_EQ(files_in(dir.path()), 0u);
  EXPECT_FALSE(SsdTier::open(dir.path(), 0).ok());
}

// A directory no file can be written in is refused when the tier opens, not found out spill by spill
// (issue 22 §4: `--ssd` on such a directory lost every spill silently).
TEST(SsdTier, ADirectoryThatCannotBeWrittenIsRefusedAtOnce) {
  auto tier = SsdTier::open("/proc/self", 1 << 20);  // exists, and takes no files, even from root
  ASSERT_FALSE(tier.ok());
  EXPECT_EQ(tier.status().code(), StatusCode::kIoError);
  EXPECT_NE(tier.status().message().find("cannot write files in /proc/self"), std::string::npos)
      << tier.status().message();
}

}  // namespace
}  // namespace crescent::store
