#include "cluster/serve_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/llama.h"

namespace crescent::cluster {
namespace {

// `value` parsed by `parse` when the flag was given; the flag named in the error.
template <typename Enum, typename Parse>
Status override_with(const std::string& flag, const std::string& value, Parse parse, Enum& out) {
  if (value.empty()) return Status();
  auto parsed = parse(value);
  if (!parsed.ok()) return Status::invalid_argument(fmt::format("{}: {}", flag, parsed.status().message()));
  out = *parsed;
  return Status();
}

// MemAvailable of /proc/meminfo, bytes (0 when unknown).
int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string name;
    int64_t kib = 0;
    if (fields >> name >> kib && name == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

std::string gib(int64_t bytes) {
  return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30));
}

// With the cpu executor: the KV cache budget per instance bounds the config's capacities (docs/config.md,
// serve.kv_cache_bytes). What each instance holds (serve/instance_server.cpp): a decode instance its batch's
// KV and a receive buffer as large, each with a block of rounding per request (kDecodeRoundingBlocks); a
// prefill instance its prefix cache and the prompt it computes, and a staging copy of that prompt, a block
// more each.
Status apply_kv_cache_budget(ClusterConfig& config, const ModelFacts& model, const ServeOverrides& overrides,
                             std::string& note) {
  int64_t budget = overrides.kv_cache_bytes > 0 ? overrides.kv_cache_bytes : config.serve.kv_cache_bytes;
  std::string source = overrides.kv_cache_bytes > 0 ? "--kv-cache-bytes" : "serve.kv_cache_bytes";
  if (budget == 0) {
    const int64_t available = available_memory_bytes();
    if (available == 0) {
      return Status::invalid_argument(
          "cannot read this machine's available memory (/proc/meminfo): give --kv-cache-bytes");
    }
    const int64_t instances = overrides.all_instances_on_this_machine
                                  ? int64_t{config.prefill_instances} + config.decode_instances
                                  : 1;
    budget = available / 2 / instances - model.weight_bytes;
    source = fmt::format(
        "half of the {} available on this machine, shared by {} instance{}, less {} of weights each; "
        "--kv-cache-bytes overrides",
        gib(available), instances, instances == 1 ? "" : "s", gib(model.weight_bytes));
  }
  const double bytes_per_token = cost_model(config).kv_bytes_per_token();
  const int64_t block = overrides.block_size_tokens;
  const int64_t budget_tokens =
      budget > 0 ? static_cast<int64_t>(static_cast<double>(budget) / bytes_per_token) : 0;
  const int64_t rounding_tokens = kDecodeRoundingBlocks * block;
  const int64_t decode_tokens = (budget_tokens - 2 * rounding_tokens) / 2;
  const int64_t context = model.context_tokens;
  if (decode_tokens < context) {
    const int64_t needed_tokens = 2 * (context + rounding_tokens);
    return Status::invalid_argument(fmt::format(
        "a KV cache budget of {} bytes per instance ({}) holds {} tokens of {} KV ({:.0f} bytes per token); "
        "a "
        "decode instance needs {} tokens: one request of the model's context of {} tokens, as much again to "
        "receive it, and a block of rounding for up to {} requests in each. Give --kv-cache-bytes {} or more",
        budget, source, std::max<int64_t>(budget_tokens, 0), config.model.name, bytes_per_token,
        needed_tokens, context, kDecodeRoundingBlocks,
        static_cast<int64_t>(std::ceil(static_cast<double>(needed_tokens) * bytes_per_token))));
  }
  config.decode_kv_capacity_tokens = std::min(decode_kv_capacity_tokens(config), decode_tokens);
  const int64_t prompt_tokens = std::min(context, config.decode_kv_capacity_tokens);
  const int64_t prefill_tokens = budget_tokens - 2 * (prompt_tokens + block);
  if (prefill_tokens < block) {
    return Status::invalid_argument(fmt::format(
        "a KV cache budget of {} bytes per instance ({}) holds {} tokens of KV: a prefill instance needs two "
        "prompts of {} tokens and a block of prefix cache. Give a larger --kv-cache-bytes",
        budget, source, budget_tokens, prompt_tokens));
  }
  config.prefill_cache_capacity_tokens = std::min(config.prefill_cache_capacity_tokens, prefill_tokens);
  config.serve.kv_cache_bytes = budget;
  note = fmt::format("KV cache {} per instance ({}): decode {} tokens, prefill cache {} tokens", gib(budget),
                     source, config.decode_kv_capacity_tokens, config.prefill_cache_capacity_tokens);
  return Status();
}

}  // namespace

Result<ModelFacts> read_model_facts(const std::string& model_dir) {
  auto llama = model::read_llama_config(model_dir);
  if (!llama.ok()) return llama.status();
  auto identity = model::model_identity(model_dir);
  if (!identity.ok()) return identity.status();
  return ModelFacts{.spec = model::model_spec(*llama, std::filesystem::path(model_dir).filename().string()),
                    .identity = *identity,
                    .context_tokens = llama->max_position_embeddings,
                    .weight_bytes = llama->parameters() * 4};
}

Result<ServeSetup> resolve_serve_options(ClusterConfig config, const std::string& config_path,
                                         const ServeOverrides& overrides) {
  if (overrides.block_size_tokens < 1) return Status::invalid_argument("--block-size must be >= 1");
  ServeConfig& serve = config.serve;
  CRESCENT_RETURN_IF_ERROR(
      override_with("--policy", overrides.policy, conductor::parse_prefill_policy, serve.policy));
  CRESCENT_RETURN_IF_ERROR(
      override_with("--admission", overrides.admission, conductor::parse_admission, serve.admission));
  CRESCENT_RETURN_IF_ERROR(override_with("--executor", overrides.executor, parse_executor, serve.executor));
  if (!overrides.model_dir.empty()) {
    serve.model_dir = std::filesystem::absolute(overrides.model_dir).string();
  } else if (!serve.model_dir.empty()) {  // relative to the config file
    serve.model_dir =
        (std::filesystem::absolute(config_path).parent_path() / serve.model_dir).lexically_normal().string();
  }
  ServeSetup s;
  if (serve.executor == ExecutorKind::kCpu) {
    if (serve.model_dir.empty()) {
      return Status::invalid_argument(
          "--executor cpu needs a model: --model DIR (a directory `crescent model init` writes) or the "
          "config's serve.model");
    }
    auto facts = read_model_facts(serve.model_dir);
    if (!facts.ok()) return facts.status();
    // The model replaces the config's: its KV bytes per token are what moves.
    config.model = facts->spec;
    s.cluster.block_key_seed = facts->identity;
    s.cluster.model_context_tokens = facts->context_tokens;
    CRESCENT_RETURN_IF_ERROR(apply_kv_cache_budget(config, *facts, overrides, s.kv_cache_note));
  }
  s.port = overrides.port >= 0 ? overrides.port : static_cast<int>(serve.http_port);
  s.config_path = std::filesystem::absolute(config_path).string();
  s.cluster.block_size_tokens = overrides.block_size_tokens;
  s.cluster.model_name = !overrides.model_name.empty() ? overrides.model_name
                         : serve.executor == ExecutorKind::kCpu
                             ? std::filesystem::path(serve.model_dir).filename().string()
                             : "mock";
  s.cluster.config = std::move(config);
  return s;
}

}  // namespace crescent::cluster
