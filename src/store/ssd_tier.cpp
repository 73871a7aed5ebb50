#include "store/ssd_tier.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace crescent::store {
namespace {

constexpr const char* kFilePrefix = "crescent-ssd-";

Status io_error(const std::string& what, const std::string& path) {
  return Status::io_error(fmt::format("ssd tier: {} {}: {}", what, path, std::strerror(errno)));
}

}  // namespace

Result<std::unique_ptr<SsdTier>> SsdTier::open(const std::string& dir, uint64_t capacity_bytes) {
  if (capacity_bytes == 0) return Status::invalid_argument("ssd tier: capacity is 0 bytes");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::io_error(fmt::format("ssd tier: cannot create {}: {}", dir, ec.message()));
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().starts_with(kFilePrefix)) std::filesystem::remove(entry.path(), ec);
  }
  if (ec) return Status::io_error(fmt::format("ssd tier: cannot clean {}: {}", dir, ec.message()));
  // A directory files cannot be written in would lose every spill: refused now, not found out later.
  const std::string probe = fmt::format("{}/{}probe", dir, kFilePrefix);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const bool written = fd >= 0 && ::write(fd, "x", 1) == 1;
  const int error = errno;
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  if (!written) {
    return Status::io_error(fmt::format("ssd tier: cannot write files in {}: {}", dir, std::strerror(error)));
  }
  return std::unique_ptr<SsdTier>(new SsdTier(dir, capacity_bytes));
}

Status SsdTier::write(const std::string& key, const void* data, uint64_t size_bytes,
                      std::vector<std::string>& dropped) {
  if (size_bytes > capacity_bytes_) {
    return Status::no_space(fmt::format("ssd tier: a value of {} bytes is larger than the tier ({} bytes)",
                                        size_bytes, capacity_bytes_));
  }
  remove(key);
  while (used_bytes_ + size_bytes > capacity_bytes_ && !lru_.empty()) {
    std::string victim = lru_.back();
    remove(victim);
    dropped.push_back(std::move(victim));
  }
  const std::string path = fmt::format("{}/{}{}", dir_, kFilePrefix, next_file_++);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return io_error("open", path);
  const auto* bytes = static_cast<const char*>(data);
  for (uint64_t done = 0; done < size_bytes;) {
    const ssize_t n = ::write(fd, bytes + done, size_bytes - done);
    if (n <= 0) {
      Status failed = io_error("write", path);
      ::close(fd);
      ::unlink(path.c_str());
      return failed;
    }
    done += static_cast<uint64_t>(n);
  }
  ::close(fd);
  lru_.push_front(key);
  files_[key] = {path, size_bytes, lru_.begin()};
  used_bytes_ += size_bytes;
  return Status();
}

Status SsdTier::read(const std::string& key, void* out, uint64_t size_bytes) {
  auto it = files_.find(key);
  if (it == files_.end()) return Status::not_found("ssd tier: no file for the key");
  if (it->second.size_bytes != size_bytes) {
    return Status::io_error(fmt::format("ssd tier: {} holds {} bytes, {} asked", it->second.path,
                                        it->second.size_bytes, size_bytes));
  }
  const int fd = ::open(it->second.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("open", it->second.path);
  auto* bytes = static_cast<char*>(out);
  for (uint64_t done = 0; done < size_bytes;) {
    const ssize_t n = ::pread(fd, bytes + done, size_bytes - done, static_cast<off_t>(done));
    if (n <= 0) {
      Status failed =
          n == 0 ? Status::io_error(fmt::format("ssd tier: {} is shorter than recorded", it->second.path))
                 : io_error("read", it->second.path);
      ::close(fd);
      return failed;
    }
    done += static_cast<uint64_t>(n);
  }
  ::close(fd);
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return Status();
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
