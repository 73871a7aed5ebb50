// Numbers as people read them in tables and messages.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace crescent {

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
