#include "perf/hardware_spec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "common/json_util.h"
#include "perf/spec_json.h"

namespace crescent::perf {
namespace {

// Efficiency defaults: modelling choices, the same for every preset so that presets differ only in datasheet
// figures.
// - mfu 0.5: long-context prefill is large dense GEMMs plus FlashAttention, measured at about 40-55% of dense
//   bf16 peak on A100/A800; Hopper parts reach a similar share in bf16.
// - memory_bandwidth_utilization 0.7: a decode step streams the weights and the KV cache and reaches about
//   60-80% of datasheet HBM bandwidth (kernel launch gaps, small per-GPU GEMVs under tensor parallelism).
constexpr double kMfu = 0.5;
constexpr double kMemoryBandwidthUtilization = 0.7;

// Kept sorted by name. GPU figures are per GPU from NVIDIA's datasheets; dense bf16 Tensor Core FLOP/s is
// half the "with sparsity" headline figure.
const std::vector<HardwareSpec>& hardware_presets() {
  static const std::vector<HardwareSpec> kPresets = {
      // The paper's testbed (§5.1, Table 1): 8x A800-SXM4-80GB and four 200 Gbps RDMA NICs per node.
      // A800 = A100 80GB SXM silicon with NVLink capped at 400 GB/s (A100/A800 datasheets).
      {.name = "8xA800",
       .gpus = 8,
       .peak_flops_per_gpu = 312e12,         // datasheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity)
       .hbm_bytes_per_gpu = 80e9,            // datasheet: 80GB HBM2e
       .hbm_bytes_per_s_per_gpu = 2.039e12,  // datasheet: 2,039 GB/s
       .mfu = kMfu,
       .memory_bandwidth_utilization = kMemoryBandwidthUtilization,
       .host_device_bytes_per_s = 128e9,  // paper Table 1: B_h2d = 128 GB/s
       .network_bytes_per_s = 100e9},     // paper §5.1 and Table 1: 4 x 200 Gbps = 800 Gbps
      // 8x H200 SXM (H200 datasheet). Not in the paper: links assumed as for 8xH800.
      {.name = "8xH200",
       .gpus = 8,
       .peak_flops_per_gpu = 989e12,       // datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity
       .hbm_bytes_per_gpu = 141e9,         // datasheet: 141GB HBM3e
       .hbm_bytes_per_s_per_gpu = 4.8e12,  // datasheet: 4.8 TB/s
       .mfu = kMfu,
       .memory_bandwidth_utilization = kMemoryBandwidthUtilization,
       .host_device_bytes_per_s = 256e9,  // modelling choice, as 8xH800
       .network_bytes_per_s = 400e9},     // modelling choice, as 8xH800
      // 8x H800 SXM5 = H100 SXM5 silicon with NVLink capped at 400 GB/s (H100/H800 datasheets).
      {.name = "8xH800",
       .gpus = 8,
       .peak_flops_per_gpu = 989e12,        // datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity
       .hbm_bytes_per_gpu = 80e9,           // datasheet: 80GB HBM3
       .hbm_bytes_per_s_per_gpu = 3.35e12,  // datasheet: 3.35 TB/s
       .mfu = kMfu,
       .memory_bandwidth_utilization = kMemoryBandwidthUtilization,
       // Modelling choice: PCIe Gen5 doubles Gen4's rate, so twice the paper's A800 B_h2d (128 GB/s).
       .host_device_bytes_per_s = 256e9,
       // Paper §3.2.3 pairs each H800 with a 200/400 Gbps NIC; we take 400 Gbps, §5.4.1's 8 x 400 Gbps.
       .network_bytes_per_s = 400e9},
  };
  return kPresets;
}

Status check_positive(std::string_view where, std::string_view field, double value) {
  if (std::isfinite(value) && value > 0) return Status();
  return Status::invalid_argument(
      fmt::format("{}: field '{}' must be finite and > 0, got {}", where, field, value));
}

Status check_share(std::string_view where, std::string_view field, double value) {
  if (std::isfinite(value) && value > 0 && value <= 1) return Status();
  return Status::invalid_argument(
      fmt::format("{}: field '{}' must be in (0, 1], got {}", where, field, value));
}

constexpr std::array<std::string_view, 9> kHardwareFields{"name",
                                                  "gpus",
                                                  "peak_flops_per_gpu",
                                                  "hbm_bytes_per_gpu",
                                                  "hbm_bytes_per_s_per_gpu",
                                                  "mfu",
                                                  "memory_bandwidth_utilization",
                                                  "host_device_bytes_per_s",
                                                  "network_bytes_per_s"};

}  // namespace

std::span<const std::string_view> hardware_spec_fields() {
  return kHardwareFields;
}

Status validate_hardware_spec(const HardwareSpec& spec, std::string_view where) {
  if (spec.name.empty()) {
    return Status::invalid_argument(fmt::format("{}: field 'name' must not be empty", where));
  }
  if (spec.gpus < 1) {
    return Status::invalid_argument(fmt::format("{}: field 'gpus' must be >= 1, got {}", where, spec.gpus));
  }
  CRESCENT_RETURN_IF_ERROR(check_positive(where, "peak_flops_per_gpu", spec.peak_flops_per_gpu));
  CRESCENT_RETURN_IF_ERROR(check_positive(where, "hbm_bytes_per_gpu", spec.hbm_bytes_per_gpu));
  CRESCENT_RETURN_IF_ERROR(check_positive(where, "hbm_bytes_per_s_per_gpu", spec.hbm_bytes_per_s_per_gpu));
  CRESCENT_RETURN_IF_ERROR(check_share(where, "mfu", spec.mfu));
  CRESCENT_RETURN_IF_ERROR(
      check_share(where, "memory_bandwidth_utilization", spec.memory_bandwidth_utilization));
  CRESCENT_RETURN_IF_ERROR(check_positive(where, "host_device_bytes_per_s", spec.host_device_bytes_per_s));
  CRESCENT_RETURN_IF_ERROR(check_positive(where, "network_bytes_per_s", spec.network_bytes_per_s));
  return Status();
}

Result<HardwareSpec> hardware_preset(std::string_view name) {
  const auto& all = hardware_presets();
  auto it = std::find_if(all.begin(), all.end(), [&](const HardwareSpec& h) { return h.name == name; });
  if (it == all.end()) {
    return Status::not_found(fmt::format("unknown hardware preset '{}' (valid: {})", name,
                                         fmt::join(hardware_preset_names(), ", ")));
  }
  return *it;
}

std::vector<std::string> hardware_preset_names() {
  std::vector<std::string> names;
  for (const auto& h : hardware_presets()) names.push_back(h.name);
  return names;
}

Result<HardwareSpec> hardware_from_json(const nlohmann::json& j, const std::string& where) {
  if (j.is_string()) {
    auto preset = hardware_preset(j.get<std::string>());
    if (!preset.ok()) return Status::not_found(fmt::format("{}: {}", where, preset.status().message()));
    return preset;
  }
  if (!j.is_object()) {
    return Status::invalid_argument(
        fmt::format("{}: must be a hardware preset name or an object, got {}", where, j.dump()));
  }
  JsonFields f(j, where);
  auto base = spec_base<HardwareSpec>(j, where, kHardwareFields, &hardware_preset);
  if (!base.ok()) return base.status();
  HardwareSpec spec = std::move(base).value();
  CRESCENT_RETURN_IF_ERROR(f.string("name", spec.name, false));
  CRESCENT_RETURN_IF_ERROR(f.integer("gpus", spec.gpus, 1, false));
  CRESCENT_RETURN_IF_ERROR(f.positive_number("peak_flops_per_gpu", spec.peak_flops_per_gpu, false));
  CRESCENT_RETURN_IF_ERROR(f.positive_number("hbm_bytes_per_gpu", spec.hbm_bytes_per_gpu, false));
  CRESCENT_RETURN_IF_ERROR(f.positive_number("hbm_bytes_per_s_per_gpu", spec.hbm_bytes_per_s_per_gpu, false));
  CRESCENT_RETURN_IF_ERROR(f.positive_number("mfu", spec.mfu, false));
  CRESCENT_RETURN_IF_ERROR(
      f.positive_number("memory_bandwidth_utilization", spec.memory_bandwidth_utilization, false));
  CRESCENT_RETURN_IF_ERROR(f.positive_number("host_device_bytes_per_s", spec.host_device_bytes_per_s, false));
  CRESCENT_RETURN_IF_ERROR(f.positive_number("network_bytes_per_s", spec.network_bytes_per_s, false));
  CRESCENT_RETURN_IF_ERROR(validate_hardware_spec(spec, where));
  return spec;
}

}  // namespace crescent::perf
