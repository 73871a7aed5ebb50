// The prefix cache file of a prefill instance (issue 25 §4): what a second open adopts, and what it refuses.
#include "kv/persistent_block_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <vector>

#include "test_support/temp_dir.h"

namespace crescent::kv {
namespace {

constexpr PersistentBlockFile::Identity kIdentity{
    .model_seed = 42, .block_size_tokens = 16, .block_bytes = 256};

std::vector<std::byte> block(uint8_t seed) {
  std::vector<std::byte> b(kIdentity.block_bytes);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(seed * 31 + i);
  return b;
}

/// Flips one bit of the file at `offset`.
void flip_bit(const std::string& path, off_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, offset), 1);
  c ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &c, 1, offset), 1);
  ::close(fd);
}

TEST(PersistentBlockFile, ASecondOpenAdoptsTheBlocksMostRecentFirstWithTheirBytes) {
  crescent::test::TempDir dir("crescent-pbf");
  const std::string path = dir.file("cache");
  {
    auto file = PersistentBlockFile::open(path, kIdentity, 8);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    EXPECT_TRUE((*file)->adopted().keys.empty());
    EXPECT_EQ((*file)->adopted().discarded, "");
    for (uint8_t k = 1; k <= 4; ++k) (*file)->put(100 + k, block(k));
    (*file)->put(101, block(9));  // kept already: left as it is
    (*file)->remove(103);
    EXPECT_EQ((*file)->blocks(), 3);
  }
  auto file = PersistentBlockFile::open(path, kIdentity, 8);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ((*file)->adopted().keys, (std::vector<BlockKey>{104, 102, 101}));
  EXPECT_EQ((*file)->adopted().dropped, 0u);
  for (uint8_t k : {1, 2, 4}) {
    auto bytes = (*file)->bytes(100 + k);
    ASSERT_TRUE(bytes.has_value()) << int{k};
    const std::vector<std::byte> expected = block(k);
    EXPECT_TRUE(std::equal(bytes->begin(), bytes->end(), expected.begin(), expected.end())) << int{k};
  }
  EXPECT_FALSE((*file)->bytes(103).has_value());
}

TEST(PersistentBlockFile, AFullFileGivesTheOldestSlot) {
  crescent::test::TempDir dir("crescent-pbf");
  auto file = PersistentBlockFile::open(dir.file("cache"), kIdentity, 2);
  ASSERT_TRUE(file.ok());
  (*file)->put(1, block(1));
  (*file)->put(2, block(2));
  (*file)->put(3, block(3));
  EXPECT_FALSE((*file)->contains(1));
  EXPECT_TRUE((*file)->contains(2) && (*file)->contains(3));
}

// A slot whose bytes or fields changed after they were written (a write cut short by a kill, memory
// corrupted) is dropped at adoption; its neighbours are kept.
TEST(PersistentBlockFile, ASlotThatFailsItsChecksumIsDroppedAtAdoption) {
  crescent::test::TempDir dir("crescent-pbf");
  const std::string path = dir.file("cache");
  {
    auto file = PersistentBlockFile::open(path, kIdentity, 4);
    ASSERT_TRUE(file.ok());
    for (uint8_t k = 1; k <= 4; ++k) (*file)->put(k, block(k));  // slots 0..3 in put order
  }
  constexpr off_t kSlots = 4096, kSlotBytes = 32, kBytes = 8192;
  flip_bit(path, kBytes + 1 * 256 + 17);        // slot 1's KV bytes
  flip_bit(path, kSlots + 2 * kSlotBytes + 8);  // slot 2's key
  flip_bit(path, kSlots + 3 * kSlotBytes);      // slot 3's state word: torn
  auto file = PersistentBlockFile::open(path, kIdentity, 4);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->adopted().keys, std::vector<BlockKey>{1});
  EXPECT_EQ((*file)->adopted().dropped, 3u);
  // Their slots are free again.
  for (uint8_t k = 5; k <= 7; ++k) (*file)->put(k, block(k));
  EXPECT_EQ((*file)->blocks(), 4);
}

TEST(PersistentBlockFile, AFileOfAnotherModelBlockSizeOrCapacityIsStartedAfresh) {
  crescent::test::TempDir dir("crescent-pbf");
  const std::string path = dir.file("cache");
  {
    auto file = PersistentBlockFile::open(path, kIdentity, 4);
    ASSERT_TRUE(file.ok());
    (*file)->put(1, block(1));
  }
  PersistentBlockFile::Identity other = kIdentity;
  other.model_seed = 43;
  {
    auto file = PersistentBlockFile::open(path, other, 4);
    ASSERT_TRUE(file.ok());
    EXPECT_TRUE((*file)->adopted().keys.empty());
    EXPECT_NE((*file)->adopted().discarded.find("another model"), std::string::npos);
    (*file)->put(1, block(1));
  }
  {
    auto file = PersistentBlockFile::open(path, other, 6);
    ASSERT_TRUE(file.ok());
    EXPECT_TRUE((*file)->adopted().keys.empty());
    EXPECT_NE((*file)->adopted().discarded.find("made for 4 blocks"), std::string::npos);
  }
  {
    const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC);
    ASSERT_EQ(::write(fd, "junk", 4), 4);
    ::close(fd);
  }
  auto file = PersistentBlockFile::open(path, other, 6);
  ASSERT_TRUE(file.ok());
  EXPECT_NE((*file)->adopted().discarded.find("not a cache file"), std::string::npos);
}

TEST(PersistentBlockFile, KeysOnlyForTheMockAndOneInstancePerFile) {
  crescent::test::TempDir dir("crescent-pbf");
  const std::string path = dir.file("cache");
  PersistentBlockFile::Identity keys_only = kIdentity;
  keys_only.block_bytes = 0;
  {
    auto file = PersistentBlockFile::open(path, keys_only, 3);
    ASSERT_TRUE(file.ok());
    (*file)->put(7, {});
    (*file)->put(8, {});
    auto second = PersistentBlockFile::open(path, keys_only, 3);
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  }
  auto file = PersistentBlockFile::open(path, keys_only, 3);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->adopted().keys, (std::vector<BlockKey>{8, 7}));
  EXPECT_FALSE(PersistentBlockFile::open(path, keys_only, 0).ok());
}

}  // namespace
}  // namespace crescent::kv
