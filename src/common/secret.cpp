#include "common/secret.h"

#include <sodium.h>

#include <array>
#include <stdexcept>

namespace crescent {
namespace {

using Digest = std::array<unsigned char, crypto_generichash_BYTES>;

Digest digest_of(std::string_view s) {
  Digest d;
  crypto_generichash(d.data(), d.size(), reinterpret_cast<const unsigned char*>(s.data()), s.size(), nullptr,
                     0);
  return d;
}

}  // namespace

bool secrets_equal(std::string_view a, std::string_view b) {
  static const bool ready = sodium_init() >= 0;
  if (!ready) throw std::runtime_error("libsodium could not be initialised");
  const Digest da = digest_of(a), db = digest_of(b);
  return sodium_memcmp(da.data(), db.data(), da.size()) == 0;
}

}  // namespace crescent
