#include "store/ssd_tier.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "store/types.h"

namespace crescent::store {
namespace {

constexpr std::string_view kFilePrefix = "crescent-ssd-";
constexpr std::string_view kTempSuffix = ".tmp";
constexpr const char* kLockName = ".lock";

// An object file: a header, the key, the value. The header's integers are little-endian (the byte order of
// every machine crescent builds for), and its last field is a checksum of the header's other fields and the
// key, so a flipped bit in either is found before the key is trusted.
constexpr std::array<char, 8> kMagic = {'C', 'R', 'S', 'S', 'D', '0', '1', '\n'};
struct FileHeader {
  std::array<char, 8> magic = kMagic;
  uint32_t key_bytes = 0;
  uint32_t reserved = 0;
  uint64_t value_bytes = 0;
  uint64_t value_checksum = 0;   // xxh3-64 of the value
  uint64_t header_checksum = 0;  // xxh3-64 of the fields above and the key
};
static_assert(sizeof(FileHeader) == 40);
constexpr uint64_t kHeaderChecksumBytes = offsetof(FileHeader, header_checksum);

uint64_t header_checksum(const FileHeader& header, std::string_view key) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, &header, kHeaderChecksumBytes);
  XXH3_64bits_update(state, key.data(), key.size());
  const uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return sum;
}

uint64_t value_offset(const std::string& key) {
  return sizeof(FileHeader) + key.size();
}

Status io_error(const std::string& what, const std::string& path) {
  return Status::io_error(fmt::format("ssd tier: {} {}: {}", what, path, std::strerror(errno)));
}

/// Writes all of `size` bytes at the file's position. false with errno set.
bool write_all(int fd, const void* data, uint64_t size) {
  const auto* bytes = static_cast<const char*>(data);
  for (uint64_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, bytes + done, size - done);
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    done += static_cast<uint64_t>(n);
  }
  return true;
}

/// Reads exactly `size` bytes at `offset`. kIoError naming `path` (a short file included).
Status read_all(int fd, void* out, uint64_t size, uint64_t offset, const std::string& path) {
  auto* bytes = static_cast<char*>(out);
  for (uint64_t done = 0; done < size;) {
    const ssize_t n = ::pread(fd, bytes + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) return io_error("read", path);
    if (n == 0) return Status::io_error(fmt::format("ssd tier: {} is shorter than its header says", path));
    done += static_cast<uint64_t>(n);
  }
  return Status();
}

/// One file a previous run left, read and verified by `inspect`.
struct Found {
  std::string key;
  std::string path;
  uint64_t value_bytes = 0;
  uint64_t checksum = 0;
  int64_t mtime_ns = 0;  // its last use (SsdTier::stamp)
};

/// Reads `path`'s header and key and verifies its value against the checksum (one sequential read). An
/// error says what is wrong with the file.
Result<Found> inspect(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("open", path);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return io_error("stat", path);
  FileHeader header;
  if (static_cast<uint64_t>(st.st_size) < sizeof header) {
    return Status::io_error(fmt::format("ssd tier: {} is shorter than a header", path));
  }
  CRESCENT_RETURN_IF_ERROR(read_all(fd, &header, sizeof header, 0, path));
  if (header.magic != kMagic)
    return Status::io_error(fmt::format("ssd tier: {} is not an object file", path));
  if (header.key_bytes == 0 || header.key_bytes > kMaxKeyBytes || header.value_bytes == 0 ||
      static_cast<uint64_t>(st.st_size) != sizeof header + header.key_bytes + header.value_bytes) {
    return Status::io_error(
        fmt::format("ssd tier: {} is {} bytes, its header says a {}-byte key and {} bytes", path, st.st_size,
                    header.key_bytes, header.value_bytes));
  }
  Found found;
  found.path = path;
  found.key.resize(header.key_bytes);
  CRESCENT_RETURN_IF_ERROR(read_all(fd, found.key.data(), header.key_bytes, sizeof header, path));
  if (header_checksum(header, found.key) != header.header_checksum) {
    return Status::io_error(fmt::format("ssd tier: {}'s header failed its check", path));
  }
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buffer(std::min<uint64_t>(header.value_bytes, 1 << 20));
  Status read;
  for (uint64_t done = 0; done < header.value_bytes && read.ok();) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), header.value_bytes - done);
    read = read_all(fd, buffer.data(), n, sizeof header + header.key_bytes + done, path);
    XXH3_64bits_update(state, buffer.data(), n);
    done += n;
  }
  const uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  CRESCENT_RETURN_IF_ERROR(read);
  if (sum != header.value_checksum) {
    return Status::io_error(fmt::format("ssd tier: {}'s value failed its check", path));
  }
  found.value_bytes = header.value_bytes;
  found.checksum = header.value_checksum;
  found.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  return found;
}

}  // namespace

Result<std::unique_ptr<SsdTier>> SsdTier::open(const std::string& dir, uint64_t capacity_bytes) {
  if (capacity_bytes == 0) return Status::invalid_argument("ssd tier: capacity is 0 bytes");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::io_error(fmt::format("ssd tier: cannot create {}: {}", dir, ec.message()));
  // A directory files cannot be written in would lose every spill: refused now, not found out later. The
  // lock file is that probe.
  const std::string lock_path = fmt::format("{}/{}", dir, kLockName);
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0 || ::write(lock_fd, "x", 1) != 1) {
    const int error = errno;
    if (lock_fd >= 0) ::close(lock_fd);
    return Status::io_error(fmt::format("ssd tier: cannot write files in {}: {}", dir, std::strerror(error)));
  }
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(lock_fd);
    if (error == EWOULDBLOCK) {
      return Status::already_exists(
          fmt::format("ssd tier: {} is in use by another store node (it holds {})", dir, lock_path));
    }
    return Status::io_error(fmt::format("ssd tier: cannot lock {}: {}", lock_path, std::strerror(error)));
  }
  std::unique_ptr<SsdTier> tier(new SsdTier(dir, capacity_bytes, lock_fd));
  CRESCENT_RETURN_IF_ERROR(tier->adopt());
  return tier;
}

SsdTier::~SsdTier() {
  ::close(lock_fd_);  // releases the lock
}

Status SsdTier::adopt() {
  const auto start = std::chrono::steady_clock::now();
  std::vector<Found> found;
  std::error_code ec;
  std::filesystem::directory_iterator entries(dir_, ec);
  if (ec) return Status::io_error(fmt::format("ssd tier: cannot list {}: {}", dir_, ec.message()));
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kFilePrefix)) continue;  // not ours: left alone
    const std::string path = entry.path().string();
    uint64_t number = 0;
    const char* digits = name.data() + kFilePrefix.size();
    const auto [end, parsed] = std::from_chars(digits, name.data() + name.size(), number);
    const bool numbered = parsed == std::errc() && end == name.data() + name.size();
    Result<Found> file =
        numbered ? inspect(path) : Status::io_error(fmt::format("ssd tier: {} is half written", path));
    if (numbered) next_file_ = std::max(next_file_, number + 1);
    if (!file.ok()) {
      fmt::print(stderr, "{}; deleted\n", file.status().message());
      std::filesystem::remove(path, ec);
      ++adopted_.dropped;
      continue;
    }
    found.push_back(std::move(*file));
  }
  // Newest first: on a key written twice the newer file wins, and the capacity keeps the most recent.
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime_ns > b.mtime_ns; });
  for (Found& f : found) {
    last_stamp_ns_ = std::max(last_stamp_ns_, f.mtime_ns);
    if (files_.contains(f.key) || used_bytes_ + f.value_bytes > capacity_bytes_) {
      std::filesystem::remove(f.path, ec);
      ++adopted_.dropped;
      continue;
    }
    ++adopted_.objects;
    adopted_.bytes += f.value_bytes;
    add_oldest(f.key, {std::move(f.path), f.value_bytes, f.checksum, {}});
  }
  adopted_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status();
}

bool SsdTier::stamp(int fd) {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  last_stamp_ns_ =
      std::max(last_stamp_ns_ + 1, static_cast<int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec);
  const timespec at{static_cast<time_t>(last_stamp_ns_ / 1'000'000'000),
                    static_cast<long>(last_stamp_ns_ % 1'000'000'000)};
  const timespec times[2] = {at, at};
  return ::futimens(fd, times) == 0;
}

void SsdTier::add_oldest(const std::string& key, File file) {
  lru_.push_back(key);
  file.lru = std::prev(lru_.end());
  used_bytes_ += file.size_bytes;
  files_.emplace(key, std::move(file));
}

Status SsdTier::write(const std::string& key, const void* data, uint64_t size_bytes,
                      std::vector<std::string>& dropped) {
  if (size_bytes > capacity_bytes_) {
    return Status::no_space(fmt::format("ssd tier: a value of {} bytes is larger than the tier ({} bytes)",
                                        size_bytes, capacity_bytes_));
  }
  CRESCENT_RETURN_IF_ERROR(validate_key(key));
  remove(key);
  while (used_bytes_ + size_bytes > capacity_bytes_ && !lru_.empty()) {
    std::string victim = lru_.back();
    remove(victim);
    dropped.push_back(std::move(victim));
  }
  FileHeader header;
  header.key_bytes = static_cast<uint32_t>(key.size());
  header.value_bytes = size_bytes;
  header.value_checksum = XXH3_64bits(data, size_bytes);
  header.header_checksum = header_checksum(header, key);
  const std::string path = fmt::format("{}/{}{}", dir_, kFilePrefix, next_file_++);
  const std::string temp = path + std::string(kTempSuffix);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return io_error("open", temp);
  const bool written = write_all(fd, &header, sizeof header) && write_all(fd, key.data(), key.size()) &&
                       write_all(fd, data, size_bytes) && stamp(fd);
  Status failed = written ? Status() : io_error("write", temp);
  if (::close(fd) != 0 && failed.ok()) failed = io_error("close", temp);
  if (failed.ok() && ::rename(temp.c_str(), path.c_str()) != 0) failed = io_error("rename", temp);
  if (!failed.ok()) {
    ::unlink(temp.c_str());
    return failed;
  }
  lru_.push_front(key);
  files_[key] = {path, size_bytes, header.value_checksum, lru_.begin()};
  used_bytes_ += size_bytes;
  return Status();
}

Status SsdTier::read(const std::string& key, void* out, uint64_t size_bytes) {
  auto it = files_.find(key);
  if (it == files_.end()) return Status::not_found("ssd tier: no file for the key");
  const File& file = it->second;
  if (file.size_bytes != size_bytes) {
    return Status::io_error(
        fmt::format("ssd tier: {} holds {} bytes, {} asked", file.path, file.size_bytes, size_bytes));
  }
  const int fd = ::open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("open", file.path);
  Status read = read_all(fd, out, size_bytes, value_offset(key), file.path);
  if (read.ok() && XXH3_64bits(out, size_bytes) != file.checksum) {
    read = Status::io_error(fmt::format("ssd tier: {}'s value failed its check", file.path));
  }
  if (read.ok()) (void)stamp(fd);  // most recently used, also for the next adoption's order
  ::close(fd);
  if (read.ok()) lru_.splice(lru_.begin(), lru_, it->second.lru);
  return read;
}

void SsdTier::remove(const std::string& key) {
  auto it = files_.find(key);
  if (it == files_.end()) return;
  ::unlink(it->second.path.c_str());
  used_bytes_ -= it->second.size_bytes;
  lru_.erase(it->second.lru);
  files_.erase(it);
}

std::vector<std::pair<std::string, uint64_t>> SsdTier::held() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const auto& [key, file] : files_) out.emplace_back(key, file.size_bytes);
  return out;
}

}  // namespace crescent::store
