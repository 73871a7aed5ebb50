// Llama-architecture models in the format people have (issue 11): a directory with Hugging Face's
// config.json and model.safetensors. What the config says, the tensors it implies (HF's names and shapes),
// writing seeded random weights for tests and benchmarks (no weights can be downloaded here), and reading a
// directory back with every tensor checked against the config.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/safetensors.h"
#include "perf/model_spec.h"

namespace crescent::model {

/// A Llama model as config.json describes it (the fields crescent reads; others are ignored, as
/// transformers' own loader does).
struct LlamaConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // d
  int64_t intermediate_size = 0;  // the SwiGLU MLP's inner width
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;         // grouped-query attention: divides num_attention_heads
  int64_t max_position_embeddings = 2048;  // the longest prompt + output, tokens
  double rope_theta = 10000;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;  // the LM head is the embedding matrix
  DType dtype = DType::kF32;         // torch_dtype: "float32" or "bfloat16"

  /// hidden_size / num_attention_heads.
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  /// Weights, embeddings and LM head included.
  int64_t parameters() const;
  /// KV cache bytes per token: 2 (K and V) x layers x KV heads x head_dim x element size, as
  /// perf::CostModel::kv_bytes_per_token computes for model_spec() of this config.
  int64_t kv_bytes_per_token() const;
};

/// Reads config.json's object. Required: vocab_size, hidden_size, intermediate_size, num_hidden_layers,
/// num_attention_heads; optional: num_key_value_heads (default: attention heads), max_position_embeddings,
/// rope_theta, rms_norm_eps, tie_word_embeddings, torch_dtype, head_dim (must be hidden / heads),
/// model_type (must be "llama"), hidden_act (must be "silu"). Errors (kInvalidArgument) name `where` and the
/// field: every missing field at once, counts < 1, heads that do not divide, unsupported values.
Result<LlamaConfig> llama_config_from_json(const nlohmann::json& j, const std::string& where);
/// config.json's object for `config` (with "architectures" and "model_type", as transformers writes it).
nlohmann::json to_json(const LlamaConfig& config);

/// The presets of `crescent model init`: "tiny" (2 layers, d = 64: for tests) and "small" (about 100M
/// parameters: for benchmarks); both use the byte-level tokenizer's 256-token vocabulary. Errors: kNotFound
/// listing the names.
Result<LlamaConfig> llama_preset(std::string_view name);
/// The presets' names.
std::vector<std::string> llama_preset_names();

/// The cost model's view of `config` (perf::ModelSpec), named `name`.
perf::ModelSpec model_spec(const LlamaConfig& config, const std::string& name);

/// A tensor a model must have.
struct TensorSpec {
  std::string name;            // Hugging Face's: "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // [out, in] for a linear layer's weight
};
/// Every tensor of a model of `config`, in HF's order: embed_tokens, per layer input_layernorm, q/k/v/o_proj,
/// post_attention_layernorm, gate/up/down_proj, then model.norm and (unless tied) lm_head.
std::vector<TensorSpec> llama_tensor_specs(const LlamaConfig& config);

/// Writes DIR/config.json and DIR/model.safetensors for `config` with random weights from `seed`: the same
/// seed gives the same bytes on any machine (mt19937_64, uniform with standard deviation 0.02 for matrices,
/// norms 1). Creates DIR. Errors: kIoError naming the path.
Status init_llama_model(const LlamaConfig& config, uint64_t seed, const std::string& dir);

/// Reads DIR/config.json (llama_config_from_json). Errors: kNotFound, or the parser's naming the file.
Result<LlamaConfig> read_llama_config(const std::string& dir);

/// The identity of the model in DIR: xxh3-64 of config.json's bytes then model.safetensors's. KV computed by
/// one model is meaningless to another, so block keys are seeded with it (prompt_block_keys): blocks of
/// different models never match in a cache or the pool. Errors: kNotFound naming a missing file.
Result<uint64_t> model_identity(const std::string& dir);

/// A model directory read and checked.
struct LlamaModel {
  LlamaConfig config;
  SafetensorsFile weights;
  uint64_t identity = 0;  // model_identity()
};
/// Reads DIR/config.json and DIR/model.safetensors and checks every tensor llama_tensor_specs names: present,
/// of that shape, of config.dtype. Errors (kNotFound for a missing file, else kInvalidArgument) name the file
/// and the tensor: "model.safetensors: tensor \"model.layers.1.mlp.up_proj.weight\" is missing", "... has
/// shape [64, 32], the config needs [128, 64]", "... is F32, the config says BF16", or the safetensors
/// reader's own.
Result<LlamaModel> load_llama_model(const std::string& dir);

}  // namespace crescent::model
