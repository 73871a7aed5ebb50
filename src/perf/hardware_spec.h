// The hardware of one serving instance (an 8-GPU node in the paper, §5.1), named presets and JSON loading.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace crescent::perf {

/// One instance: `gpus` identical GPUs serving one model replica (tensor parallel), plus the node's links.
/// Peak and bandwidth figures are datasheet values; `mfu` and `memory_bandwidth_utilization` turn them into
/// what prefill and decode achieve. Bytes are decimal (1 GB = 1e9 B).
struct HardwareSpec {
  std::string name;
  int64_t gpus = 0;
  double peak_flops_per_gpu = 0;            // dense bf16 tensor FLOP/s
  double hbm_bytes_per_gpu = 0;             // HBM capacity
  double hbm_bytes_per_s_per_gpu = 0;       // HBM bandwidth
  double mfu = 0;                           // achieved share of peak FLOP/s, in (0, 1]
  double memory_bandwidth_utilization = 0;  // achieved share of HBM bandwidth in decode, in (0, 1]
  double host_device_bytes_per_s = 0;       // CPU DRAM <-> HBM over PCIe, whole instance (paper's B_h2d)
  double network_bytes_per_s = 0;           // RDMA NICs, whole instance (paper's B_nic)
};

/// Ok when `gpus` >= 1, every FLOP/s, byte and byte/s figure is finite and > 0, and `mfu` and
/// `memory_bandwidth_utilization` are in (0, 1]. Errors (kInvalidArgument) name `where` and the field.
Status validate_hardware_spec(const HardwareSpec& spec, std::string_view where);

/// The preset called `name`. Errors: kNotFound listing the valid names.
Result<HardwareSpec> hardware_preset(std::string_view name);

/// Names of the presets, sorted.
std::vector<std::string> hardware_preset_names();

/// The JSON field names of a HardwareSpec, in declaration order (what hardware_from_json reads).
std::span<const std::string_view> hardware_spec_fields();

/// Hardware from config JSON, one of:
///   a preset name: "8xA800";
///   an object with every field of HardwareSpec;
///   {"preset": name, <field>: value, ...}: the preset with some fields overridden; unless "name" is given,
///   the name then says so ("8xA800 with gpus=4", see preset_override_name), so reports name what ran.
/// The result is validated. Errors (kInvalidArgument; kNotFound for an unknown preset) name `where` and the
/// field, unknown fields included; every missing field of a full object is named at once.
Result<HardwareSpec> hardware_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace crescent::perf
