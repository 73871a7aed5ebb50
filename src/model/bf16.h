// bfloat16 (the top 16 bits of an IEEE float32), the other weight and KV element type crescent reads.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace crescent::model {

/// float32 → bfloat16, rounding to nearest even (NaN stays NaN), as PyTorch's .to(torch.bfloat16) does.
inline uint16_t to_bf16(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

/// bfloat16 → float32 (exact).
inline float from_bf16(uint16_t half) {
  return std::bit_cast<float>(static_cast<uint32_t>(half) << 16);
}

}  // namespace crescent::model
