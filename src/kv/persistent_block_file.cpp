#include "kv/persistent_block_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

namespace crescent::kv {
namespace {

constexpr std::array<char, 8> kMagic = {'C', 'R', 'P', 'B', 'F', '0', '1', '\n'};
constexpr uint64_t kPage = 4096;

// The file's first page. Integers little-endian (every machine crescent builds for).
struct Header {
  std::array<char, 8> magic = kMagic;
  uint64_t model_seed = 0;
  int64_t block_size_tokens = 0;
  uint64_t block_bytes = 0;
  int64_t capacity_blocks = 0;
  uint64_t checksum = 0;  // xxh3-64 of the fields above
};
constexpr uint64_t kHeaderChecksumBytes = offsetof(Header, checksum);

uint64_t round_up(uint64_t n, uint64_t to) {
  return (n + to - 1) / to * to;
}

}  // namespace

// One slot of the table that follows the header.
struct PersistentBlockFile::Slot {
  std::atomic<uint32_t> state;  // kFree or kValid; the last field written
  uint32_t reserved;
  uint64_t key;
  uint64_t stamp;     // when it was stored (a counter: larger is later)
  uint64_t checksum;  // xxh3-64 of key, stamp, the slot's index and its bytes
};
static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free);
namespace {
constexpr uint32_t kFree = 0;
constexpr uint32_t kValid = 0x56414c44;  // "VALD": a zeroed or torn word is not valid
}  // namespace

Result<std::unique_ptr<PersistentBlockFile>> PersistentBlockFile::open(const std::string& path,
                                                                       const Identity& identity,
                                                                       int64_t capacity_blocks) {
  if (capacity_blocks < 1 || capacity_blocks > (int64_t{1} << 31)) {
    return Status::invalid_argument(
        fmt::format("cache file {}: capacity of {} blocks (1 to 2^31)", path, capacity_blocks));
  }
  if (identity.block_size_tokens < 1) {
    return Status::invalid_argument(
        fmt::format("cache file {}: block size of {} tokens", path, identity.block_size_tokens));
  }
  std::unique_ptr<PersistentBlockFile> file(new PersistentBlockFile(path, identity, capacity_blocks));
  file->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (file->fd_ < 0) {
    return Status::io_error(fmt::format("cache file {}: cannot open: {}", path, std::strerror(errno)));
  }
  if (::flock(file->fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return Status::already_exists(fmt::format("cache file {} is in use by another instance", path));
    }
    return Status::io_error(fmt::format("cache file {}: cannot lock: {}", path, std::strerror(errno)));
  }
  file->slots_offset_ = kPage;
  file->bytes_offset_ = round_up(kPage + static_cast<uint64_t>(capacity_blocks) * sizeof(Slot), kPage);
  file->mapped_bytes_ = file->bytes_offset_ + static_cast<uint64_t>(capacity_blocks) * identity.block_bytes;
  // Adopted only when the header says the same identity and capacity and the file has the size they give.
  struct stat st {};
  if (::fstat(file->fd_, &st) != 0) {
    return Status::io_error(fmt::format("cache file {}: cannot stat: {}", path, std::strerror(errno)));
  }
  Header header;
  bool fresh = true;
  if (st.st_size == 0) {
    // a new file
  } else if (static_cast<uint64_t>(st.st_size) < sizeof header ||
             ::pread(file->fd_, &header, sizeof header, 0) != static_cast<ssize_t>(sizeof header) ||
             header.magic != kMagic || XXH3_64bits(&header, kHeaderChecksumBytes) != header.checksum) {
    file->adopted_.discarded = "not a cache file, or its header failed its check";
  } else if (header.model_seed != identity.model_seed ||
             header.block_size_tokens != identity.block_size_tokens ||
             header.block_bytes != identity.block_bytes) {
    file->adopted_.discarded = "made for another model, block size or KV layout";
  } else if (header.capacity_blocks != capacity_blocks ||
             static_cast<uint64_t>(st.st_size) != file->mapped_bytes_) {
    file->adopted_.discarded =
        fmt::format("made for {} blocks, not {}", header.capacity_blocks, capacity_blocks);
  } else {
    fresh = false;
  }
  CRESCENT_RETURN_IF_ERROR(file->map(fresh));
  if (!fresh) file->adopt();
  for (uint32_t i = static_cast<uint32_t>(capacity_blocks); i-- > 0;) {
    if (file->slot(i).state.load(std::memory_order_relaxed) != kValid) file->free_.push_back(i);
  }
  return file;
}

Status PersistentBlockFile::map(bool fresh) {
  if (fresh && ::ftruncate(fd_, 0) != 0) {
    return Status::io_error(fmt::format("cache file {}: cannot truncate: {}", path_, std::strerror(errno)));
  }
  // posix_fallocate, not ftruncate alone: on /dev/shm a file larger than the memory left fails here, not with
  // a SIGBUS at the first write.
  if (const int err = ::posix_fallocate(fd_, 0, static_cast<off_t>(mapped_bytes_)); err != 0) {
    return Status::io_error(
        fmt::format("cache file {}: cannot make it {} bytes: {}", path_, mapped_bytes_, std::strerror(err)));
  }
  void* base = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (base == MAP_FAILED) {
    return Status::io_error(fmt::format("cache file {}: cannot map: {}", path_, std::strerror(errno)));
  }
  base_ = static_cast<std::byte*>(base);
  if (fresh) {
    Header header;
    header.model_seed = identity_.model_seed;
    header.block_size_tokens = identity_.block_size_tokens;
    header.block_bytes = identity_.block_bytes;
    header.capacity_blocks = capacity_blocks_;
    header.checksum = XXH3_64bits(&header, kHeaderChecksumBytes);
    std::memcpy(base_, &header, sizeof header);  // the slots are zero: free
  }
  return Status();
}

PersistentBlockFile::~PersistentBlockFile() {
  if (base_ != nullptr) ::munmap(base_, mapped_bytes_);
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

PersistentBlockFile::Slot& PersistentBlockFile::slot(uint32_t index) const {
  return *reinterpret_cast<Slot*>(base_ + slots_offset_ + index * sizeof(Slot));
}

std::byte* PersistentBlockFile::slot_bytes(uint32_t index) const {
  return base_ + bytes_offset_ + static_cast<uint64_t>(index) * identity_.block_bytes;
}

uint64_t PersistentBlockFile::checksum(const Slot& s, uint32_t index) const {
  const uint64_t fields[3] = {s.key, s.stamp, index};
  const uint64_t seed = XXH3_64bits(fields, sizeof fields);
  return XXH3_64bits_withSeed(slot_bytes(index), identity_.block_bytes, seed);
}

void PersistentBlockFile::adopt() {
  struct Kept {
    uint64_t stamp;
    uint32_t index;
  };
  std::vector<Kept> kept;
  for (uint32_t i = 0; i < static_cast<uint32_t>(capacity_blocks_); ++i) {
    Slot& s = slot(i);
    if (s.state.load(std::memory_order_acquire) == kFree) continue;
    if (s.state.load(std::memory_order_relaxed) != kValid || checksum(s, i) != s.checksum) {
      s.state.store(kFree, std::memory_order_release);
      ++adopted_.dropped;
      continue;
    }
    kept.push_back({s.stamp, i});
  }
  // Most recent first; a key twice (a crash between a slot's write and its older twin's removal): the newer.
  std::sort(kept.begin(), kept.end(), [](const Kept& a, const Kept& b) { return a.stamp > b.stamp; });
  for (const Kept& k : kept) {
    Slot& s = slot(k.index);
    if (!slot_of_.emplace(s.key, k.index).second) {
      s.state.store(kFree, std::memory_order_release);
      ++adopted_.dropped;
      continue;
    }
    by_stamp_.emplace(k.stamp, k.index);
    adopted_.keys.push_back(s.key);
    next_stamp_ = std::max(next_stamp_, k.stamp + 1);
  }
}

void PersistentBlockFile::free_slot(uint32_t index) {
  Slot& s = slot(index);
  by_stamp_.erase(s.stamp);
  slot_of_.erase(s.key);
  s.state.store(kFree, std::memory_order_release);
  free_.push_back(index);
}

void PersistentBlockFile::put(BlockKey key, std::span<const std::byte> bytes) {
  if (slot_of_.contains(key)) return;
  if (free_.empty()) free_slot(by_stamp_.begin()->second);  // the oldest gives its slot
  const uint32_t index = free_.back();
  free_.pop_back();
  Slot& s = slot(index);
  s.state.store(kFree, std::memory_order_release);
  if (identity_.block_bytes > 0) std::memcpy(slot_bytes(index), bytes.data(), identity_.block_bytes);
  s.key = key;
  s.stamp = next_stamp_++;
  s.checksum = checksum(s, index);
  s.state.store(kValid, std::memory_order_release);
  slot_of_.emplace(key, index);
  by_stamp_.emplace(s.stamp, index);
}

void PersistentBlockFile::remove(BlockKey key) {
  auto it = slot_of_.find(key);
  if (it != slot_of_.end()) free_slot(it->second);
}

std::optional<std::span<const std::byte>> PersistentBlockFile::bytes(BlockKey key) {
  auto it = slot_of_.find(key);
  if (it == slot_of_.end()) return std::nullopt;
  const uint32_t index = it->second;
  if (checksum(slot(index), index) != slot(index).checksum) {
    free_slot(index);
    return std::nullopt;
  }
  return std::span<const std::byte>(slot_bytes(index), identity_.block_bytes);
}

}  // namespace crescent::kv
