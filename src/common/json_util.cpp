#include "common/json_util.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>

namespace crescent {
namespace {

// A SAX pass that only counts nesting; false from a handler stops the parse.
struct DepthCheck : nlohmann::json_sax<nlohmann::json> {
  int depth = 0, limit = 0;
  bool exceeded = false;
  bool push() {
    exceeded = ++depth > limit;
    return !exceeded;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return push(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return push(); }
  bool end_array() override { return --depth, true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};

}  // namespace

bool json_depth_exceeds(std::string_view text, int limit) {
  DepthCheck check;
  check.limit = limit;
  nlohmann::json::sax_parse(text, &check, nlohmann::json::input_format_t::json, /*strict=*/true);
  return check.exceeded;
}

Result<nlohmann::json> read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::not_found(fmt::format("{}: cannot open file", path));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::invalid_argument(fmt::format("{}: not valid JSON (byte {}): {}", path, e.byte, e.what()));
  } catch (const nlohmann::json::exception& e) {  // e.g. a number too large for a double
    return Status::invalid_argument(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
}

std::string preset_override_name(std::string_view preset, const nlohmann::json& object) {
  std::vector<std::string> overrides;
  for (const auto& [key, value] : object.items()) {
    if (key != "preset" && key != "name") overrides.push_back(fmt::format("{}={}", key, value.dump()));
  }
  if (overrides.empty()) return std::string(preset);
  return fmt::format("{} with {}", preset, fmt::join(overrides, ", "));
}

Status JsonFields::positive_number(std::string_view key, double& out, bool required, bool allow_zero) const {
  auto it = object_.find(key);
  if (it == object_.end()) {
    return required ? Status::invalid_argument(fmt::format("{}: missing field '{}'", where_, key)) : Status();
  }
  if (!it->is_number()) {
    return Status::invalid_argument(
        fmt::format("{}: field '{}' must be a number, got {}", where_, key, it->dump()));
  }
  double v = it->get<double>();
  if (!std::isfinite(v) || v < 0 || (!allow_zero && v == 0)) {
    return Status::invalid_argument(fmt::format("{}: field '{}' must be {}, got {}", where_, key,
                                                allow_zero ? ">= 0" : "> 0", it->dump()));
  }
  out = v;
  return Status();
}

Status JsonFields::integer(std::string_view key, int64_t& out, int64_t min_value, bool required) const {
  auto it = object_.find(key);
  if (it == object_.end()) {
    return required ? Status::invalid_argument(fmt::format("{}: missing field '{}'", where_, key)) : Status();
  }
  if (!it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > INT64_MAX)) {
    return Status::invalid_argument(
        fmt::format("{}: field '{}' must be an integer, got {}", where_, key, it->dump()));
  }
  int64_t v = it->get<int64_t>();
  if (v < min_value) {
    return Status::invalid_argument(
        fmt::format("{}: field '{}' must be >= {}, got {}", where_, key, min_value, v));
  }
  out = v;
  return Status();
}

Status JsonFields::string(std::string_view key, std::string& out, bool required) const {
  auto it = object_.find(key);
  if (it == object_.end()) {
    return required ? Status::invalid_argument(fmt::format("{}: missing field '{}'", where_, key)) : Status();
  }
  if (!it->is_string()) {
    return Status::invalid_argument(
        fmt::format("{}: field '{}' must be a string, got {}", where_, key, it->dump()));
  }
  out = it->get<std::string>();
  return Status();
}

Status JsonFields::no_unknown_keys(std::span<const std::string_view> known) const {
  if (!object_.is_object()) return Status::invalid_argument(fmt::format("{}: must be a JSON object", where_));
  for (const auto& [key, value] : object_.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string names;
      for (auto k : known) names += fmt::format("{}{}", names.empty() ? "" : ", ", k);
      return Status::invalid_argument(fmt::format("{}: unknown field '{}' (known: {})", where_, key, names));
    }
  }
  return Status();
}

Status JsonFields::no_missing_keys(std::span<const std::string_view> required) const {
  if (!object_.is_object()) return Status::invalid_argument(fmt::format("{}: must be a JSON object", where_));
  std::vector<std::string> missing;
  for (std::string_view key : required) {
    if (!object_.contains(key)) missing.push_back(fmt::format("'{}'", key));
  }
  if (missing.empty()) return Status();
  return Status::invalid_argument(fmt::format("{}: missing field{} {}", where_,
                                              missing.size() == 1 ? "" : "s", fmt::join(missing, ", ")));
}

}  // namespace crescent
