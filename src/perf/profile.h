// A measured profile of one model on one instance (issue 11 §4, `crescent profile`): the cost model's
// coefficients fitted by least squares to timed iterations, replacing the ones the roofline derives from
// the hardware's datasheet figures. Times in seconds.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "common/status.h"

namespace crescent::perf {

/// The coefficients of CostModel an iteration's time is made of (cost_model.h):
///   prefill compute = n × (linear_s_per_token + attention_s_per_token_context × (p + (n + 1) / 2))
///   decode memory   = decode_weight_read_s + decode_s_per_request × batch + decode_kv_read_s_per_token × ctx
///   an iteration    = max(memory, compute), + prefill_iteration_overhead_s when it prefills.
/// The roofline has decode_s_per_request = prefill_iteration_overhead_s = 0. On a CPU they are large: a
/// matrix product of a few rows reads (and packs) every weight whatever the rows, a fixed cost per iteration
/// that prefills, and the decode step's grows with the batch; the overhead is also what each extra chunk of
/// a chunked prefill costs.
struct Profile {
  std::string source;  // what was profiled, for reports: "cpu: models/small", "mock: configs/cpu.json"
  double linear_s_per_token = 0;             // > 0
  double attention_s_per_token_context = 0;  // >= 0
  double decode_weight_read_s = 0;           // >= 0
  double decode_s_per_request = 0;           // >= 0
  double decode_kv_read_s_per_token = 0;     // >= 0
  double prefill_iteration_overhead_s = 0;   // >= 0
};

/// Reads a profile's JSON object (what to_json writes; other fields, e.g. the fit's points and residuals,
/// are ignored). Errors (kInvalidArgument) name `where` and the field: missing, not a number, negative,
/// linear_s_per_token not > 0.
Result<Profile> profile_from_json(const nlohmann::json& j, const std::string& where);
/// The profile as JSON: "source" and the six coefficients.
nlohmann::json to_json(const Profile& profile);
/// Reads a profile file (`crescent profile --out`). Errors: kNotFound, or the parser's naming the file.
Result<Profile> load_profile(const std::string& path);

}  // namespace crescent::perf
