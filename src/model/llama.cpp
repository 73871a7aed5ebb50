#include "model/llama.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/atomic_file.h"
#include "common/json_util.h"
#include "model/bf16.h"

namespace crescent::model {
namespace {

using nlohmann::json;

constexpr std::string_view kConfigFile = "config.json";
constexpr std::string_view kWeightsFile = "model.safetensors";
constexpr double kInitStd = 0.02;

bool is_norm(const std::string& name) {
  return name.ends_with("layernorm.weight") || name == "model.norm.weight";
}

}  // namespace

int64_t LlamaConfig::parameters() const {
  int64_t n = 0;
  for (const TensorSpec& t : llama_tensor_specs(*this)) {
    int64_t elements = 1;
    for (int64_t d : t.shape) elements *= d;
    n += elements;
  }
  return n;
}

int64_t LlamaConfig::kv_bytes_per_token() const {
  return 2 * num_hidden_layers * num_key_value_heads * head_dim() * static_cast<int64_t>(dtype_bytes(dtype));
}

Result<LlamaConfig> llama_config_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) return Status::invalid_argument(fmt::format("{}: not a JSON object", where));
  const JsonFields f(j, where);
  CRESCENT_RETURN_IF_ERROR(f.no_missing_keys(
      {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}));
  LlamaConfig c;
  CRESCENT_RETURN_IF_ERROR(f.integer("vocab_size", c.vocab_size, 1));
  CRESCENT_RETURN_IF_ERROR(f.integer("hidden_size", c.hidden_size, 1));
  CRESCENT_RETURN_IF_ERROR(f.integer("intermediate_size", c.intermediate_size, 1));
  CRESCENT_RETURN_IF_ERROR(f.integer("num_hidden_layers", c.num_hidden_layers, 1));
  CRESCENT_RETURN_IF_ERROR(f.integer("num_attention_heads", c.num_attention_heads, 1));
  c.num_key_value_heads = c.num_attention_heads;
  CRESCENT_RETURN_IF_ERROR(f.integer("num_key_value_heads", c.num_key_value_heads, 1, /*required=*/false));
  CRESCENT_RETURN_IF_ERROR(f.integer("max_position_embeddings", c.max_position_embeddings, 1, false));
  CRESCENT_RETURN_IF_ERROR(f.positive_number("rope_theta", c.rope_theta, false));
  CRESCENT_RETURN_IF_ERROR(f.positive_number("rms_norm_eps", c.rms_norm_eps, false));
  const auto bad = [&](const std::string& what) {
    return Status::invalid_argument(fmt::format("{}: {}", where, what));
  };
  if (auto tie = j.find("tie_word_embeddings"); tie != j.end()) {
    if (!tie->is_boolean()) return bad("'tie_word_embeddings' must be true or false");
    c.tie_word_embeddings = tie->get<bool>();
  }
  std::string text;
  CRESCENT_RETURN_IF_ERROR(f.string("torch_dtype", text, false));
  if (!text.empty() && text != "float32" && text != "bfloat16") {
    return bad(fmt::format("'torch_dtype' \"{}\" is not supported (float32, bfloat16)", text));
  }
  c.dtype = text == "bfloat16" ? DType::kBF16 : DType::kF32;
  text.clear();
  CRESCENT_RETURN_IF_ERROR(f.string("model_type", text, false));
  if (!text.empty() && text != "llama") return bad(fmt::format("'model_type' \"{}\" is not \"llama\"", text));
  text.clear();
  CRESCENT_RETURN_IF_ERROR(f.string("hidden_act", text, false));
  if (!text.empty() && text != "silu") return bad(fmt::format("'hidden_act' \"{}\" is not \"silu\"", text));
  if (c.hidden_size % c.num_attention_heads != 0) {
    return bad(fmt::format("'num_attention_heads' {} does not divide 'hidden_size' {}", c.num_attention_heads,
                           c.hidden_size));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return bad(fmt::format("'num_key_value_heads' {} does not divide 'num_attention_heads' {}",
                           c.num_key_value_heads, c.num_attention_heads));
  }
  int64_t head_dim = c.head_dim();
  CRESCENT_RETURN_IF_ERROR(f.integer("head_dim", head_dim, 1, false));
  if (head_dim != c.head_dim()) {
    return bad(fmt::format("'head_dim' {} is not hidden_size / num_attention_heads = {} (not supported)",
                           head_dim, c.head_dim()));
  }
  if (c.head_dim() % 2 != 0)
    return bad(fmt::format("head_dim {} is odd: rotary embedding needs pairs", c.head_dim()));
  return c;
}

json to_json(const LlamaConfig& c) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_act", "silu"},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"max_position_embeddings", c.max_position_embeddings},
          {"rope_theta", c.rope_theta},
          {"rms_norm_eps", c.rms_norm_eps},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"torch_dtype", c.dtype == DType::kBF16 ? "bfloat16" : "float32"}};
}

// The presets, sorted by name; both use the byte-level tokenizer's 256 tokens.
struct Preset {
  std::string_view name;
  int64_t hidden, intermediate, layers, heads, kv_heads, context;
};
constexpr std::array<Preset, 2> kPresets{{
    {"small", 768, 2048, 16, 12, 4, 8192},  // about 100M parameters: benchmarks
    {"tiny", 64, 128, 2, 4, 2, 4096},       // tests
}};

Result<LlamaConfig> llama_preset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (p.name != name) continue;
    LlamaConfig c;
    c.vocab_size = 256;
    c.hidden_size = p.hidden;
    c.intermediate_size = p.intermediate;
    c.num_hidden_layers = p.layers;
    c.num_attention_heads = p.heads;
    c.num_key_value_heads = p.kv_heads;
    c.max_position_embeddings = p.context;
    return c;
  }
  return Status::not_found(
      fmt::format("no model preset \"{}\" (presets: {})", name, fmt::join(llama_preset_names(), ", ")));
}

std::vector<std::string> llama_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

perf::ModelSpec model_spec(const LlamaConfig& c, const std::string& name) {
  perf::ModelSpec m;
  m.name = name;
  m.layers = c.num_hidden_layers;
  m.hidden_size = c.hidden_size;
  m.attention_heads = c.num_attention_heads;
  m.kv_heads = c.num_key_value_heads;
  m.bytes_per_element = static_cast<int64_t>(dtype_bytes(c.dtype));
  m.parameters = static_cast<double>(c.parameters());
  return m;
}

std::vector<TensorSpec> llama_tensor_specs(const LlamaConfig& c) {
  const int64_t d = c.hidden_size, kv = c.num_key_value_heads * c.head_dim();
  std::vector<TensorSpec> specs{{"model.embed_tokens.weight", {c.vocab_size, d}}};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    specs.push_back({p + "input_layernorm.weight", {d}});
    specs.push_back({p + "self_attn.q_proj.weight", {d, d}});
    specs.push_back({p + "self_attn.k_proj.weight", {kv, d}});
    specs.push_back({p + "self_attn.v_proj.weight", {kv, d}});
    specs.push_back({p + "self_attn.o_proj.weight", {d, d}});
    specs.push_back({p + "post_attention_layernorm.weight", {d}});
    specs.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, d}});
    specs.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, d}});
    specs.push_back({p + "mlp.down_proj.weight", {d, c.intermediate_size}});
  }
  specs.push_back({"model.norm.weight", {d}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, d}});
  return specs;
}

Status init_llama_model(const LlamaConfig& config, uint64_t seed, const std::string& dir) {
  CRESCENT_RETURN_IF_ERROR(ensure_writable_directory(dir));
  std::mt19937_64 rng(seed);
  // Uniform on [-a, a] has standard deviation a / sqrt(3). Built from the generator's raw bits (its output is
  // fixed by the standard; std's distributions are not).
  const double a = kInitStd * std::sqrt(3.0);
  const std::vector<TensorSpec> specs = llama_tensor_specs(config);
  std::vector<std::vector<std::byte>> data(specs.size());
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t elements = 1;
    for (int64_t dim : specs[i].shape) elements *= dim;
    data[i].resize(static_cast<size_t>(elements) * dtype_bytes(config.dtype));
    const bool norm = is_norm(specs[i].name);
    for (int64_t e = 0; e < elements; ++e) {
      const double unit = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1)
      const auto value = norm ? 1.0f : static_cast<float>((2 * unit - 1) * a);
      if (config.dtype == DType::kF32) {
        std::memcpy(data[i].data() + e * 4, &value, 4);
      } else {
        const uint16_t half = to_bf16(value);
        std::memcpy(data[i].data() + e * 2, &half, 2);
      }
    }
    tensors.push_back(
        {.name = specs[i].name, .dtype = config.dtype, .shape = specs[i].shape, .data = data[i]});
  }
  const std::filesystem::path root(dir);
  CRESCENT_RETURN_IF_ERROR(write_safetensors((root / kWeightsFile).string(), tensors,
                                             {{"format", "pt"}, {"seed", std::to_string(seed)}}));
  return write_file_atomically((root / kConfigFile).string(), to_json(config).dump(2) + "\n");
}

Result<LlamaConfig> read_llama_config(const std::string& dir) {
  const std::string config_path = (std::filesystem::path(dir) / kConfigFile).string();
  auto j = read_json_file(config_path);
  if (!j.ok()) return j.status();
  return llama_config_from_json(*j, config_path);
}

Result<uint64_t> model_identity(const std::string& dir) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buffer(1 << 20);
  for (const std::string_view name : {kConfigFile, kWeightsFile}) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      XXH3_freeState(state);
      return Status::not_found(fmt::format("cannot open '{}'", path));
    }
    while (in) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      XXH3_64bits_update(state, buffer.data(), static_cast<size_t>(in.gcount()));
    }
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

Result<LlamaModel> load_llama_model(const std::string& dir) {
  const std::filesystem::path root(dir);
  auto config = read_llama_config(dir);
  if (!config.ok()) return config.status();
  const std::string weights_path = (root / kWeightsFile).string();
  auto weights = SafetensorsFile::read(weights_path);
  if (!weights.ok()) return weights.status();
  for (const TensorSpec& spec : llama_tensor_specs(*config)) {
    const Tensor* t = weights->find(spec.name);
    const auto bad = [&](const std::string& what) {
      return Status::invalid_argument(fmt::format("{}: tensor \"{}\" {}", weights_path, spec.name, what));
    };
    if (t == nullptr) return bad("is missing");
    if (t->shape != spec.shape) {
      return bad(fmt::format("has shape [{}], the config needs [{}]", fmt::join(t->shape, ", "),
                             fmt::join(spec.shape, ", ")));
    }
    if (t->dtype != config->dtype) {
      return bad(fmt::format("is {}, the config says {}", to_string(t->dtype), to_string(config->dtype)));
    }
  }
  auto identity = model_identity(dir);
  if (!identity.ok()) return identity.status();
  return LlamaModel{*config, std::move(*weights), *identity};
}

}  // namespace crescent::model
