#include "perf/profile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "perf/cost_model.h"
#include "perf/hardware_spec.h"
#include "perf/model_spec.h"

namespace crescent::perf {
namespace {

using ::testing::HasSubstr;

const Profile kProfile{.source = "test",
                       .linear_s_per_token = 1e-3,
                       .attention_s_per_token_context = 1e-6,
                       .decode_weight_read_s = 0.02,
                       .decode_s_per_request = 0.01,
                       .decode_kv_read_s_per_token = 5e-6,
                       .prefill_iteration_overhead_s = 0.06};

TEST(Profile, JsonRoundTripsAndBadFieldsAreNamed) {
  auto back = profile_from_json(to_json(kProfile), "p.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(to_json(*back), to_json(kProfile));
  for (const auto& [field, value, message] :
       std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"linear_s_per_token", 0, "'linear_s_per_token' must be > 0"},
           {"decode_kv_read_s_per_token", -1, "must be >= 0, got -1"},
           {"decode_weight_read_s", "fast", "must be a number"}}) {
    nlohmann::json bad = to_json(kProfile);
    bad[field] = value;
    EXPECT_THAT(profile_from_json(bad, "p.json").status().message(), HasSubstr(message)) << field;
  }
  nlohmann::json missing = to_json(kProfile);
  missing.erase("prefill_iteration_overhead_s");
  EXPECT_THAT(profile_from_json(missing, "p.json").status().message(),
              HasSubstr("p.json: field 'prefill_iteration_overhead_s' is missing"));
  EXPECT_EQ(load_profile("/nonexistent/profile.json").status().code(), StatusCode::kNotFound);
}

// With a profile the cost model's times are the profile's formulas; sizes still come from the model.
TEST(Profile, ReplacesTheRooflinesCoefficients) {
  const ModelSpec model = model_preset("llama3-8b").value();
  const HardwareSpec hardware = hardware_preset("8xA800").value();
  const CostModel roofline(model, hardware);
  const CostModel profiled(model, hardware, &kProfile);
  EXPECT_EQ(profiled.coefficients().source, "test");
  EXPECT_EQ(roofline.coefficients().source, "roofline");
  EXPECT_EQ(profiled.kv_bytes_per_token(), roofline.kv_bytes_per_token());
  EXPECT_EQ(profiled.decode_kv_capacity_tokens(), roofline.decode_kv_capacity_tokens());
  // Decode of 4 requests holding 1000 tokens: memory-bound, no overhead.
  EXPECT_DOUBLE_EQ(profiled.decode_step_time_s(4, 1000), 0.02 + 4 * 0.01 + 1000 * 5e-6);
  // A prefill of 100 tokens after 50: compute + the per-iteration overhead.
  EXPECT_DOUBLE_EQ(profiled.iteration_time_s(0, 0, 100, 50), 100 * (1e-3 + 1e-6 * (50 + 50.5)) + 0.06);
  EXPECT_DOUBLE_EQ(profiled.prefill_iterations_time_s(200, 0, 100),
                   profiled.iteration_time_s(0, 0, 100, 0) + profiled.iteration_time_s(0, 0, 100, 100));
}

}  // namespace
}  // namespace crescent::perf
