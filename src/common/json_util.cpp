#include "common/json_util.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <simdjson.h>

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

// `element` as nlohmann's tree, typed as nlohmann's own parser types it: a non-negative integer is unsigned,
// a duplicate key keeps its last value. False when arrays and objects nest deeper than `levels` (simdjson's own
// limit leaves an empty array or object one level more, and bounds this recursion).
bool to_nlohmann(simdjson::dom::element element, nlohmann::json& out, int levels) {
  using simdjson::dom::element_type;
  switch (element.type()) {
    case element_type::ARRAY: {
      if (levels == 0) return false;
      out = nlohmann::json::array();
      auto& items = out.get_ref<nlohmann::json::array_t&>();
      const simdjson::dom::array array(element);
      items.reserve(array.size());
      for (simdjson::dom::element item : array) {
        if (!to_nlohmann(item, items.emplace_back(), levels - 1)) return false;
      }
      return true;
    }
    case element_type::OBJECT: {
      if (levels == 0) return false;
      out = nlohmann::json::object();
      auto& members = out.get_ref<nlohmann::json::object_t&>();
      const simdjson::dom::object object(element);
      for (simdjson::dom::key_value_pair member : object) {
        if (!to_nlohmann(member.value, members[std::string(member.key)], levels - 1)) return false;
      }
      return true;
    }
    case element_type::INT64: {
      const int64_t v = element.get_int64().value_unsafe();
      if (v >= 0) {
        out = static_cast<uint64_t>(v);
      } else {
        out = v;
      }
      return true;
    }
    case element_type::UINT64:
      out = element.get_uint64().value_unsafe();
      return true;
    case element_type::DOUBLE:
      out = element.get_double().value_unsafe();
      return true;
    case element_type::STRING:
      out = std::string(element.get_string().value_unsafe());
      return true;
    case element_type::BOOL:
      out = element.get_bool().value_unsafe();
      return true;
    case element_type::NULL_VALUE:
      out = nullptr;
      return true;
  }
  return true;
}

}  // namespace

Result<nlohmann::json> parse_json_bounded(std::string_view text, int max_depth) {
  // One parser per thread keeps its buffers between bodies.
  thread_local simdjson::dom::parser parser;
  const auto depth = static_cast<size_t>(max_depth) + 1;  // simdjson counts the document as a level
  // A UTF-8 byte order mark is skipped, as nlohmann skips it (simdjson refuses it).
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);
  if (parser.max_depth() != depth) {
    if (const auto error = parser.allocate(std::max<size_t>(text.size(), parser.capacity()), depth)) {
      return Status::internal(fmt::format("cannot parse JSON: {}", simdjson::error_message(error)));
    }
  }
  const auto too_deep = [&] {
    return Status::out_of_range(fmt::format("JSON nests arrays and objects deeper than {} levels", max_depth));
  };
  simdjson::dom::element root;
  if (const auto error = parser.parse(text.data(), text.size()).get(root)) {
    if (error == simdjson::DEPTH_ERROR) return too_deep();
    if (error == simdjson::NUMBER_ERROR) {
      return Status::invalid_argument("not valid JSON: a number out of range (an integer must fit in 64 bits, a "
                                      "float in a double)");
    }
    return Status::invalid_argument(fmt::format("not valid JSON: {}", simdjson::error_message(error)));
  }
  nlohmann::json tree;
  if (!to_nlohmann(root, tree, max_depth)) return too_deep();
  return tree;
}

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
