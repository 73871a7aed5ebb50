#include "common/secret.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/atomic_file.h"

namespace crescent {
namespace {

using Digest = std::array<unsigned char, crypto_generichash_BYTES>;

void require_sodium() {
  static const bool ready = sodium_init() >= 0;
  if (!ready) throw std::runtime_error("libsodium could not be initialised");
}

Digest digest_of(std::string_view s) {
  Digest d;
  crypto_generichash(d.data(), d.size(), reinterpret_cast<const unsigned char*>(s.data()), s.size(), nullptr,
                     0);
  return d;
}

}  // namespace

bool secrets_equal(std::string_view a, std::string_view b) {
  require_sodium();
  const Digest da = digest_of(a), db = digest_of(b);
  return sodium_memcmp(da.data(), db.data(), da.size()) == 0;
}

UnguessableIds::UnguessableIds() {
  require_sodium();
  static_assert(sizeof(key_) == crypto_shorthash_KEYBYTES);
  randombytes_buf(key_.data(), key_.size());
}

uint64_t UnguessableIds::next() {
  const uint64_t counter = counter_++;
  uint64_t id = 0;
  static_assert(sizeof(id) == crypto_shorthash_BYTES);
  crypto_shorthash(reinterpret_cast<unsigned char*>(&id), reinterpret_cast<const unsigned char*>(&counter),
                   sizeof(counter), key_.data());
  return id;
}

ClusterSecret ClusterSecret::generate() {
  require_sodium();
  ClusterSecret s;
  randombytes_buf(s.bytes_.data(), s.bytes_.size());
  return s;
}

Result<ClusterSecret> ClusterSecret::from_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return Status::invalid_argument(
        fmt::format("cluster secret {}: mode {:o} lets others read it (chmod 600 {})", path, st.st_mode & 0777,
                    path));
  }
  auto text = read_small_file(path, 256);
  if (!text.ok()) return Status::invalid_argument(fmt::format("cluster secret: {}", text.status().message()));
  std::string hex = *text;
  while (!hex.empty() && (hex.back() == '\n' || hex.back() == '\r')) hex.pop_back();
  ClusterSecret s;
  size_t length = 0;
  if (hex.size() != 2 * s.bytes_.size() ||
      sodium_hex2bin(s.bytes_.data(), s.bytes_.size(), hex.data(), hex.size(), nullptr, &length, nullptr) != 0 ||
      length != s.bytes_.size()) {
    return Status::invalid_argument(
        fmt::format("cluster secret {}: expected 64 hex digits (crescent serve secret writes one)", path));
  }
  return s;
}

Status ClusterSecret::write_to(const std::string& path) const {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Status::io_error(fmt::format("cluster secret {}: cannot create it: {}", path, std::strerror(errno)));
  }
  std::string hex(2 * bytes_.size() + 1, '\0');
  sodium_bin2hex(hex.data(), hex.size(), bytes_.data(), bytes_.size());
  hex.back() = '\n';
  const bool written = ::write(fd, hex.data(), hex.size()) == static_cast<ssize_t>(hex.size());
  const int error = errno;
  ::close(fd);
  if (!written) {
    ::unlink(path.c_str());
    return Status::io_error(fmt::format("cluster secret {}: cannot write it: {}", path, std::strerror(error)));
  }
  return Status::ok_status();
}

std::array<uint8_t, 32> ClusterSecret::derive(std::string_view purpose) const {
  require_sodium();
  std::array<uint8_t, 32> out{};
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(purpose.data()),
                     purpose.size(), bytes_.data(), bytes_.size());
  return out;
}

CurveKeyPair ClusterSecret::curve_key_pair(std::string_view purpose) const {
  CurveKeyPair pair;
  pair.secret_key = derive(purpose);
  crypto_scalarmult_base(pair.public_key.data(), pair.secret_key.data());
  return pair;
}

}  // namespace crescent
