// Secrets crescent checks and shares (docs/serving.md, "Who may talk to what"): comparisons that do not
// leak where two secrets differ, and the secret the members of one cluster share, from which the keys of
// its sockets are derived. Through libsodium.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace crescent {

/// Whether `a` and `b` are the same secret (an API key against the one configured), in time that depends
/// on neither where they differ nor their lengths: both are hashed (BLAKE2b-256) and the digests compared
/// in constant time.
bool secrets_equal(std::string_view a, std::string_view b);

/// Identifiers nobody can guess from the others, cheaply: SipHash-2-4 (libsodium's crypto_shorthash, a
/// pseudo-random function) of a counter under a key drawn from the operating system's random source once.
/// Distinct counters give unrelated values (a repeat among 2^32 ids has probability ~2^-33). Not
/// thread-safe.
class UnguessableIds {
 public:
  UnguessableIds();
  /// The next identifier (any 64-bit value, 0 included).
  uint64_t next();

 private:
  std::array<uint8_t, 16> key_{};
  uint64_t counter_ = 0;
};

/// A Curve25519 key pair (raw 32-byte keys), as ZeroMQ's CURVE mechanism takes them.
struct CurveKeyPair {
  std::array<uint8_t, 32> public_key{};
  std::array<uint8_t, 32> secret_key{};
};

/// The secret the members of one cluster share: 32 random bytes, kept in a file as 64 hex digits (and a
/// newline) that only its owner may read. Whoever holds it is a member: every key a member's sockets use
/// is derived from it (derive, curve_key_pair), so nothing else has to be distributed.
class ClusterSecret {
 public:
  /// 32 bytes from the operating system's random source (libsodium's randombytes).
  static ClusterSecret generate();
  /// Reads a secret written by write_to(). Errors (kInvalidArgument) name the file and what is wrong:
  /// unreadable, not 64 hex digits, or readable or writable by its group or others (a secret everyone on the
  /// host can read admits everyone).
  static Result<ClusterSecret> from_file(const std::string& path);
  /// Writes it to `path` (created with mode 0600; an existing file is refused, not overwritten). kIoError
  /// naming the path and the reason.
  Status write_to(const std::string& path) const;

  /// 32 bytes for `purpose` (e.g. "store-control"), derived with keyed BLAKE2b: different purposes give
  /// unrelated keys, and none reveals the secret.
  std::array<uint8_t, 32> derive(std::string_view purpose) const;
  /// The Curve25519 key pair for `purpose`: derive(purpose) as the secret key, its public key computed.
  CurveKeyPair curve_key_pair(std::string_view purpose) const;

 private:
  ClusterSecret() = default;
  std::array<uint8_t, 32> bytes_{};
};

}  // namespace crescent
