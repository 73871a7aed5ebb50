#include "perf/profile.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <utility>
#include <vector>

namespace crescent::perf {

Result<Profile> profile_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object())
    return Status::invalid_argument(fmt::format("{}: a profile must be a JSON object", where));
  Profile p;
  if (auto it = j.find("source"); it != j.end() && it->is_string()) p.source = it->get<std::string>();
  const std::vector<std::pair<const char*, double*>> fields = {
      {"linear_s_per_token", &p.linear_s_per_token},
      {"attention_s_per_token_context", &p.attention_s_per_token_context},
      {"decode_weight_read_s", &p.decode_weight_read_s},
      {"decode_s_per_request", &p.decode_s_per_request},
      {"decode_kv_read_s_per_token", &p.decode_kv_read_s_per_token},
      {"prefill_iteration_overhead_s", &p.prefill_iteration_overhead_s}};
  for (const auto& [name, value] : fields) {
    auto it = j.find(name);
    if (it == j.end()) return Status::invalid_argument(fmt::format("{}: field '{}' is missing", where, name));
    if (!it->is_number()) {
      return Status::invalid_argument(
          fmt::format("{}: field '{}' must be a number, got {}", where, name, it->dump()));
    }
    *value = it->get<double>();
    if (!std::isfinite(*value) || *value < 0) {
      return Status::invalid_argument(
          fmt::format("{}: field '{}' must be >= 0, got {}", where, name, *value));
    }
  }
  if (p.linear_s_per_token <= 0) {
    return Status::invalid_argument(fmt::format("{}: field 'linear_s_per_token' must be > 0", where));
  }
  return p;
}

nlohmann::json to_json(const Profile& p) {
  return nlohmann::json{{"source", p.source},
                        {"linear_s_per_token", p.linear_s_per_token},
                        {"attention_s_per_token_context", p.attention_s_per_token_context},
                        {"decode_weight_read_s", p.decode_weight_read_s},
                        {"decode_s_per_request", p.decode_s_per_request},
                        {"decode_kv_read_s_per_token", p.decode_kv_read_s_per_token},
                        {"prefill_iteration_overhead_s", p.prefill_iteration_overhead_s}};
}

Result<Profile> load_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::not_found(fmt::format("cannot open profile '{}'", path));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::invalid_argument(fmt::format("{}: not valid JSON", path));
  return profile_from_json(j, path);
}

}  // namespace crescent::perf
