#include "model/llama.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "perf/cost_model.h"
#include "perf/hardware_spec.h"
#include "test_support/temp_dir.h"

namespace crescent::model {
namespace {

using ::testing::HasSubstr;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Counted by hand from the architecture, not from llama_tensor_specs.
TEST(Llama, PresetsHaveTheirSizesAndTheCostModelsKvBytes) {
  const LlamaConfig tiny = llama_preset("tiny").value();
  const int64_t d = 64, kv = 2 * 16, mlp = 128, vocab = 256, layers = 2;
  const int64_t per_layer = d + d * d + 2 * kv * d + d * d + d + 3 * mlp * d;
  EXPECT_EQ(tiny.parameters(), vocab * d + layers * per_layer + d + vocab * d);
  EXPECT_EQ(tiny.kv_bytes_per_token(), 2 * layers * kv * 4);
  const LlamaConfig small = llama_preset("small").value();
  EXPECT_GT(small.parameters(), 90'000'000);
  EXPECT_LT(small.parameters(), 110'000'000);
  for (const LlamaConfig& c : {tiny, small}) {
    const perf::CostModel cost(model_spec(c, "m"), perf::hardware_preset("8xA800").value());
    EXPECT_EQ(cost.kv_bytes_per_token(), static_cast<double>(c.kv_bytes_per_token()));
  }
  auto none = llama_preset("huge");
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("small, tiny"));
}

TEST(Llama, AnInitialisedModelLoadsBackAndTheSameSeedWritesTheSameBytes) {
  test::TempDir dir;
  LlamaConfig config = llama_preset("tiny").value();
  ASSERT_TRUE(init_llama_model(config, 7, dir.file("a")).ok());
  ASSERT_TRUE(init_llama_model(config, 7, dir.file("b")).ok());
  ASSERT_TRUE(init_llama_model(config, 8, dir.file("c")).ok());
  EXPECT_EQ(slurp(dir.file("a/model.safetensors")), slurp(dir.file("b/model.safetensors")));
  EXPECT_NE(slurp(dir.file("a/model.safetensors")), slurp(dir.file("c/model.safetensors")));
  auto model = load_llama_model(dir.file("a"));
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ(model->config.num_hidden_layers, 2);
  EXPECT_EQ(model->config.num_key_value_heads, 2);
  EXPECT_EQ(model->weights.tensors().size(), llama_tensor_specs(config).size());
  // Norms start at 1; matrices are small, centred, with standard deviation about 0.02.
  const Tensor* norm = model->weights.find("model.layers.1.input_layernorm.weight");
  ASSERT_NE(norm, nullptr);
  float first = 0;
  std::memcpy(&first, norm->data.data(), 4);
  EXPECT_EQ(first, 1.0f);
  const Tensor* up = model->weights.find("model.layers.0.mlp.up_proj.weight");
  ASSERT_NE(up, nullptr);
  double sum = 0, squares = 0;
  for (int64_t i = 0; i < up->elements(); ++i) {
    float v = 0;
    std::memcpy(&v, up->data.data() + 4 * i, 4);
    sum += v;
    squares += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(up->elements());
  EXPECT_NEAR(sum / n, 0, 0.002);
  EXPECT_NEAR(std::sqrt(squares / n), 0.02, 0.002);
  // bfloat16 weights, and a tied LM head (no lm_head tensor).
  config.dtype = DType::kBF16;
  config.tie_word_embeddings = true;
  ASSERT_TRUE(init_llama_model(config, 7, dir.file("d")).ok());
  auto bf16 = load_llama_model(dir.file("d"));
  ASSERT_TRUE(bf16.ok()) << bf16.status().message();
  EXPECT_EQ(bf16->weights.find("model.norm.weight")->dtype, DType::kBF16);
  EXPECT_EQ(bf16->weights.find("lm_head.weight"), nullptr);
}

// The loader names the missing tensor, the wrong shape or dtype, the truncated file, the bad config field.
TEST(Llama, ABrokenModelDirectoryIsRefusedWithWhatIsWrong) {
  test::TempDir dir;
  const LlamaConfig config = llama_preset("tiny").value();
  ASSERT_TRUE(init_llama_model(config, 1, dir.file("m")).ok());
  const std::string weights = dir.file("m/model.safetensors");
  const std::string config_path = dir.file("m/config.json");
  const std::string good_weights = slurp(weights), good_config = slurp(config_path);
  const auto expect_error = [&](const std::string& expected) {
    auto model = load_llama_model(dir.file("m"));
    ASSERT_FALSE(model.ok()) << expected;
    EXPECT_THAT(model.status().message(), HasSubstr(expected));
    std::ofstream(weights, std::ios::binary) << good_weights;
    std::ofstream(config_path) << good_config;
  };
  // A config that wants another shape: every tensor is then of the wrong shape or missing.
  nlohmann::json j = nlohmann::json::parse(good_config);
  j["intermediate_size"] = 96;
  std::ofstream(config_path) << j.dump();
  expect_error(
      "tensor \"model.layers.0.mlp.gate_proj.weight\" has shape [128, 64], the config needs [96, 64]");
  j = nlohmann::json::parse(good_config);
  j["num_hidden_layers"] = 3;
  std::ofstream(config_path) << j.dump();
  expect_error("tensor \"model.layers.2.input_layernorm.weight\" is missing");
  j = nlohmann::json::parse(good_config);
  j["torch_dtype"] = "bfloat16";
  std::ofstream(config_path) << j.dump();
  expect_error("tensor \"model.embed_tokens.weight\" is F32, the config says BF16");
  j = nlohmann::json::parse(good_config);
  j.erase("hidden_size");
  std::ofstream(config_path) << j.dump();
  expect_error("config.json: missing field 'hidden_size'");
  std::ofstream(weights, std::ios::binary) << good_weights.substr(0, good_weights.size() - 100);
  expect_error("model.safetensors: truncated: tensor \"lm_head.weight\" ends at byte");
  std::filesystem::remove(weights);
  auto missing = load_llama_model(dir.file("m"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(Llama, AConfigItCannotServeIsRefusedNamingTheField) {
  const nlohmann::json base = to_json(llama_preset("tiny").value());
  const auto error_of = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json j = base;
    j[key] = value;
    auto c = llama_config_from_json(j, "config.json");
    return c.ok() ? std::string("ok") : c.status().message();
  };
  EXPECT_THAT(error_of("num_key_value_heads", 3), HasSubstr("'num_key_value_heads' 3 does not divide"));
  EXPECT_THAT(error_of("num_attention_heads", 5),
              HasSubstr("'num_attention_heads' 5 does not divide 'hidden_size' 64"));
  EXPECT_THAT(error_of("model_type", "gpt2"), HasSubstr("'model_type' \"gpt2\" is not \"llama\""));
  EXPECT_THAT(error_of("torch_dtype", "float16"), HasSubstr("'torch_dtype' \"float16\" is not supported"));
  EXPECT_THAT(error_of("head_dim", 8),
              HasSubstr("'head_dim' 8 is not hidden_size / num_attention_heads = 16"));
  EXPECT_THAT(error_of("tie_word_embeddings", "yes"),
              HasSubstr("'tie_word_embeddings' must be true or false"));
  EXPECT_THAT(error_of("vocab_size", 0), HasSubstr("vocab_size"));
  EXPECT_EQ(error_of("bos_token_id", 1),
            "ok");  // fields crescent does not read are ignored, as transformers does
  const LlamaConfig round = llama_config_from_json(base, "x").value();
  EXPECT_EQ(round.kv_bytes_per_token(), llama_preset("tiny").value().kv_bytes_per_token());
}

// A model's identity is its files': the same seed gives the same, another seed or dtype another, and it
// seeds the block keys so KV of one model never matches another's.
TEST(Llama, IdentityIsTheFilesDigest) {
  test::TempDir dir;
  const LlamaConfig tiny = llama_preset("tiny").value();
  LlamaConfig bf16 = tiny;
  bf16.dtype = DType::kBF16;
  ASSERT_TRUE(init_llama_model(tiny, 1, dir.file("a")).ok());
  ASSERT_TRUE(init_llama_model(tiny, 1, dir.file("b")).ok());
  ASSERT_TRUE(init_llama_model(tiny, 2, dir.file("c")).ok());
  ASSERT_TRUE(init_llama_model(bf16, 1, dir.file("d")).ok());
  const uint64_t a = model_identity(dir.file("a")).value();
  EXPECT_EQ(model_identity(dir.file("b")).value(), a);
  EXPECT_NE(model_identity(dir.file("c")).value(), a);
  EXPECT_NE(model_identity(dir.file("d")).value(), a);
  EXPECT_EQ(load_llama_model(dir.file("a")).value().identity, a);
  auto missing = model_identity(dir.file("none"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("config.json"));
}

}  // namespace
}  // namespace crescent::model
