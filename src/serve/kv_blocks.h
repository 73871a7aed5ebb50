// The KV bytes the mock executor really produces, stores and ships (issue 10: "KV bytes really move"). A
// block of `block_size_tokens` tokens holds tokens × scaled bytes per token: a payload that is a function of
// the block's key, then the xxh3-64 checksum of that payload in its last 8 bytes, so whoever receives a block
// (a decode instance, a prefill instance reading the pool) can verify every byte arrived.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kv/block_key.h"

namespace crescent::serve {

/// Bytes per token really moved: the model's `model_bytes_per_token` divided by `scale` (>= 1), at least 1.
uint64_t scaled_kv_bytes_per_token(double model_bytes_per_token, int64_t scale);

/// Bytes of one block: block_size_tokens × bytes_per_token, rounded up to a multiple of 8, at least 16.
uint64_t kv_block_bytes(int64_t block_size_tokens, uint64_t bytes_per_token);

/// Fills `block` (kv_block_bytes long, a multiple of 8) with the payload of block `key` and its checksum.
void fill_kv_block(BlockKey key, std::span<std::byte> block);

/// Whether `block`'s last 8 bytes are the xxh3-64 checksum of the rest (a multiple of 8 bytes, >= 16).
bool kv_block_intact(std::span<const std::byte> block);

/// Whether `block` is intact (kv_block_intact) and is block `key`'s: its payload starts as fill_kv_block(key)
/// writes it. Catches a block written for another request into reused memory, which its checksum alone
/// would not.
bool kv_block_matches(BlockKey key, std::span<const std::byte> block);

/// Bytes a real KV block (the cpu executor's) carries after its payload in the pool: its block key and the
/// xxh3-64 checksum of payload and key. The payload is the executor's, so its check travels beside it.
inline constexpr uint64_t kKvBlockTrailerBytes = 16;

/// Writes into `trailer` (kKvBlockTrailerBytes) what seals `payload` as block `key`'s.
void seal_kv_block(BlockKey key, std::span<const std::byte> payload, std::span<std::byte> trailer);

/// Whether `trailer` seals `payload` as block `key`'s: false for bytes corrupted in the pool, or a block of
/// another key stored under this one (a substitution), which a checksum of the payload alone would pass.
bool kv_block_sealed(BlockKey key, std::span<const std::byte> payload, std::span<const std::byte> trailer);

}  // namespace crescent::serve
