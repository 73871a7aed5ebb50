#include "cluster/cluster_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace crescent::cluster {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json valid() {
  return json::parse(R"({"model": "llama3-70b", "hardware": "8xA800", "prefill_instances": 4,
                         "decode_instances": 2, "prefill_cache_capacity_tokens": 1000000,
                         "slo": {"ttft_s": 10, "tbt_s": [0.05, 0.1]}})");
}

std::string error_of(const json& j) {
  auto r = cluster_config_from_json(j, "c.json", 512);
  return r.ok() ? "" : r.status().message();
}

TEST(ClusterConfig, ParsesFieldsAndPresets) {
  auto r = cluster_config_from_json(valid(), "c.json", 512);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->prefill_instances, 4u);
  EXPECT_EQ(r->decode_instances, 2u);
  EXPECT_EQ(r->model.layers, 80);
  EXPECT_EQ(r->hardware.gpus, 8);
  EXPECT_DOUBLE_EQ(r->slo.ttft_s, 10);
  EXPECT_THAT(r->slo.tbt_s, ::testing::ElementsAre(0.05, 0.1));
}

TEST(ClusterConfig, ShippedConfigLoads) {
  auto r = load_cluster_config(CRESCENT_SOURCE_DIR "/configs/paper-fig5.json", 512);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->name, "paper-fig5");
  EXPECT_EQ(r->prefill_instances + r->decode_instances, 16u);
}

TEST(ClusterConfig, ImpossibleValuesAreNamed) {
  json j = valid();
  j["prefill_instances"] = 0;
  EXPECT_THAT(error_of(j), HasSubstr("'prefill_instances' must be >= 1"));
  j = valid();
  j["prefill_cache_capacity_tokens"] = 100;
  EXPECT_THAT(error_of(j), HasSubstr("'prefill_cache_capacity_tokens' must be >= 512"));
  j = valid();
  j["hardware"] = {{"preset", "8xA800"}, {"network_bytes_per_s", -5}};
  EXPECT_THAT(error_of(j), HasSubstr("network_bytes_per_s"));
  j = valid();
  j["model"] = "gpt-9";
  EXPECT_THAT(error_of(j), HasSubstr("llama3-70b"));  // lists the valid names
  j = valid();
  j["serve"] = {{"max_request_placements", 0}};
  EXPECT_THAT(error_of(j), HasSubstr("'max_request_placements' must be >= 1"));
  j["serve"] = {{"kv_event_buffer_batches", 0}};
  EXPECT_THAT(error_of(j), HasSubstr("'kv_event_buffer_batches' must be >= 1"));
  j = valid();
  j["decode_instnaces"] = 3;
  EXPECT_THAT(error_of(j), HasSubstr("unknown field 'decode_instnaces'"));
  j = valid();
  j["slo"]["tbt_s"] = json::array();
  EXPECT_THAT(error_of(j), HasSubstr("tbt_s"));
  j = valid();
  j.erase("model");
  EXPECT_THAT(error_of(j), HasSubstr("missing field 'model'"));
  j = valid();  // every missing required field at once
  j.erase("model");
  j.erase("decode_instances");
  EXPECT_THAT(error_of(j), HasSubstr("missing fields 'model', 'decode_instances'"));
  EXPECT_THAT(error_of(json::object()),
              HasSubstr("missing fields 'model', 'hardware', 'prefill_instances', 'decode_instances'"));
  // Gaps at the top level, in the model and in the hardware, all in one message.
  j = valid();
  j.erase("decode_instances");
  j["model"] = {{"name", "m"}, {"layers", 2}};
  j["hardware"] = {{"name", "h"}, {"gpus", 1}};
  const std::string all = error_of(j);
  EXPECT_THAT(all, HasSubstr("missing field 'decode_instances'"));
  EXPECT_THAT(all, HasSubstr("model: missing fields 'hidden_size', 'attention_heads'"));
  EXPECT_THAT(all, HasSubstr("hardware: missing fields 'peak_flops_per_gpu'"));
  j = valid();  // figures that validate alone, but predict infinite times
  j["hardware"] = {{"preset", "8xA800"}, {"peak_flops_per_gpu", 1e-300}};
  EXPECT_EQ(error_of(j), "");
  auto stalled = cluster_config_from_json(j, "c.json", 512);
  ASSERT_TRUE(stalled.ok());
  EXPECT_THAT(validate(*stalled, 512).message(),
              HasSubstr("peak_flops_per_gpu=1e-300 (roofline times): linear_s_per_token is inf s: hardware "
                        "figures peak_flops_per_gpu x gpus x mfu too small"));
  j["hardware"] = {{"preset", "8xA800"}, {"network_bytes_per_s", 1e-300}};
  stalled = cluster_config_from_json(j, "c.json", 512);
  ASSERT_TRUE(stalled.ok());
  EXPECT_THAT(validate(*stalled, 512).message(),
              HasSubstr("the predicted KV transfer time for 1327186 tokens is inf s: hardware figure "
                        "network_bytes_per_s too small"));
  // Finite however slow: a prompt as long as a decode instance holds (1.3M tokens) takes ~1e14 s here.
  j["hardware"] = {{"preset", "8xA800"}, {"peak_flops_per_gpu", 1e4}};
  stalled = cluster_config_from_json(j, "c.json", 512);
  ASSERT_TRUE(stalled.ok());
  EXPECT_TRUE(validate(*stalled, 512).ok()) << validate(*stalled, 512).message();
  j = valid();
  j["decode_instances"] = 70000;
  EXPECT_THAT(error_of(j), HasSubstr("field 'decode_instances' must be <= 65536, got 70000"));
}

TEST(ClusterConfig, MissingOrBrokenFileIsAnError) {
  EXPECT_FALSE(load_cluster_config("/nonexistent/x.json", 512).ok());
}

}  // namespace
}  // namespace crescent::cluster
