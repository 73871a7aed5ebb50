#include "perf/model_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <limits>

namespace crescent::perf {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ModelPreset, NamesAreSortedAndEveryPresetIsValid) {
  EXPECT_THAT(model_preset_names(), ElementsAre("llama2-70b", "llama3-70b", "llama3-8b"));
  for (const auto& name : model_preset_names()) {
    auto spec = model_preset(name);
    ASSERT_TRUE(spec.ok()) << name;
    EXPECT_EQ(spec->name, name);
    EXPECT_TRUE(validate_model_spec(*spec, name).ok()) << validate_model_spec(*spec, name).to_string();
  }
}

TEST(ModelPreset, Llama3_70bMatchesConfigJson) {
  auto spec = model_preset("llama3-70b");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->layers, 80);
  EXPECT_EQ(spec->hidden_size, 8192);
  EXPECT_EQ(spec->attention_heads, 64);
  EXPECT_EQ(spec->kv_heads, 8);
  EXPECT_EQ(spec->bytes_per_element, 2);
  // 80 * (2*8192^2 + 2*8192*1024 + 3*8192*28672 + 2*8192) + 2*128256*8192 + 8192 = 70,553,706,496 (~70.6B).
  EXPECT_DOUBLE_EQ(spec->parameters, 70'553'706'496.0);
}

TEST(ModelPreset, UnknownNameListsValidNames) {
  auto spec = model_preset("llama9");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(spec.status().message(),
            "unknown model preset 'llama9' (valid: llama2-70b, llama3-70b, llama3-8b)");
}

json full_object() {
  return {{"name", "tiny"},       {"layers", 2},   {"hidden_size", 4},
          {"attention_heads", 2}, {"kv_heads", 1}, {"bytes_per_element", 2},
          {"parameters", 100}};
}

TEST(ModelFromJson, PresetName) {
  auto spec = model_from_json(json("llama3-8b"), "cfg.json: model");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->name, "llama3-8b");
  EXPECT_EQ(spec->layers, 32);
}

TEST(ModelFromJson, UnknownPresetNameNamesWhere) {
  auto spec = model_from_json(json("llama9"), "cfg.json: model");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(spec.status().message(), HasSubstr("cfg.json: model: unknown model preset 'llama9' (valid: "));
  spec = model_from_json(json{{"preset", "llama9"}}, "cfg.json: model");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("cfg.json: model: field 'preset': unknown model preset"));
}

TEST(ModelFromJson, FullObject) {
  auto spec = model_from_json(full_object(), "cfg.json: model");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->name, "tiny");
  EXPECT_EQ(spec->layers, 2);
  EXPECT_EQ(spec->hidden_size, 4);
  EXPECT_EQ(spec->attention_heads, 2);
  EXPECT_EQ(spec->kv_heads, 1);
  EXPECT_EQ(spec->bytes_per_element, 2);
  EXPECT_DOUBLE_EQ(spec->parameters, 100);
}

TEST(ModelFromJson, PresetWithOverrides) {
  auto spec =
      model_from_json(json{{"preset", "llama3-70b"}, {"name", "llama3-70b-fp8"}, {"bytes_per_element", 1}},
                      "cfg.json: model");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->name, "llama3-70b-fp8");
  EXPECT_EQ(spec->bytes_per_element, 1);
  EXPECT_EQ(spec->layers, 80);  // the rest comes from the preset
  EXPECT_DOUBLE_EQ(spec->parameters, 70'553'706'496.0);
}

TEST(ModelFromJson, OverriddenPresetIsNamedAsUsed) {
  auto spec = model_from_json(json{{"preset", "llama3-70b"}, {"layers", 40}}, "cfg.json: model");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->name, "llama3-70b with layers=40");
  EXPECT_EQ(model_from_json(json{{"preset", "llama3-70b"}}, "m")->name, "llama3-70b");
}

TEST(ModelFromJson, InvalidInputsNameWhereAndField) {
  struct Case {
    json j;
    std::string expected;  // substring of the message
  };
  auto with = [](std::string_view key, json value) {
    json j = full_object();
    j[std::string(key)] = std::move(value);
    return j;
  };
  json missing = full_object();
  missing.erase("layers");
  missing.erase("parameters");
  const Case cases[] = {
      {with("layers", 0), "field 'layers' must be >= 1, got 0"},
      {with("kv_heads", 3), "field 'kv_heads' must divide 'attention_heads' (2), got 3"},
      {with("hidden_size", 5), "field 'hidden_size' must be a multiple of 'attention_heads' (2), got 5"},
      {with("parameters", -1), "field 'parameters' must be > 0"},
      {with("layers", 2.5), "field 'layers' must be an integer"},
      {with("layer", 2), "unknown field 'layer'"},
      {missing, "cfg.json: model: missing fields 'layers', 'parameters'"},
      {with("ffn_size", 8), "field 'ffn_size' is no longer read"},  // the cost model has no use for it
      {json{{"preset", "llama3-70b"}, {"kv_heads", 7}},
       "field 'kv_heads' must divide 'attention_heads' (64), got 7"},
      {json{{"preset", 3}}, "field 'preset' must be a string"},
      {json(42), "must be a model preset name or an object, got 42"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.j.dump());
    auto spec = model_from_json(c.j, "cfg.json: model");
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr("cfg.json: model: "));
    EXPECT_THAT(spec.status().message(), HasSubstr(c.expected));
  }
}

TEST(ValidateModelSpec, RejectsNonFiniteParametersAndEmptyName) {
  ModelSpec spec = model_preset("llama3-8b").value();
  spec.parameters = std::numeric_limits<double>::infinity();
  EXPECT_THAT(validate_model_spec(spec, "m").message(), HasSubstr("m: field 'parameters' must be finite"));
  spec = model_preset("llama3-8b").value();
  spec.name = "";
  EXPECT_THAT(validate_model_spec(spec, "m").message(), HasSubstr("m: field 'name' must not be empty"));
}

}  // namespace
}  // namespace crescent::perf
