// Names of an enum's values, for parsing command-line and config words with errors that list the valid ones.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace crescent {

/// A fixed table of (name, value) pairs; `what` names the kind of thing in errors ("prefill policy").
template <typename Enum, std::size_t N>
struct NameTable {
  std::string_view what;
  std::array<std::pair<std::string_view, Enum>, N> entries;

  /// The value named `name`; kNotFound "unknown <what> '<name>' (valid: a, b, c)" otherwise.
  Result<Enum> parse(std::string_view name) const {
    for (const auto& [n, v] : entries) {
      if (n == name) return v;
    }
    return Status::not_found(
        fmt::format("unknown {} '{}' (valid: {})", what, name, fmt::join(names(), ", ")));
  }

  /// The name of `value` ("?" if it has none).
  std::string_view name(Enum value) const {
    for (const auto& [n, v] : entries) {
      if (v == value) return n;
    }
    return "?";
  }

  /// Every name, in table order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, v] : entries) out.emplace_back(n);
    return out;
  }
};

}  // namespace crescent
