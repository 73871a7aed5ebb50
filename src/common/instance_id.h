// The index of an instance within its pool.
#pragma once

#include <cstdint>

namespace crescent {

/// Index of a prefill or decode instance within its pool (0-based).
using InstanceId = std::uint32_t;

}  // namespace crescent
