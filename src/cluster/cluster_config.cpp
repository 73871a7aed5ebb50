#include "cluster/cluster_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cmath>
#include <filesystem>

#include "common/json_util.h"
#include "common/name_table.h"
#include "perf/cost_model.h"

namespace crescent::cluster {
namespace {

constexpr NameTable<ExecutorKind, 2> kExecutors{"executor",
                                                {{
                                                    {"mock", ExecutorKind::kMock},
                                                    {"cpu", ExecutorKind::kCpu},
                                                }}};

nlohmann::json model_json(const perf::ModelSpec& m) {
  return {{"name", m.name},
          {"layers", m.layers},
          {"hidden_size", m.hidden_size},
          {"attention_heads", m.attention_heads},
          {"kv_heads", m.kv_heads},
          {"bytes_per_element", m.bytes_per_element},
          {"parameters", m.parameters}};
}

nlohmann::json hardware_json(const perf::HardwareSpec& h) {
  return {{"name", h.name},
          {"gpus", h.gpus},
          {"peak_flops_per_gpu", h.peak_flops_per_gpu},
          {"hbm_bytes_per_gpu", h.hbm_bytes_per_gpu},
          {"hbm_bytes_per_s_per_gpu", h.hbm_bytes_per_s_per_gpu},
          {"mfu", h.mfu},
          {"memory_bandwidth_utilization", h.memory_bandwidth_utilization},
          {"host_device_bytes_per_s", h.host_device_bytes_per_s},
          {"network_bytes_per_s", h.network_bytes_per_s}};
}

// Every field a config may have, and those it must have.
constexpr std::array<std::string_view, 16> kFields{"name",
                                                   "description",
                                                   "model",
                                                   "hardware",
                                                   "prefill_instances",
                                                   "decode_instances",
                                                   "prefill_cache_capacity_tokens",
                                                   "decode_hbm_reserved_share",
                                                   "decode_kv_capacity_tokens",
                                                   "prefill_chunk_tokens",
                                                   "kvcache_balancing_threshold",
                                                   "expected_output_prior_tokens",
                                                   "slo",
                                                   "seed",
                                                   "profile",
                                                   "serve"};
constexpr std::array<std::string_view, 4> kRequiredFields{"model", "hardware", "prefill_instances",
                                                          "decode_instances"};
constexpr std::array<std::string_view, 2> kSloFields{"ttft_s", "tbt_s"};
constexpr std::array<std::string_view, 20> kServeFields{"kv_bytes_scale",
                                                        "kv_transfer_timeout_s",
                                                        "heartbeat_timeout_s",
                                                        "stage_timeout_floor_s",
                                                        "stage_timeout_factor",
                                                        "max_request_placements",
                                                        "kv_event_buffer_batches",
                                                        "store_dram_bytes",
                                                        "store_ssd_bytes",
                                                        "keep_prefill_cache",
                                                        "verify_kv_checksums",
                                                        "kv_stream_layers",
                                                        "policy",
                                                        "admission",
                                                        "http_port",
                                                        "executor",
                                                        "model",
                                                        "kv_cache_bytes",
                                                        "max_model_len_tokens",
                                                        "max_request_kv_share"};

}  // namespace

Result<ExecutorKind> parse_executor(std::string_view name) {
  return kExecutors.parse(name);
}
std::string_view to_string(ExecutorKind executor) {
  return kExecutors.name(executor);
}
std::vector<std::string> executor_names() {
  return kExecutors.names();
}

std::span<const std::string_view> cluster_config_fields() {
  return kFields;
}

std::span<const std::string_view> slo_config_fields() {
  return kSloFields;
}

std::span<const std::string_view> serve_config_fields() {
  return kServeFields;
}

engine::EngineOptions prefill_engine_options(const ClusterConfig& config, int64_t block_size_tokens) {
  engine::EngineOptions options;
  options.kv_capacity_tokens = config.prefill_cache_capacity_tokens;
  options.chunk_tokens = config.prefill_chunk_tokens;
  options.prefix_cache = true;
  options.block_size_tokens = block_size_tokens;
  options.prefix_in_dram = true;
  return options;
}

engine::EngineOptions decode_engine_options(const ClusterConfig& config) {
  engine::EngineOptions options;
  options.kv_capacity_tokens = decode_kv_capacity_tokens(config);
  options.report_tokens = true;
  options.kv_transfer_timeout_s = config.serve.kv_transfer_timeout_s;
  return options;
}

conductor::ConductorOptions conductor_options(const ClusterConfig& config, conductor::PrefillPolicy policy,
                                              conductor::Admission admission, int64_t block_size_tokens) {
  return {
      .policy = policy,
      .admission = admission,
      .block_size_tokens = block_size_tokens,
      .prefill_chunk_tokens = config.prefill_chunk_tokens,
      .kvcache_balancing_threshold = config.kvcache_balancing_threshold,
      .ttft_slo_s = config.slo.ttft_s,
      .tbt_slo_s = config.slo.tbt_s.front(),
      .seed = config.seed,
      .expected_output_prior_tokens = config.expected_output_prior_tokens,
  };
}

Status validate(const ClusterConfig& config, int64_t block_size_tokens) {
  if (block_size_tokens < 1) {
    return Status::invalid_argument(fmt::format("--block-size must be >= 1, got {}", block_size_tokens));
  }
  if (config.prefill_instances < 1 || config.decode_instances < 1) {
    return Status::invalid_argument("a cluster needs at least one prefill and one decode instance");
  }
  if (config.prefill_cache_capacity_tokens < block_size_tokens) {
    return Status::invalid_argument(
        fmt::format("prefill_cache_capacity_tokens ({}) is below one block ({} tokens)",
                    config.prefill_cache_capacity_tokens, block_size_tokens));
  }
  CRESCENT_RETURN_IF_ERROR(perf::validate_model_spec(config.model, "model"));
  CRESCENT_RETURN_IF_ERROR(perf::validate_hardware_spec(config.hardware, "hardware"));
  const perf::CostModel cost = cost_model(config);
  if (config.decode_kv_capacity_tokens > 0) {
    if (config.decode_kv_capacity_tokens < block_size_tokens) {
      return Status::invalid_argument(
          fmt::format("decode_kv_capacity_tokens ({}) is below one block ({} tokens)",
                      config.decode_kv_capacity_tokens, block_size_tokens));
    }
  } else if (cost.decode_kv_capacity_tokens(config.decode_hbm_reserved_share) < block_size_tokens) {
    return Status::invalid_argument(
        fmt::format("{} weights ({:.1f} GB) leave no room for KV cache in a decode instance's HBM ({} x "
                    "{:.1f} GB, {:.0f}% "
                    "reserved)",
                    config.model.name, cost.weight_bytes() / 1e9, config.hardware.gpus,
                    config.hardware.hbm_bytes_per_gpu / 1e9, config.decode_hbm_reserved_share * 100));
  }
  return check_cost_model_times(config, cost, "");
}

Status check_cost_model_times(const ClusterConfig& config, const perf::CostModel& cost,
                              std::string_view context) {
  // No prompt or batch is longer than a decode instance's KV capacity (longer prompts are rejected).
  return cost.check_times_finite(decode_kv_capacity_tokens(config), config.prefill_chunk_tokens,
                                 fmt::format("{}{} on {} ({} times)", context, config.model.name,
                                             config.hardware.name, cost.coefficients().source));
}

Result<ClusterConfig> cluster_config_from_json(const nlohmann::json& j, const std::string& where,
                                               int64_t block_size_tokens) {
  ClusterConfig c;
  JsonFields f(j, where);
  CRESCENT_RETURN_IF_ERROR(f.no_unknown_keys(kFields));
  CRESCENT_RETURN_IF_ERROR(f.string("name", c.name, /*required=*/false));
  CRESCENT_RETURN_IF_ERROR(f.string("description", c.description, /*required=*/false));
  // What is missing at the top level, in the model and in the hardware is reported together, so one run names
  // every gap.
  std::vector<Status> problems;
  if (Status missing = f.no_missing_keys(kRequiredFields); !missing.ok()) problems.push_back(missing);
  // Parses `j[key]` with `from_json` into `out`, or records why not.
  auto parse = [&](const char* key, auto from_json, auto& out) {
    if (!j.contains(key)) return;
    auto spec = from_json(j[key], where + ": " + key);
    if (spec.ok()) {
      out = *spec;
    } else {
      problems.push_back(spec.status());
    }
  };
  parse("model", perf::model_from_json, c.model);
  parse("hardware", perf::hardware_from_json, c.hardware);
  if (problems.size() == 1) return problems.front();
  if (!problems.empty()) {
    std::vector<std::string> messages;
    for (const Status& p : problems) messages.push_back(p.message());
    return Status::invalid_argument(fmt::format("{}", fmt::join(messages, "; ")));
  }

  int64_t prefill = c.prefill_instances, decode = c.decode_instances, seed = 1;
  CRESCENT_RETURN_IF_ERROR(f.integer("prefill_instances", prefill, 1));
  CRESCENT_RETURN_IF_ERROR(f.integer("decode_instances", decode, 1));
  for (const auto& [field, value] :
       {std::pair{"prefill_instances", prefill}, std::pair{"decode_instances", decode}}) {
    if (value > 65536) {
      return Status::invalid_argument(
          fmt::format("{}: field '{}' must be <= 65536, got {}", where, field, value));
    }
  }
  c.prefill_instances = static_cast<uint32_t>(prefill);
  c.decode_instances = static_cast<uint32_t>(decode);
  CRESCENT_RETURN_IF_ERROR(f.integer("prefill_cache_capacity_tokens", c.prefill_cache_capacity_tokens,
                                     block_size_tokens, /*required=*/false));
  CRESCENT_RETURN_IF_ERROR(f.integer("prefill_chunk_tokens", c.prefill_chunk_tokens, 1, /*required=*/false));
  CRESCENT_RETURN_IF_ERROR(f.positive_number("decode_hbm_reserved_share", c.decode_hbm_reserved_share,
                                             /*required=*/false, /*allow_zero=*/true));
  if (c.decode_hbm_reserved_share >= 1) {
    return Status::invalid_argument(fmt::format("{}: field 'decode_hbm_reserved_share' must be < 1, got {}",
                                                where, c.decode_hbm_reserved_share));
  }
  CRESCENT_RETURN_IF_ERROR(f.integer("decode_kv_capacity_tokens", c.decode_kv_capacity_tokens,
                                     block_size_tokens,
                                     /*required=*/false));
  CRESCENT_RETURN_IF_ERROR(f.positive_number("kvcache_balancing_threshold", c.kvcache_balancing_threshold,
                                             /*required=*/false));
  CRESCENT_RETURN_IF_ERROR(f.positive_number("expected_output_prior_tokens", c.expected_output_prior_tokens,
                                             /*required=*/false));
  CRESCENT_RETURN_IF_ERROR(f.integer("seed", seed, 0, /*required=*/false));
  c.seed = static_cast<uint64_t>(seed);
  if (auto it = j.find("profile"); it != j.end()) {
    // A file (relative to the config's) or the profile itself.
    Result<perf::Profile> profile =
        it->is_string()
            ? perf::load_profile((std::filesystem::path(where).parent_path() / it->get<std::string>())
                                     .lexically_normal()
                                     .string())
            : perf::profile_from_json(*it, where + ": profile");
    if (!profile.ok()) return profile.status();
    c.profile = *profile;
  }

  if (auto it = j.find("slo"); it != j.end()) {
    JsonFields s(*it, where + ": slo");
    CRESCENT_RETURN_IF_ERROR(s.no_unknown_keys(kSloFields));
    CRESCENT_RETURN_IF_ERROR(s.positive_number("ttft_s", c.slo.ttft_s, /*required=*/false));
    if (auto tbt = it->find("tbt_s"); tbt != it->end()) {
      if (!tbt->is_array() || tbt->empty()) {
        return Status::invalid_argument(fmt::format(
            "{}: slo: field 'tbt_s' must be a non-empty list of seconds, got {}", where, tbt->dump()));
      }
      c.slo.tbt_s.clear();
      for (const auto& v : *tbt) {
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0) {
          return Status::invalid_argument(
              fmt::format("{}: slo: field 'tbt_s' entries must be numbers > 0, got {}", where, v.dump()));
        }
        c.slo.tbt_s.push_back(v.get<double>());
      }
    }
  }
  if (auto it = j.find("serve"); it != j.end()) {
    JsonFields s(*it, where + ": serve");
    CRESCENT_RETURN_IF_ERROR(s.no_unknown_keys(kServeFields));
    CRESCENT_RETURN_IF_ERROR(s.integer("kv_bytes_scale", c.serve.kv_bytes_scale, 1, /*required=*/false));
    CRESCENT_RETURN_IF_ERROR(
        s.positive_number("kv_transfer_timeout_s", c.serve.kv_transfer_timeout_s, /*required=*/false));
    CRESCENT_RETURN_IF_ERROR(
        s.positive_number("heartbeat_timeout_s", c.serve.heartbeat_timeout_s, /*required=*/false));
    CRESCENT_RETURN_IF_ERROR(
        s.positive_number("stage_timeout_floor_s", c.serve.stage_timeout_floor_s, /*required=*/false));
    CRESCENT_RETURN_IF_ERROR(
        s.positive_number("stage_timeout_factor", c.serve.stage_timeout_factor, /*required=*/false));
    CRESCENT_RETURN_IF_ERROR(
        s.integer("max_request_placements", c.serve.max_request_placements, 1, /*required=*/false));
    CRESCENT_RETURN_IF_ERROR(
        s.integer("kv_event_buffer_batches", c.serve.kv_event_buffer_batches, 1, /*required=*/false));
    CRESCENT_RETURN_IF_ERROR(
        s.integer("store_dram_bytes", c.serve.store_dram_bytes, 1 << 20, /*required=*/false));
    CRESCENT_RETURN_IF_ERROR(s.integer("store_ssd_bytes", c.serve.store_ssd_bytes, 0, /*required=*/false));
    for (const auto& [field, out] : {std::pair{"verify_kv_checksums", &c.serve.verify_kv_checksums},
                                     std::pair{"kv_stream_layers", &c.serve.kv_stream_layers},
                                     std::pair{"keep_prefill_cache", &c.serve.keep_prefill_cache}}) {
      auto v = it->find(field);
      if (v == it->end()) continue;
      if (!v->is_boolean()) {
        return Status::invalid_argument(
            fmt::format("{}: serve: field '{}' must be true or false, got {}", where, field, v->dump()));
      }
      *out = v->get<bool>();
    }
    // A name field parsed into its enum by `parse`: errors name the field and list the valid names.
    auto named = [&](const char* field, auto parse, auto& out) -> Status {
      std::string name;
      CRESCENT_RETURN_IF_ERROR(s.string(field, name, /*required=*/false));
      if (!it->contains(field)) return Status();
      auto value = parse(name);
      if (!value.ok()) {
        return Status::invalid_argument(
            fmt::format("{}: serve: field '{}': {}", where, field, value.status().message()));
      }
      out = *value;
      return Status();
    };
    CRESCENT_RETURN_IF_ERROR(named("policy", conductor::parse_prefill_policy, c.serve.policy));
    CRESCENT_RETURN_IF_ERROR(named("admission", conductor::parse_admission, c.serve.admission));
    CRESCENT_RETURN_IF_ERROR(s.integer("http_port", c.serve.http_port, 0, /*required=*/false));
    if (c.serve.http_port > 65535) {
      return Status::invalid_argument(
          fmt::format("{}: serve: field 'http_port' must be <= 65535, got {}", where, c.serve.http_port));
    }
    CRESCENT_RETURN_IF_ERROR(named("executor", parse_executor, c.serve.executor));
    CRESCENT_RETURN_IF_ERROR(s.string("model", c.serve.model_dir, /*required=*/false));
    CRESCENT_RETURN_IF_ERROR(
        s.integer("kv_cache_bytes", c.serve.kv_cache_bytes, 1 << 20, /*required=*/false));
    CRESCENT_RETURN_IF_ERROR(
        s.integer("max_model_len_tokens", c.serve.max_model_len_tokens, 0, /*required=*/false));
    CRESCENT_RETURN_IF_ERROR(
        s.positive_number("max_request_kv_share", c.serve.max_request_kv_share, /*required=*/false));
    if (c.serve.max_request_kv_share > 1) {
      return Status::invalid_argument(
          fmt::format("{}: serve: field 'max_request_kv_share' must be <= 1, got {}", where,
                      c.serve.max_request_kv_share));
    }
  }
  return c;
}

Result<ClusterConfig> load_cluster_config(const std::string& path, int64_t block_size_tokens) {
  auto j = read_json_file(path);
  if (!j.ok()) return j.status();
  auto config = cluster_config_from_json(*j, path, block_size_tokens);
  if (config.ok() && config->name.empty()) config->name = std::filesystem::path(path).stem().string();
  return config;
}

nlohmann::json to_json(const ClusterConfig& c) {
  nlohmann::json j = {
      {"name", c.name},
      {"description", c.description},
      {"model", model_json(c.model)},
      {"hardware", hardware_json(c.hardware)},
      {"prefill_instances", c.prefill_instances},
      {"decode_instances", c.decode_instances},
      {"prefill_cache_capacity_tokens", c.prefill_cache_capacity_tokens},
      {"decode_hbm_reserved_share", c.decode_hbm_reserved_share},
      {"prefill_chunk_tokens", c.prefill_chunk_tokens},
      {"kvcache_balancing_threshold", c.kvcache_balancing_threshold},
      {"expected_output_prior_tokens", c.expected_output_prior_tokens},
      {"slo", {{"ttft_s", c.slo.ttft_s}, {"tbt_s", c.slo.tbt_s}}},
      {"seed", c.seed},
  };
  if (c.decode_kv_capacity_tokens > 0) j["decode_kv_capacity_tokens"] = c.decode_kv_capacity_tokens;
  if (c.profile) j["profile"] = perf::to_json(*c.profile);
  return j;
}

int64_t decode_kv_capacity_tokens(const ClusterConfig& config) {
  if (config.decode_kv_capacity_tokens > 0) return config.decode_kv_capacity_tokens;
  return cost_model(config).decode_kv_capacity_tokens(config.decode_hbm_reserved_share);
}

perf::CostModel cost_model(const ClusterConfig& config) {
  return perf::CostModel(config.model, config.hardware, config.profile ? &*config.profile : nullptr);
}

}  // namespace crescent::cluster
