#include "perf/cost_model.h"

#include <fmt/format.h>

#include <cmath>
#include <utility>

namespace crescent::perf {

CostModel::CostModel(ModelSpec model, HardwareSpec hardware, const Profile* profile)
    : model_(std::move(model)), hardware_(std::move(hardware)) {
  assert(validate_model_spec(model_, "CostModel model").ok());
  assert(validate_hardware_spec(hardware_, "CostModel hardware").ok());
  const auto& m = model_;
  const auto& h = hardware_;
  kv_bytes_per_token_ = static_cast<double>(perf::kv_bytes_per_token(m));
  weight_bytes_ = m.parameters * static_cast<double>(m.bytes_per_element);
  linear_flops_per_token_ = 2 * m.parameters;
  attention_flops_per_token_context_ = 4.0 * static_cast<double>(m.layers * m.hidden_size);

  const double gpus = static_cast<double>(h.gpus);
  const double flops_per_s = gpus * h.peak_flops_per_gpu * h.mfu;
  c_.linear_s_per_token = linear_flops_per_token_ / flops_per_s;
  c_.attention_s_per_token_context = attention_flops_per_token_context_ / flops_per_s;
  const double decode_bytes_per_s = gpus * h.hbm_bytes_per_s_per_gpu * h.memory_bandwidth_utilization;
  c_.decode_weight_read_s = weight_bytes_ / decode_bytes_per_s;
  c_.decode_kv_read_s_per_token = kv_bytes_per_token_ / decode_bytes_per_s;
  kv_transfer_s_per_token_ = kv_bytes_per_token_ / h.network_bytes_per_s;
  kv_load_s_per_token_ = kv_bytes_per_token_ / h.host_device_bytes_per_s;
  c_.source = "roofline";
  if (profile != nullptr) c_ = *profile;
}

int64_t CostModel::decode_kv_capacity_tokens(double reserved_share) const {
  assert(reserved_share >= 0 && reserved_share < 1);
  const double usable_bytes =
      static_cast<double>(hardware_.gpus) * hardware_.hbm_bytes_per_gpu * (1 - reserved_share) -
      weight_bytes_;
  if (usable_bytes <= 0) return 0;
  return static_cast<int64_t>(std::floor(usable_bytes / kv_bytes_per_token_));
}

Status CostModel::check_times_finite(int64_t max_tokens, int64_t chunk_tokens, std::string_view where) const {
  const bool roofline = c_.source == "roofline";
  const std::string_view flops = roofline ? "hardware figures peak_flops_per_gpu x gpus x mfu too small"
                                          : "the profile's coefficient too large";
  const std::string_view hbm =
      roofline ? "hardware figures hbm_bytes_per_s_per_gpu x gpus x memory_bandwidth_utilization too small"
               : "the profile's coefficient too large";
  const std::pair<std::string_view, std::pair<double, std::string_view>> coefficients[] = {
      {"linear_s_per_token", {c_.linear_s_per_token, flops}},
      {"attention_s_per_token_context", {c_.attention_s_per_token_context, flops}},
      {"decode_weight_read_s", {c_.decode_weight_read_s, hbm}},
      {"decode_kv_read_s_per_token", {c_.decode_kv_read_s_per_token, hbm}},
      {"decode_s_per_request", {c_.decode_s_per_request, "the profile's coefficient too large"}},
      {"prefill_iteration_overhead_s",
       {c_.prefill_iteration_overhead_s, "the profile's coefficient too large"}},
      {"KV transfer seconds per token",
       {kv_transfer_s_per_token_, "hardware figure network_bytes_per_s too small"}},
      {"KV load seconds per token",
       {kv_load_s_per_token_, "hardware figure host_device_bytes_per_s too small"}},
  };
  // An infinite coefficient can hide in a time as 0 * inf = NaN, which std::max drops: checked first.
  for (const auto& [name, value_and_cause] : coefficients) {
    const auto& [value, cause] = value_and_cause;
    if (!std::isfinite(value))
      return Status::invalid_argument(fmt::format("{}: {} is {} s: {}", where, name, value, cause));
  }
  const int64_t n = std::max<int64_t>(1, max_tokens);
  const std::string_view compute =
      roofline ? "hardware figures peak_flops_per_gpu or hbm_bytes_per_s_per_gpu too small"
               : "the profile's coefficients too large";
  const std::pair<std::string_view, std::pair<double, std::string_view>> times[] = {
      {"prefill", {prefill_iterations_time_s(n, n, std::max<int64_t>(0, chunk_tokens)), compute}},
      {"decode step", {decode_step_time_s(n, n), compute}},
      {"KV transfer", {kv_transfer_time_s(n), "hardware figure network_bytes_per_s too small"}},
      {"KV load", {kv_load_time_s(n), "hardware figure host_device_bytes_per_s too small"}},
  };
  for (const auto& [what, seconds_and_cause] : times) {
    const auto& [seconds, cause] = seconds_and_cause;
    if (std::isfinite(seconds)) continue;
    return Status::invalid_argument(
        fmt::format("{}: the predicted {} time for {} tokens is {} s: {}", where, what, n, seconds, cause));
  }
  return Status();
}

}  // namespace crescent::perf
