// Block keys: the one definition every part of crescent uses (paper §3.2.1; docs/architecture.md, "Block
// keys").
//
// The contract:
// - A prompt's token ids are cut into blocks of B tokens (the run's block size). Block i's key is
//       key[i] = xxh3_64(the block's token ids as int64 in host byte order, seed = key[i-1])
//   with key[-1] = the model seed. So a key stands for a block *and everything before it*: equal keys mean
//   equal prefixes, and a prefix hit is the leading run of a request's keys found in a cache.
// - The model seed is the model's identity (model::model_identity: a hash of its config and weights), so KV
//   computed by one model never matches a prompt of another; the mock model's seed is kMockModelSeed.
// - Only full blocks are shared: cached, indexed (kv::BlockIndex), published in KV events and stored in the
//   pool. A prompt's trailing partial block gets a key by the same recurrence (partial_block_key), used only
//   to check that the KV shipped to its decode instance is this prompt's; it is never cached or pooled.
// - A Mooncake trace's `hash_ids` are keys under the same contract, computed by whoever wrote the trace:
//   the simulator and the analyzer use them as they are (the last one stands for the last, possibly partial,
//   block of the trace's tokens).
// - In the KV cache pool a block lives under pool_block_key(prefix, key): the prefix, then the key as 16
//   lower-case hex digits.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace crescent {

/// A block's key (see the contract above).
using BlockKey = std::uint64_t;

namespace kv {

/// The model seed of the mock model, whose KV is a function of the keys alone.
inline constexpr BlockKey kMockModelSeed = 0;

/// One step of the recurrence: the key of a block of `block_token_ids` whose parent's key is `parent` (the
/// model seed for a prompt's first block).
BlockKey chain_block_key(BlockKey parent, std::span<const int64_t> block_token_ids);

/// The keys of the full blocks of `token_ids` (floor(n / block_size_tokens) of them), chained from
/// `model_seed`. REQUIRES: block_size_tokens >= 1.
std::vector<BlockKey> prompt_block_keys(std::span<const int64_t> token_ids, int64_t block_size_tokens,
                                        BlockKey model_seed);

/// The key of a prompt's trailing partial block of `tail_token_ids`, whose parent is the last full block's
/// key (the model seed when there is none): chain_block_key(parent, tail).
BlockKey partial_block_key(std::span<const int64_t> tail_token_ids, BlockKey parent);

/// The keys of every block of a prompt as its KV is shipped to decode: prompt_block_keys(), then the
/// trailing partial block's key when n is not a multiple of the block size (ceil(n / B) keys in all).
std::vector<BlockKey> shipped_block_keys(std::span<const int64_t> token_ids, int64_t block_size_tokens,
                                         BlockKey model_seed);

/// The name block `key` is stored under in the KV cache pool: `prefix` + 16 lower-case hex digits.
std::string pool_block_key(std::string_view prefix, BlockKey key);

}  // namespace kv
}  // namespace crescent
