#include "cluster/serve_options.h"

#include <fmt/format.h>

#include <filesystem>

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

}  // namespace

Result<ModelFacts> read_model_facts(const std::string& model_dir) {
  auto llama = model::read_llama_config(model_dir);
  if (!llama.ok()) return llama.status();
  auto identity = model::model_identity(model_dir);
  if (!identity.ok()) return identity.status();
  return ModelFacts{.spec = model::model_spec(*llama, std::filesystem::path(model_dir).filename().string()),
                    .identity = *identity,
                    .context_tokens = llama->max_position_embeddings};
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
