// A storage node's SSD tier: one file per object under a directory, least recently used files deleted to stay
// within a capacity. The node writes an object here when the master orders its DRAM copy spilled (eviction)
// and reads it back into the segment when the master orders it loaded (a reader wants it); see master.h.
//
// The files outlive the node (docs/store.md, "An SSD tier survives a restart"): each names its key and size
// and carries a checksum of its bytes, so a node restarted on the same directory adopts them, and the master
// learns them again from its first mount.
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
  /// What `open` found in the directory.
  struct Adopted {
    uint64_t objects = 0;  // files adopted: header whole, bytes matching their checksum
    uint64_t bytes = 0;    // their value bytes
    uint64_t dropped = 0;  // files deleted: unreadable header, bad checksum, half written, over capacity
    double seconds = 0;    // time the scan took (it reads every file once)
  };

  /// Uses `dir` (created if missing) and adopts the object files a previous run left there: each file's
  /// header and checksum are verified, and a file that fails (a flipped byte, cut short, half written at a
  /// crash, another format) is deleted; if they hold more than `capacity_bytes`, the least recently used go.
  /// The directory is locked (`dir/.lock`) for the tier's life. kInvalidArgument for capacity 0;
  /// kAlreadyExists when another live process holds the lock; kIoError naming the directory and the reason
  /// when it cannot be made, scanned or written in (a file is written and removed to find out).
  static Result<std::unique_ptr<SsdTier>> open(const std::string& dir, uint64_t capacity_bytes);
  ~SsdTier();
  SsdTier(const SsdTier&) = delete;
  SsdTier& operator=(const SsdTier&) = delete;

  /// Writes `size_bytes` from `data` as `key`'s file (replacing an older one), first deleting least recently
  /// used files until it fits. The file appears whole or not at all (written beside, then renamed; not
  /// fsync'd: a power loss may lose the latest spills, never corrupt an adopted one). Appends the keys whose
  /// files were deleted to `dropped` (also when the write then fails). kNoSpace when it is larger than the
  /// capacity; kIoError when the write fails (no file is kept for `key` then, an older one included).
  Status write(const std::string& key, const void* data, uint64_t size_bytes,
               std::vector<std::string>& dropped);
  /// Reads `key`'s file (exactly `size_bytes`) into `out`, verifies its checksum and makes it the most
  /// recently used (also on disk: the file's mtime, which orders adoption after a restart). kNotFound;
  /// kIoError (a size that differs, a read error, bytes that fail their checksum).
  Status read(const std::string& key, void* out, uint64_t size_bytes);
  /// Deletes `key`'s file, if any.
  void remove(const std::string& key);

  /// Keys held, with their sizes.
  std::vector<std::pair<std::string, uint64_t>> held() const;
  uint64_t used_bytes() const { return used_bytes_; }
  size_t objects() const { return files_.size(); }
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  /// What `open` adopted and dropped.
  const Adopted& adopted() const { return adopted_; }

 private:
  struct File {
    std::string path;
    uint64_t size_bytes = 0;
    uint64_t checksum = 0;                 // xxh3-64 of the value bytes
    std::list<std::string>::iterator lru;  // position in lru_ (front: most recent)
  };

  SsdTier(std::string dir, uint64_t capacity_bytes, int lock_fd)
      : dir_(std::move(dir)), capacity_bytes_(capacity_bytes), lock_fd_(lock_fd) {}
  /// The scan of `open`: adopts the files that pass, deletes the others.
  Status adopt();
  /// Sets the open file's mtime to now, later than any stamp before (file times are coarser than the order
  /// of spills): the least recently used order that the next adoption reads. false with errno set.
  bool stamp(int fd);
  /// Makes `key` (a file of `file`) known, as the least recently used so far (adoption goes newest first).
  void add_oldest(const std::string& key, File file);

  std::string dir_;
  uint64_t capacity_bytes_;
  int lock_fd_;  // holds the directory's lock
  uint64_t used_bytes_ = 0;
  uint64_t next_file_ = 0;
  int64_t last_stamp_ns_ = 0;  // the latest mtime given (stamp), nanoseconds since the epoch
  std::unordered_map<std::string, File> files_;
  std::list<std::string> lru_;
  Adopted adopted_;
};

}  // namespace crescent::store
