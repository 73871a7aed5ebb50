#include "kv/block_key.h"

#include <fmt/format.h>
#include <xxhash.h>

namespace crescent::kv {

BlockKey chain_block_key(BlockKey parent, std::span<const int64_t> block_token_ids) {
  return XXH3_64bits_withSeed(block_token_ids.data(), block_token_ids.size_bytes(), parent);
}

std::vector<BlockKey> prompt_block_keys(std::span<const int64_t> token_ids, int64_t block_size_tokens,
                                        BlockKey model_seed) {
  std::vector<BlockKey> keys;
  const auto block = static_cast<size_t>(block_size_tokens);
  keys.reserve(token_ids.size() / block);
  BlockKey parent = model_seed;
  for (size_t start = 0; start + block <= token_ids.size(); start += block) {
    parent = chain_block_key(parent, token_ids.subspan(start, block));
    keys.push_back(parent);
  }
  return keys;
}

BlockKey partial_block_key(std::span<const int64_t> tail_token_ids, BlockKey parent) {
  return chain_block_key(parent, tail_token_ids);
}

std::vector<BlockKey> shipped_block_keys(std::span<const int64_t> token_ids, int64_t block_size_tokens,
                                         BlockKey model_seed) {
  std::vector<BlockKey> keys = prompt_block_keys(token_ids, block_size_tokens, model_seed);
  const size_t full_tokens = keys.size() * static_cast<size_t>(block_size_tokens);
  if (full_tokens < token_ids.size()) {
    keys.push_back(
        partial_block_key(token_ids.subspan(full_tokens), keys.empty() ? model_seed : keys.back()));
  }
  return keys;
}

std::string pool_block_key(std::string_view prefix, BlockKey key) {
  return fmt::format("{}{:016x}", prefix, key);
}

}  // namespace crescent::kv
