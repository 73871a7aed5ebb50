#include "serve/kv_blocks.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace crescent::serve {

uint64_t scaled_kv_bytes_per_token(double model_bytes_per_token, int64_t scale) {
  return std::max<uint64_t>(
      1, static_cast<uint64_t>(std::ceil(model_bytes_per_token / static_cast<double>(scale))));
}

uint64_t kv_block_bytes(int64_t block_size_tokens, uint64_t bytes_per_token) {
  const uint64_t bytes = static_cast<uint64_t>(block_size_tokens) * bytes_per_token;
  return std::max<uint64_t>(16, (bytes + 7) / 8 * 8);
}

namespace {

// splitmix64: word i of block `key`'s payload is the i+1-th output from state `key`.
uint64_t next_word(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

void fill_kv_block(BlockKey key, std::span<std::byte> block) {
  const size_t words = block.size() / 8 - 1;
  uint64_t state = key;
  for (size_t i = 0; i < words; ++i) {
    const uint64_t z = next_word(state);
    std::memcpy(block.data() + i * 8, &z, 8);
  }
  const uint64_t checksum = XXH3_64bits(block.data(), words * 8);
  std::memcpy(block.data() + words * 8, &checksum, 8);
}

bool kv_block_intact(std::span<const std::byte> block) {
  if (block.size() < 16 || block.size() % 8 != 0) return false;
  const size_t payload = block.size() - 8;
  uint64_t stored = 0;
  std::memcpy(&stored, block.data() + payload, 8);
  return XXH3_64bits(block.data(), payload) == stored;
}

bool kv_block_matches(BlockKey key, std::span<const std::byte> block) {
  if (!kv_block_intact(block)) return false;
  uint64_t state = key;
  const uint64_t expected = next_word(state);
  uint64_t first = 0;
  std::memcpy(&first, block.data(), 8);
  return first == expected;
}

namespace {

uint64_t seal_of(BlockKey key, std::span<const std::byte> payload) {
  return XXH3_64bits_withSeed(payload.data(), payload.size(), key);
}

}  // namespace

void seal_kv_block(BlockKey key, std::span<const std::byte> payload, std::span<std::byte> trailer) {
  const uint64_t checksum = seal_of(key, payload);
  std::memcpy(trailer.data(), &key, 8);
  std::memcpy(trailer.data() + 8, &checksum, 8);
}

bool kv_block_sealed(BlockKey key, std::span<const std::byte> payload, std::span<const std::byte> trailer) {
  if (trailer.size() != kKvBlockTrailerBytes) return false;
  uint64_t stored_key = 0, stored = 0;
  std::memcpy(&stored_key, trailer.data(), 8);
  std::memcpy(&stored, trailer.data() + 8, 8);
  return stored_key == key && stored == seal_of(key, payload);
}

}  // namespace crescent::serve
