#include "store/ssd_tier.h"

#include <gtest/gtest.h>

#include <algorithm>
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

/// The tier's object files in `dir` (its lock file and others' files not counted).
std::vector<std::string> object_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename().string().starts_with("crescent-ssd-")) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

size_t files_in(const std::string& dir) {
  return object_files(dir).size();
}

/// Flips one byte of `path` at `offset` (from the end when negative).
void flip_byte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const int64_t size = f.tellg();
  const int64_t at = offset < 0 ? size + offset : offset;
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(at);
  f.write(&c, 1);
}

/// The file `tier` keeps `key` in: the only object file holding the key's bytes.
std::string file_of(const std::string& dir, const std::string& key) {
  for (const std::string& path : object_files(dir)) {
    std::ifstream in(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find(key) != std::string::npos) return path;
  }
  return "";
}

TEST(SsdTier, KeepsBytesAndDropsTheLeastRecentlyUsedFilesBeyondItsCapacity) {
  crescent::test::TempDir dir("crescent-ssd");
  { std::ofstream(dir.file("crescent-ssd-99")) << "not an object file"; }
  auto tier = SsdTier::open(dir.path(), 3000);
  ASSERT_TRUE(tier.ok()) << tier.status().to_string();
  EXPECT_EQ(files_in(dir.path()), 0u);  // a file that is not an object file: gone
  EXPECT_EQ((*tier)->adopted().dropped, 1u);
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

// Issue 25 §4: a node restarted on the same directory adopts what the previous run spilled, in its least
// recently used order, and nothing that fails a check.
TEST(SsdTier, AReopenedTierAdoptsItsFilesInTheirLeastRecentlyUsedOrder) {
  crescent::test::TempDir dir("crescent-ssd");
  std::vector<char> a = bytes(1000, 1), b = bytes(1000, 2), c = bytes(1000, 3);
  {
    auto tier = SsdTier::open(dir.path(), 3000);
    ASSERT_TRUE(tier.ok()) << tier.status().to_string();
    std::vector<std::string> dropped;
    for (auto [key, value] : {std::pair{"a", &a}, {"b", &b}, {"c", &c}}) {
      ASSERT_TRUE((*tier)->write(key, value->data(), value->size(), dropped).ok());
    }
    std::vector<char> out(1000);
    ASSERT_TRUE((*tier)->read("a", out.data(), out.size()).ok());  // order now, oldest first: b, c, a
  }
  auto tier = SsdTier::open(dir.path(), 3000);
  ASSERT_TRUE(tier.ok()) << tier.status().to_string();
  SsdTier& t = **tier;
  EXPECT_EQ(t.adopted().objects, 3u);
  EXPECT_EQ(t.adopted().bytes, 3000u);
  EXPECT_EQ(t.adopted().dropped, 0u);
  EXPECT_EQ(t.used_bytes(), 3000u);
  for (auto [key, value] : {std::pair{"a", &a}, {"b", &b}, {"c", &c}}) {
    std::vector<char> out(1000);
    ASSERT_TRUE(t.read(key, out.data(), out.size()).ok()) << key;
    EXPECT_EQ(out, *value) << key;
  }
  // Reads in the order a, b, c: c is now the newest and a the oldest, and a new file evicts a first.
  std::vector<std::string> dropped;
  std::vector<char> d = bytes(1000, 4);
  ASSERT_TRUE(t.write("d", d.data(), d.size(), dropped).ok());
  EXPECT_EQ(dropped, std::vector<std::string>{"a"});
  // New files do not take an adopted file's name.
  EXPECT_EQ(files_in(dir.path()), 3u);
}

TEST(SsdTier, TheOrderBeforeARestartDecidesWhatAReopenWithLessCapacityKeeps) {
  crescent::test::TempDir dir("crescent-ssd");
  std::vector<char> value = bytes(1000, 5);
  {
    auto tier = SsdTier::open(dir.path(), 4000);
    ASSERT_TRUE(tier.ok());
    std::vector<std::string> dropped;
    for (const char* key : {"w", "x", "y", "z"})
      ASSERT_TRUE((*tier)->write(key, value.data(), 1000, dropped).ok());
    std::vector<char> out(1000);
    ASSERT_TRUE((*tier)->read("w", out.data(), 1000).ok());  // oldest first: x, y, z, w
  }
  auto tier = SsdTier::open(dir.path(), 2000);
  ASSERT_TRUE(tier.ok());
  EXPECT_EQ((*tier)->adopted().objects, 2u);
  EXPECT_EQ((*tier)->adopted().dropped, 2u);
  std::vector<std::string> keys;
  for (const auto& [key, size] : (*tier)->held()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"w", "z"}));
  EXPECT_EQ(files_in(dir.path()), 2u);
}

TEST(SsdTier, AFileThatFailsItsCheckIsDeletedAtAdoptionAndTheOthersKept) {
  crescent::test::TempDir dir("crescent-ssd");
  std::vector<char> value = bytes(5000, 6);
  {
    auto tier = SsdTier::open(dir.path(), 1 << 20);
    ASSERT_TRUE(tier.ok());
    std::vector<std::string> dropped;
    for (const char* key : {"kept", "value-flipped", "key-flipped", "cut-short", "grown"}) {
      ASSERT_TRUE((*tier)->write(key, value.data(), value.size(), dropped).ok());
    }
  }
  flip_byte(file_of(dir.path(), "value-flipped"), -100);
  flip_byte(file_of(dir.path(), "key-flipped"), 41);  // the header is 40 bytes; then the key
  std::filesystem::resize_file(file_of(dir.path(), "cut-short"), 3000);
  { std::ofstream(file_of(dir.path(), "grown"), std::ios::app | std::ios::binary) << "x"; }
  { std::ofstream(dir.file("crescent-ssd-77.tmp")) << "half written when the node died"; }
  { std::ofstream(dir.file("notes.txt")) << "someone else's file"; }
  auto tier = SsdTier::open(dir.path(), 1 << 20);
  ASSERT_TRUE(tier.ok()) << tier.status().to_string();
  EXPECT_EQ((*tier)->adopted().objects, 1u);
  EXPECT_EQ((*tier)->adopted().dropped, 5u);
  ASSERT_EQ((*tier)->held().size(), 1u);
  EXPECT_EQ((*tier)->held()[0].first, "kept");
  EXPECT_EQ(files_in(dir.path()), 1u);
  EXPECT_TRUE(std::filesystem::exists(dir.file("notes.txt")));  // not the tier's: left alone
  std::vector<char> out(value.size());
  ASSERT_TRUE((*tier)->read("kept", out.data(), out.size()).ok());
  EXPECT_EQ(out, value);
}

TEST(SsdTier, AReadOfBytesThatChangedOnDiskFailsItsCheck) {
  crescent::test::TempDir dir("crescent-ssd");
  auto tier = SsdTier::open(dir.path(), 1 << 20);
  ASSERT_TRUE(tier.ok());
  std::vector<char> value = bytes(4096, 7);
  std::vector<std::string> dropped;
  ASSERT_TRUE((*tier)->write("k", value.data(), value.size(), dropped).ok());
  flip_byte(file_of(dir.path(), "k"), -1);
  std::vector<char> out(value.size());
  const Status read = (*tier)->read("k", out.data(), out.size());
  EXPECT_EQ(read.code(), StatusCode::kIoError);
  EXPECT_NE(read.message().find("failed its check"), std::string::npos) << read.message();
}

TEST(SsdTier, ASecondTierOnTheSameDirectoryIsRefusedWhileTheFirstLives) {
  crescent::test::TempDir dir("crescent-ssd");
  auto first = SsdTier::open(dir.path(), 1 << 20);
  ASSERT_TRUE(first.ok());
  auto second = SsdTier::open(dir.path(), 1 << 20);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(second.status().message().find("in use by another store node"), std::string::npos)
      << second.status().message();
  first->reset();
  EXPECT_TRUE(SsdTier::open(dir.path(), 1 << 20).ok());
}

}  // namespace
}  // namespace crescent::store
