// A prefill instance's prefix cache kept in a file that outlives the process (issue 25 §4; docs/serving.md,
// "A prefill instance keeps its cache across a restart"): a file in /dev/shm (shared memory, so it costs a
// write to memory, not a disk), mapped, holding one slot per block: the block key, a checksum, when it was
// stored, and the block's KV bytes (none for the mock, whose KV is a function of its key). The instance
// writes a block once its prefill computed it and frees the slot when its cache drops the key; an instance
// started again on the same file adopts every slot that passes its checksum, so its cache holds again what it
// held.
//
// A slot is written in the order: state free, bytes, key and checksum, state valid (a release store), so a
// process killed mid-write leaves a slot that is free or fails its checksum, never a valid-looking wrong one.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "kv/block_key.h"

namespace crescent::kv {

/// Not thread-safe.
class PersistentBlockFile {
 public:
  /// What a file is for: a file made for another model (its block-key seed), block size or block layout
  /// is not adopted, it is started afresh.
  struct Identity {
    uint64_t model_seed = 0;        // the model's block-key seed (block_key.h)
    int64_t block_size_tokens = 0;  // >= 1
    uint64_t block_bytes = 0;       // the KV bytes kept per block; 0: keys only (the mock)
  };
  /// What `open` found.
  struct Adopted {
    std::vector<BlockKey> keys;  // the blocks adopted, most recently stored first
    uint64_t dropped = 0;        // slots that failed their checksum (a write cut short) or repeated a key
    std::string discarded;       // why an existing file was started afresh ("" when it was not)
  };

  /// Maps `path` (created with `capacity_blocks` slots if missing) and adopts its valid slots. A file of
  /// another identity or capacity, or one that does not parse, is started afresh (Adopted::discarded says
  /// why). The file is locked for the object's life. Errors: kInvalidArgument (capacity < 1, block size < 1);
  /// kAlreadyExists when another live process holds it; kIoError naming the path and the reason.
  static Result<std::unique_ptr<PersistentBlockFile>> open(const std::string& path, const Identity& identity,
                                                           int64_t capacity_blocks);
  ~PersistentBlockFile();
  PersistentBlockFile(const PersistentBlockFile&) = delete;
  PersistentBlockFile& operator=(const PersistentBlockFile&) = delete;

  const Adopted& adopted() const { return adopted_; }
  /// Keeps block `key` with `bytes` (Identity::block_bytes of them; ignored when that is 0). A key already
  /// kept is left as it is (equal keys are equal KV, block_key.h). When every slot is taken, the block
  /// stored longest ago gives its slot. REQUIRES: bytes.size() == block_bytes (or block_bytes == 0).
  void put(BlockKey key, std::span<const std::byte> bytes);
  /// Frees `key`'s slot, if any.
  void remove(BlockKey key);
  bool contains(BlockKey key) const { return slot_of_.contains(key); }
  /// `key`'s bytes after checking them against the slot's checksum; nullopt when absent or when they fail
  /// (the slot is freed then).
  std::optional<std::span<const std::byte>> bytes(BlockKey key);
  /// Blocks kept.
  int64_t blocks() const { return static_cast<int64_t>(slot_of_.size()); }
  int64_t capacity_blocks() const { return capacity_blocks_; }
  const std::string& path() const { return path_; }

 private:
  struct Slot;
  PersistentBlockFile(std::string path, const Identity& identity, int64_t capacity_blocks)
      : path_(std::move(path)), identity_(identity), capacity_blocks_(capacity_blocks) {}
  Status map(bool fresh);
  void adopt();
  Slot& slot(uint32_t index) const;
  std::byte* slot_bytes(uint32_t index) const;
  uint64_t checksum(const Slot& s, uint32_t index) const;
  void free_slot(uint32_t index);

  std::string path_;
  Identity identity_;
  int64_t capacity_blocks_;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  uint64_t mapped_bytes_ = 0;
  uint64_t slots_offset_ = 0;
  uint64_t bytes_offset_ = 0;
  uint64_t next_stamp_ = 1;
  std::unordered_map<BlockKey, uint32_t> slot_of_;
  std::map<uint64_t, uint32_t> by_stamp_;  // kept slots, oldest first (for a full file)
  std::vector<uint32_t> free_;
  Adopted adopted_;
};

}  // namespace crescent::kv
