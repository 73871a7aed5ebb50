// The shape of a served LLM as the cost model sees it (paper §2.2, Table 1), named presets and JSON loading.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace crescent::perf {

/// A decoder-only transformer with grouped-query attention. Fields follow Hugging Face's config.json (its
/// name in parentheses where ours differs); the paper's Table 1 calls them l, d, s and
/// gqa = attention_heads / kv_heads.
struct ModelSpec {
  std::string name;
  int64_t layers = 0;             // l (num_hidden_layers)
  int64_t hidden_size = 0;        // d, model dimension
  int64_t attention_heads = 0;    // query heads (num_attention_heads)
  int64_t kv_heads = 0;           // key/value heads (num_key_value_heads)
  int64_t bytes_per_element = 0;  // s, bytes per weight and per KV element: 2 for bf16
  double parameters = 0;          // total weight count, embeddings and LM head included
};

/// Ok when every count is >= 1, `kv_heads` divides `attention_heads`, `attention_heads` divides `hidden_size`
/// and `parameters` is finite and > 0. Errors (kInvalidArgument) name `where` and the field.
Status validate_model_spec(const ModelSpec& spec, std::string_view where);

/// KV cache bytes one token takes across all layers: layers x 2 (K and V) x kv_heads x head_dim x
/// bytes_per_element (paper §2.2). REQUIRES: validate_model_spec(model) is ok.
int64_t kv_bytes_per_token(const ModelSpec& model);

/// The preset called `name`. Errors: kNotFound listing the valid names.
Result<ModelSpec> model_preset(std::string_view name);

/// Names of the presets, sorted.
std::vector<std::string> model_preset_names();

/// The JSON field names of a ModelSpec, in declaration order (what model_from_json reads).
std::span<const std::string_view> model_spec_fields();

/// A model from config JSON, one of:
///   a preset name: "llama3-70b";
///   an object with every field of ModelSpec;
///   {"preset": name, <field>: value, ...}: the preset with some fields overridden; unless "name" is given,
///   the name then says so ("llama3-70b with layers=40", see preset_override_name).
/// The result is validated. Errors (kInvalidArgument; kNotFound for an unknown preset) name `where` and the
/// field, unknown fields included; every missing field of a full object is named at once.
Result<ModelSpec> model_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace crescent::perf
