// A storage node's SSD tier: one file per object under a directory, least recently used files deleted to stay
// within a capacity. The node writes an object here when the master orders its DRAM copy spilled (eviction)
// and reads it back into the segment when the master orders it loaded (a reader wants it); see master.h.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace crescent::store {

/// Not thread-safe: a node's MountedSegment uses it under a lock of its own.
class SsdTier {
 public:
  /// Uses `dir` (created if missing; files of a previous run in it are deleted: their index died with that
  /// run). kInvalidArgument for capacity 0; kIoError naming the directory and the reason when it cannot be
  /// made, cleaned or written in (a file is written and removed to find out).
  static Result<std::unique_ptr<SsdTier>> open(const std::string& dir, uint64_t capacity_bytes);

  /// Writes `size_bytes` from `data` as `key`'s file (replacing an older one), first deleting least recently
  /// used files until it fits. Appends the keys whose files were deleted to `dropped` (also when the write
  /// then fails). kNoSpace when it is larger than the capacity; kIoError when the write fails (no file is
  /// kept for `key` then, an older one included).
  Status write(const std::string& key, const void* data, uint64_t size_bytes,
               std::vector<std::string>& dropped);
  /// Reads `key`'s file (exactly `size_bytes`) into `out` and makes it the most recently used. kNotFound;
  /// kIoError (also for a size that differs).
  Status read(const std::string& key, void* out, uint64_t size_bytes);
  /// Deletes `key`'s file, if any.
  void remove(const std::string& key);

  /// Keys held, with their sizes.
  std::vector<std::pair<std::string, uint64_t>> held() const;
  uint64_t used_bytes() const { return used_bytes_; }
  size_t objects() const { return files_.size(); }
  uint64_t capacity_bytes() const { return capacity_bytes_; }

 private:
  struct File {
    std::string path;
    uint64_t size_bytes = 0;
    std::list<std::string>::iterator lru;  // position in lru_ (front: most recent)
  };

  SsdTier(std::string dir, uint64_t capacity_bytes) : dir_(std::move(dir)), capacity_bytes_(capacity_bytes) {}

  std::string dir_;
  uint64_t capacity_bytes_;
  uint64_t used_bytes_ = 0;
  uint64_t next_file_ = 0;
  std::unordered_map<std::string, File> files_;
  std::list<std::string> lru_;
};

}  // namespace crescent::store
