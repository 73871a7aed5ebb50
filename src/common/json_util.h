// Reading typed fields out of JSON config files with errors that name the file and the field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"

namespace crescent {

/// Parses the JSON file at `path`. Errors: kNotFound if it cannot be opened, kInvalidArgument with the
/// parser's byte offset if it is not JSON.
Result<nlohmann::json> read_json_file(const std::string& path);

/// Reads JSON objects' fields with checks. `where` names the object for messages, e.g. "configs/x.json:
/// model". Each getter leaves `out` unchanged and returns ok when the field is absent and `required` is
/// false.
class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string where) : object_(object), where_(std::move(where)) {}

  /// A finite number > 0 (or >= 0 when `allow_zero`).
  Status positive_number(std::string_view key, double& out, bool required = true,
                         bool allow_zero = false) const;
  /// An integer >= `min_value`.
  Status integer(std::string_view key, int64_t& out, int64_t min_value, bool required = true) const;
  Status string(std::string_view key, std::string& out, bool required = true) const;
  /// Errors when the object has a key not in `known` (catches typos in configs).
  Status no_unknown_keys(std::initializer_list<std::string_view> known) const;

  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& object_;
  std::string where_;
};

}  // namespace crescent
