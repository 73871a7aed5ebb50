// Block keys (src/kv/block_key.h): the recurrence against an independent Python statement of the contract
// (tests/kv/reference_block_keys.py, python3-xxhash), and the properties the rest of crescent relies on.
#include "kv/block_key.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace crescent::kv {
namespace {

// What the Python reference computes for `tokens`.
nlohmann::json reference(const std::vector<int64_t>& tokens, int64_t block_size, BlockKey seed) {
  const nlohmann::json request = {
      {"tokens", tokens}, {"block_size", block_size}, {"seed", seed}, {"prefix", "kv/"}};
  const std::string command =
      std::string(CRESCENT_DEBIAN_PYTHON " " CRESCENT_SOURCE_DIR
                                         "/tests/kv/reference_block_keys.py <<'EOF'\n") +
      request.dump() + "\nEOF\n";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return nullptr;
  std::string out;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof(buffer), pipe)) out.append(buffer, n);
  if (::pclose(pipe) != 0) return nullptr;
  return nlohmann::json::parse(out, nullptr, false);
}

std::vector<std::string> as_strings(const std::vector<BlockKey>& keys) {
  std::vector<std::string> out;
  for (BlockKey k : keys) out.push_back(std::to_string(k));
  return out;
}

TEST(BlockKey, MatchesAnIndependentStatementOfTheContract) {
  std::mt19937_64 rng(7);
  for (const auto& [n, block, seed] : {std::tuple<int, int64_t, BlockKey>{0, 4, 0},
                                       {3, 4, 0},
                                       {4, 4, 0},
                                       {37, 4, 0x1234},
                                       {1030, 512, 0},
                                       {200, 16, ~0ull},
                                       {17, 1, 99}}) {
    std::vector<int64_t> tokens(static_cast<size_t>(n));
    for (int64_t& t : tokens) t = static_cast<int64_t>(rng() % 200'000) - (rng() % 4 == 0 ? 100'000 : 0);
    const nlohmann::json expected = reference(tokens, block, seed);
    ASSERT_TRUE(expected.is_object()) << "the Python reference did not run (python3-xxhash installed?)";
    EXPECT_EQ(as_strings(prompt_block_keys(tokens, block, seed)),
              expected["full"].get<std::vector<std::string>>())
        << n << " tokens, blocks of " << block;
    EXPECT_EQ(as_strings(shipped_block_keys(tokens, block, seed)),
              expected["shipped"].get<std::vector<std::string>>());
    std::vector<std::string> pool;
    for (BlockKey k : prompt_block_keys(tokens, block, seed)) pool.push_back(pool_block_key("kv/", k));
    EXPECT_EQ(pool, expected["pool"].get<std::vector<std::string>>());
  }
}

TEST(BlockKey, EqualKeysMeanEqualPrefixes) {
  std::vector<int64_t> a(64), b(64);
  for (int i = 0; i < 64; ++i) a[i] = b[i] = i;
  b[40] = -1;  // differs in block 2 of 4 (blocks of 16)
  const auto ka = prompt_block_keys(a, 16, kMockModelSeed), kb = prompt_block_keys(b, 16, kMockModelSeed);
  ASSERT_EQ(ka.size(), 4u);
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_EQ(ka[1], kb[1]);
  EXPECT_NE(ka[2], kb[2]);
  EXPECT_NE(ka[3], kb[3]) << "a block after a different one differs, though its own tokens are equal";
  // The same block at another position (another parent) has another key.
  EXPECT_NE(chain_block_key(kMockModelSeed, std::span(a).subspan(16, 16)), ka[1]);
  EXPECT_EQ(chain_block_key(ka[0], std::span(a).subspan(16, 16)), ka[1]);
}

TEST(BlockKey, TheModelSeedSeparatesModelsAndStartsTheChain) {
  const std::vector<int64_t> tokens(1030, 7);  // two full blocks of 512 and a partial one
  const auto mock = shipped_block_keys(tokens, 512, kMockModelSeed);
  const auto other = shipped_block_keys(tokens, 512, 0x1234);
  ASSERT_EQ(mock.size(), 3u);
  ASSERT_EQ(other.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(other[i], mock[i]);
  EXPECT_EQ(mock[2], partial_block_key(std::span(tokens).subspan(1024), mock[1]));
  EXPECT_EQ(std::vector<BlockKey>(other.begin(), other.begin() + 2), prompt_block_keys(tokens, 512, 0x1234));
  // A prompt shorter than a block: only the partial key, chained from the seed.
  EXPECT_EQ(shipped_block_keys(std::vector<int64_t>{5}, 512, 0x1234),
            std::vector<BlockKey>{partial_block_key(std::vector<int64_t>{5}, 0x1234)});
  EXPECT_TRUE(prompt_block_keys(std::vector<int64_t>{5}, 512, 0x1234).empty());
}

TEST(BlockKey, PoolKeysAreThePrefixAndSixteenHexDigits) {
  EXPECT_EQ(pool_block_key("kv/", 0xab), "kv/00000000000000ab");
  EXPECT_EQ(pool_block_key("", ~0ull), "ffffffffffffffff");
}

}  // namespace
}  // namespace crescent::kv
