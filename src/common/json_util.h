// Reading typed fields out of JSON config files with errors that name the file and the field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace crescent {

/// Parses the JSON file at `path`. Errors: kNotFound if it cannot be opened, kInvalidArgument with the
/// parser's byte offset if it is not JSON.
Result<nlohmann::json> read_json_file(const std::string& path);

/// Whether JSON `text` nests arrays and objects deeper than `limit` levels, found by a SAX pass that builds
/// nothing (false for text that is not JSON up to that depth). Untrusted JSON is checked before it is parsed
/// into a tree: copying, printing or destroying a deep tree recurses, and 200,000 levels overflow a stack.
bool json_depth_exceeds(std::string_view text, int limit);

/// Parses untrusted JSON `text` (a request body) into nlohmann's tree with simdjson (libsimdjson, as the trace
/// reader): the check json_depth_exceeds makes is done in the same pass, and long strings are not lexed a
/// character at a time (a body with a 32 KiB prompt parses over 10x faster than json_depth_exceeds then
/// nlohmann::json::parse). The tree is the one nlohmann builds from the same text, typed as it types numbers;
/// tests/common/json_util_test.cpp compares them. Where the libraries differ: an integer beyond 64 bits is
/// refused (nlohmann makes it a double), and "-0" is an unsigned 0 (nlohmann: a signed one). Errors:
/// kOutOfRange when `text` nests arrays and objects deeper than `max_depth` levels; kInvalidArgument "not
/// valid JSON: why" otherwise. REQUIRES: 1 <= max_depth <= 1024.
Result<nlohmann::json> parse_json_bounded(std::string_view text, int max_depth);

/// `value` as JSON, `null` when there is none (a statistic of nothing is not 0).
inline nlohmann::json json_or_null(std::optional<double> value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

/// The name of a preset with some fields overridden, for reports to say what ran: "8xA800 with gpus=4,
/// mfu=0.4" for `object` {"preset": "8xA800", "gpus": 4, "mfu": 0.4}; `preset` alone when nothing but
/// "preset" (and "name") is set. Values appear as JSON.
std::string preset_override_name(std::string_view preset, const nlohmann::json& object);

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
  /// Errors when the object has a key not in `known` (catches typos in configs), listing the known ones.
  Status no_unknown_keys(std::span<const std::string_view> known) const;
  Status no_unknown_keys(std::initializer_list<std::string_view> known) const {
    return no_unknown_keys(std::span<const std::string_view>(known.begin(), known.size()));
  }
  /// Errors when any key of `required` is absent, naming all of them at once: "<where>: missing fields
  /// 'a', 'b'" (or "missing field 'a'").
  Status no_missing_keys(std::span<const std::string_view> required) const;
  Status no_missing_keys(std::initializer_list<std::string_view> required) const {
    return no_missing_keys(std::span<const std::string_view>(required.begin(), required.size()));
  }

  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& object_;
  std::string where_;
};

}  // namespace crescent
