#include "perf/hardware_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <limits>

namespace crescent::perf {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(HardwarePreset, NamesAreSortedAndEveryPresetIsValid) {
  EXPECT_THAT(hardware_preset_names(), ElementsAre("8xA800", "8xH200", "8xH800"));
  for (const auto& name : hardware_preset_names()) {
    auto spec = hardware_preset(name);
    ASSERT_TRUE(spec.ok()) << name;
    EXPECT_EQ(spec->name, name);
    EXPECT_TRUE(validate_hardware_spec(*spec, name).ok()) << validate_hardware_spec(*spec, name).to_string();
  }
}

TEST(HardwarePreset, A800MatchesPaperTestbed) {
  auto spec = hardware_preset("8xA800");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->gpus, 8);
  EXPECT_DOUBLE_EQ(spec->peak_flops_per_gpu, 312e12);
  EXPECT_DOUBLE_EQ(spec->hbm_bytes_per_gpu, 80e9);
  EXPECT_DOUBLE_EQ(spec->hbm_bytes_per_s_per_gpu, 2.039e12);
  EXPECT_DOUBLE_EQ(spec->host_device_bytes_per_s, 128e9);  // paper Table 1
  EXPECT_DOUBLE_EQ(spec->network_bytes_per_s, 100e9);      // 4 x 200 Gbps
}

TEST(HardwarePreset, UnknownNameListsValidNames) {
  auto spec = hardware_preset("8xB200");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(spec.status().message(), "unknown hardware preset '8xB200' (valid: 8xA800, 8xH200, 8xH800)");
}

json full_object() {
  return {{"name", "2xToy"},
          {"gpus", 2},
          {"peak_flops_per_gpu", 100},
          {"hbm_bytes_per_gpu", 1000},
          {"hbm_bytes_per_s_per_gpu", 10},
          {"mfu", 0.5},
          {"memory_bandwidth_utilization", 0.5},
          {"host_device_bytes_per_s", 4},
          {"network_bytes_per_s", 2}};
}

TEST(HardwareFromJson, PresetName) {
  auto spec = hardware_from_json(json("8xH800"), "cfg.json: hardware");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->name, "8xH800");
  EXPECT_DOUBLE_EQ(spec->peak_flops_per_gpu, 989e12);
}

TEST(HardwareFromJson, UnknownPresetNameNamesWhere) {
  auto spec = hardware_from_json(json("8xB200"), "cfg.json: hardware");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(
      spec.status().message(),
      HasSubstr("cfg.json: hardware: unknown hardware preset '8xB200' (valid: 8xA800, 8xH200, 8xH800)"));
}

TEST(HardwareFromJson, FullObject) {
  auto spec = hardware_from_json(full_object(), "cfg.json: hardware");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->name, "2xToy");
  EXPECT_EQ(spec->gpus, 2);
  EXPECT_DOUBLE_EQ(spec->peak_flops_per_gpu, 100);
  EXPECT_DOUBLE_EQ(spec->hbm_bytes_per_gpu, 1000);
  EXPECT_DOUBLE_EQ(spec->hbm_bytes_per_s_per_gpu, 10);
  EXPECT_DOUBLE_EQ(spec->mfu, 0.5);
  EXPECT_DOUBLE_EQ(spec->memory_bandwidth_utilization, 0.5);
  EXPECT_DOUBLE_EQ(spec->host_device_bytes_per_s, 4);
  EXPECT_DOUBLE_EQ(spec->network_bytes_per_s, 2);
}

TEST(HardwareFromJson, PresetWithOverrides) {
  auto spec = hardware_from_json(json{{"preset", "8xA800"}, {"mfu", 0.4}, {"network_bytes_per_s", 25e9}},
                                 "cfg.json: hardware");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->name, "8xA800 with mfu=0.4, network_bytes_per_s=25000000000.0");  // reports say what ran
  EXPECT_DOUBLE_EQ(spec->mfu, 0.4);
  EXPECT_DOUBLE_EQ(spec->network_bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(spec->peak_flops_per_gpu, 312e12);  // the rest comes from the preset
  auto named = hardware_from_json(json{{"preset", "8xA800"}, {"gpus", 4}, {"name", "4xA800"}}, "h");
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->name, "4xA800");  // an explicit name wins
  EXPECT_EQ(named->gpus, 4);
}

TEST(HardwareFromJson, InvalidInputsNameWhereAndField) {
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
  missing.erase("hbm_bytes_per_gpu");
  const Case cases[] = {
      {with("gpus", 0), "field 'gpus' must be >= 1, got 0"},
      {with("network_bytes_per_s", -100e9), "field 'network_bytes_per_s' must be > 0"},
      {with("peak_flops_per_gpu", 0), "field 'peak_flops_per_gpu' must be > 0"},
      {with("mfu", 1.5), "field 'mfu' must be in (0, 1], got 1.5"},
      {with("memory_bandwidth_utilization", 0), "field 'memory_bandwidth_utilization' must be > 0"},
      {with("hbm_bytes_per_s_per_gpu", "fast"), "field 'hbm_bytes_per_s_per_gpu' must be a number"},
      {with("nic_bytes_per_s", 1), "unknown field 'nic_bytes_per_s'"},
      {missing, "missing field 'hbm_bytes_per_gpu'"},
      {json{{"preset", "8xH800"}, {"mfu", 2}}, "field 'mfu' must be in (0, 1], got 2"},
      {json::array(), "must be a hardware preset name or an object"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.j.dump());
    auto spec = hardware_from_json(c.j, "cfg.json: hardware");
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr("cfg.json: hardware: "));
    EXPECT_THAT(spec.status().message(), HasSubstr(c.expected));
  }
}

TEST(ValidateHardwareSpec, RejectsNonFiniteFigures) {
  HardwareSpec spec = hardware_preset("8xA800").value();
  spec.host_device_bytes_per_s = std::numeric_limits<double>::infinity();
  EXPECT_THAT(validate_hardware_spec(spec, "h").message(),
              HasSubstr("h: field 'host_device_bytes_per_s' must be finite and > 0"));
  spec = hardware_preset("8xA800").value();
  spec.mfu = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(validate_hardware_spec(spec, "h").message(), HasSubstr("h: field 'mfu' must be in (0, 1]"));
}

}  // namespace
}  // namespace crescent::perf
