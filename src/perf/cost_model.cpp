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

Status CostModel::check_times_finite(int64_t max_tokens, std::string_view where) const {
  const std::string_view why =
      "a FLOPS or bandwidth figure is too small, or a profile's coefficient too large";
  // An infinite coefficient can hide in a time as 0 * inf = NaN, which std::max drops: checked first.
  const std::pair<std::string_view, double> coefficients[] = {
      {"linear_s_per_token", c_.linear_s_per_token},
      {"attention_s_per_token_context", c_.attention_s_per_token_context},
      {"decode_weight_read_s", c_.decode_weight_read_s},
      {"decode_kv_read_s_per_token", c_.decode_kv_read_s_per_token},
      {"decode_s_per_request", c_.decode_s_per_request},
      {"prefill_iteration_overhead_s", c_.prefill_iteration_overhead_s},
      {"KV transfer seconds per token", kv_transfer_s_per_token_},
      {"KV load seconds per token", kv_load_s_per_token_},
  };
  for (const auto& [name, value] : coefficients) {
    if (!std::isfinite(value))
      return Status::invalid_argument(fmt::format("{}: {} is {}: {}", where, name, value, why));
  }
  const int64_t n = std::max<int64_t>(1, max_tokens);
  const std::pair<std::string_view, double> times[] = {
      {"prefill", iteration_time_s(0, 0, n, n)},
      {"decode step", decode_step_time_s(n, n)},
      {"KV transfer", kv_transfer_time_s(n)},
      {"KV load", kv_load_time_s(n)},
  };
  for (const auto& [what, seconds] : times) {
    if (std::isfinite(seconds)) continue;
    return Status::invalid_argument(
        fmt::format("{}: the predicted {} time for {} tokens is {} s: {}", where, what, n, seconds, why));
  }
  return Status();
}

}  // namespace crescent::perf
