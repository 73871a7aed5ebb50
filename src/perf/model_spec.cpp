#include "perf/model_spec.h"

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

// Shapes are copied from each model's Hugging Face config.json. `parameters` sums the weight shapes that
// config implies (d = hidden_size, f = intermediate_size, h = num_attention_heads, V = vocab_size):
//   layers * (2*d^2 [q, o] + 2*d*kv_heads*(d/h) [k, v] + 3*d*f [gate, up, down] + 2*d [norms])
//   + 2*V*d [untied embedding and LM head] + d [final norm],
// which rounds to the size shown on the model's Hugging Face page. Kept sorted by name.
const std::vector<ModelSpec>& model_presets() {
  static const std::vector<ModelSpec> kPresets = {
      // meta-llama/Llama-2-70b-hf config.json (vocab_size 32000, torch_dtype float16: 2 bytes like bf16);
      // model card: "70B" (Hugging Face page: 69B params).
      {.name = "llama2-70b",
       .layers = 80,
       .hidden_size = 8192,
       .attention_heads = 64,
       .kv_heads = 8,
       .bytes_per_element = 2,
       .parameters = 68'976'648'192.0},
      // meta-llama/Meta-Llama-3-70B config.json (vocab_size 128256, torch_dtype bfloat16);
      // Hugging Face page: 70.6B params. Paper Table 1 uses the same l, d, gqa and s.
      {.name = "llama3-70b",
       .layers = 80,
       .hidden_size = 8192,
       .attention_heads = 64,
       .kv_heads = 8,
       .bytes_per_element = 2,
       .parameters = 70'553'706'496.0},
      // meta-llama/Meta-Llama-3-8B config.json (vocab_size 128256, torch_dtype bfloat16);
      // Hugging Face page: 8.03B params.
      {.name = "llama3-8b",
       .layers = 32,
       .hidden_size = 4096,
       .attention_heads = 32,
       .kv_heads = 8,
       .bytes_per_element = 2,
       .parameters = 8'030'261'248.0},
  };
  return kPresets;
}

Status check_count(std::string_view where, std::string_view field, int64_t value) {
  if (value >= 1) return Status();
  return Status::invalid_argument(fmt::format("{}: field '{}' must be >= 1, got {}", where, field, value));
}

constexpr std::array<std::string_view, 7> kModelFields{
    "name", "layers", "hidden_size", "attention_heads", "kv_heads", "bytes_per_element", "parameters"};

}  // namespace

std::span<const std::string_view> model_spec_fields() {
  return kModelFields;
}

Status validate_model_spec(const ModelSpec& spec, std::string_view where) {
  if (spec.name.empty()) {
    return Status::invalid_argument(fmt::format("{}: field 'name' must not be empty", where));
  }
  CRESCENT_RETURN_IF_ERROR(check_count(where, "layers", spec.layers));
  CRESCENT_RETURN_IF_ERROR(check_count(where, "hidden_size", spec.hidden_size));
  CRESCENT_RETURN_IF_ERROR(check_count(where, "attention_heads", spec.attention_heads));
  CRESCENT_RETURN_IF_ERROR(check_count(where, "kv_heads", spec.kv_heads));
  CRESCENT_RETURN_IF_ERROR(check_count(where, "bytes_per_element", spec.bytes_per_element));
  if (spec.attention_heads % spec.kv_heads != 0) {
    return Status::invalid_argument(
        fmt::format("{}: field 'kv_heads' must divide 'attention_heads' ({}), got {}", where,
                    spec.attention_heads, spec.kv_heads));
  }
  if (spec.hidden_size % spec.attention_heads != 0) {
    return Status::invalid_argument(
        fmt::format("{}: field 'hidden_size' must be a multiple of 'attention_heads' ({}), got {}", where,
                    spec.attention_heads, spec.hidden_size));
  }
  if (!std::isfinite(spec.parameters) || spec.parameters <= 0) {
    return Status::invalid_argument(
        fmt::format("{}: field 'parameters' must be finite and > 0, got {}", where, spec.parameters));
  }
  return Status();
}

int64_t kv_bytes_per_token(const ModelSpec& model) {
  // hidden_size / gqa = kv_heads * head_dim, exact in integers since attention_heads divides hidden_size.
  const int64_t kv_width = model.kv_heads * (model.hidden_size / model.attention_heads);
  return model.layers * 2 * kv_width * model.bytes_per_element;
}

Result<ModelSpec> model_preset(std::string_view name) {
  const auto& all = model_presets();
  auto it = std::find_if(all.begin(), all.end(), [&](const ModelSpec& m) { return m.name == name; });
  if (it == all.end()) {
    return Status::not_found(
        fmt::format("unknown model preset '{}' (valid: {})", name, fmt::join(model_preset_names(), ", ")));
  }
  return *it;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& m : model_presets()) names.push_back(m.name);
  return names;
}

Result<ModelSpec> model_from_json(const nlohmann::json& j, const std::string& where) {
  if (j.is_string()) {
    auto preset = model_preset(j.get<std::string>());
    if (!preset.ok()) return Status::not_found(fmt::format("{}: {}", where, preset.status().message()));
    return preset;
  }
  if (!j.is_object()) {
    return Status::invalid_argument(
        fmt::format("{}: must be a model preset name or an object, got {}", where, j.dump()));
  }
  JsonFields f(j, where);
  if (j.contains("ffn_size")) {  // read by earlier versions, never used by the cost model
    return Status::invalid_argument(
        fmt::format("{}: field 'ffn_size' is no longer read (the cost model counts the MLP through "
                    "'parameters'): remove it",
                    where));
  }
  auto base = spec_base<ModelSpec>(j, where, kModelFields, &model_preset);
  if (!base.ok()) return base.status();
  ModelSpec spec = std::move(base).value();
  CRESCENT_RETURN_IF_ERROR(f.string("name", spec.name, false));
  CRESCENT_RETURN_IF_ERROR(f.integer("layers", spec.layers, 1, false));
  CRESCENT_RETURN_IF_ERROR(f.integer("hidden_size", spec.hidden_size, 1, false));
  CRESCENT_RETURN_IF_ERROR(f.integer("attention_heads", spec.attention_heads, 1, false));
  CRESCENT_RETURN_IF_ERROR(f.integer("kv_heads", spec.kv_heads, 1, false));
  CRESCENT_RETURN_IF_ERROR(f.integer("bytes_per_element", spec.bytes_per_element, 1, false));
  CRESCENT_RETURN_IF_ERROR(f.positive_number("parameters", spec.parameters, false));
  CRESCENT_RETURN_IF_ERROR(validate_model_spec(spec, where));
  return spec;
}

}  // namespace crescent::perf
