// Internal to perf: the part of reading a ModelSpec or HardwareSpec from a config object that both share.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_util.h"
#include "common/status.h"

namespace crescent::perf {

/// The spec an object starts from, before its own fields are read: with "preset", that preset, named after
/// its overrides (preset_override_name); without, a default Spec, once every one of `fields` is checked to be
/// there (all missing ones named at once). Also refuses keys other than `fields` and "preset". Errors name
/// `where`; an unknown preset is kNotFound listing the valid names.
template <typename Spec>
Result<Spec> spec_base(const nlohmann::json& j, const std::string& where,
                       std::span<const std::string_view> fields, Result<Spec> (*preset)(std::string_view)) {
  const JsonFields f(j, where);
  std::vector<std::string_view> known(fields.begin(), fields.end());
  known.push_back("preset");
  CRESCENT_RETURN_IF_ERROR(f.no_unknown_keys(known));
  if (!j.contains("preset")) {
    CRESCENT_RETURN_IF_ERROR(f.no_missing_keys(fields));  // with a preset every field is an optional override
    return Spec{};
  }
  std::string preset_name;
  CRESCENT_RETURN_IF_ERROR(f.string("preset", preset_name));
  Result<Spec> spec = preset(preset_name);
  if (!spec.ok())
    return Status::not_found(fmt::format("{}: field 'preset': {}", where, spec.status().message()));
  spec->name = preset_override_name(preset_name, j);
  return spec;
}

}  // namespace crescent::perf
