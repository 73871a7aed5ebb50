// Numbers as people read them in tables and messages.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace crescent {

/// Binary size units, bytes.
inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;
inline constexpr uint64_t kGiB = 1024 * kMiB;

/// `bytes` as "4 KiB", "64 MiB" when a whole number of KiB/MiB, else "1000 B" (cli's parse_size reads it back
/// without the space).
inline std::string format_size(uint64_t bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return fmt::format("{} MiB", bytes / kMiB);
  if (bytes >= kKiB && bytes % kKiB == 0) return fmt::format("{} KiB", bytes / kKiB);
  return fmt::format("{} B", bytes);
}

/// `n` with thousands separators: 12031 -> "12,031".
inline std::string grouped(int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

/// `value` × `scale` with `decimals` and `unit` ("35.6%", "1.35 s"), or "n/a" for a statistic of nothing.
inline std::string format_or_na(std::optional<double> value, double scale, int decimals,
                                std::string_view unit) {
  return value ? fmt::format("{:.{}f}{}", *value * scale, decimals, unit) : "n/a";
}

}  // namespace crescent
