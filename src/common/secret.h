// Secrets crescent checks and shares (docs/serving.md, "Who may talk to what"): comparisons that do not
// leak where two secrets differ. Through libsodium.
#pragma once

#include <string_view>

namespace crescent {

/// Whether `a` and `b` are the same secret (an API key against the one configured), in time that depends
/// on neither where they differ nor their lengths: both are hashed (BLAKE2b-256) and the digests compared
/// in constant time.
bool secrets_equal(std::string_view a, std::string_view b);

}  // namespace crescent
