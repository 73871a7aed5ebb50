// Issue #8 §6: every config field reaches what it sets. For each field, a run with the field changed must
// differ from the baseline run in its per-request outcomes or its report; names and the description, which
// only label results, must differ in the config the results record. A parsed field that no component reads
// fails here, and a field added to the parser without a row below fails CoversEveryField.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cluster/cluster_config.h"
#include "cluster/report.h"
#include "conductor/conductor.h"
#include "perf/hardware_spec.h"
#include "perf/model_spec.h"
#include "sim/simulator.h"
#include "trace/reader.h"

namespace crescent::sim {
namespace {

using conductor::Admission;
using conductor::PrefillPolicy;
using nlohmann::json;

// 2 prefill + 2 decode instances with little decode HBM, so that both pools and admission matter.
json base_config() {
  return {{"name", "fields"},
          {"description", "base"},
          {"model", {{"preset", "llama3-70b"}}},
          {"hardware", {{"preset", "8xA800"}}},
          {"prefill_instances", 2},
          {"decode_instances", 2},
          {"prefill_cache_capacity_tokens", 1'000'000},
          {"decode_hbm_reserved_share", 0.7},
          {"prefill_chunk_tokens", 8192},
          {"kvcache_balancing_threshold", 1.0},
          {"expected_output_prior_tokens", 256},
          {"slo", {{"ttft_s", 30}, {"tbt_s", {0.1, 0.2}}}},
          {"seed", 1}};
}

// One changed field: a JSON merge patch on base_config() and the run that shows its effect.
struct FieldCase {
  std::string field;  // "prefill_instances", "slo.ttft_s", "hardware.gpus", ...
  json patch;
  PrefillPolicy policy = PrefillPolicy::kGlobalCacheAware;
  Admission admission = Admission::kNone;
  bool label_only = false;  // names a thing in results, changes no behaviour
  // Only the per-request outcomes count, not the report: for fields the report also reads itself (the SLOs),
  // so the case fails when the field stops reaching the Conductor.
  bool outcomes_only = false;
};

const std::vector<FieldCase>& cases() {
  static const std::vector<FieldCase> kCases = {
      {"name", {{"name", "renamed"}}, PrefillPolicy::kGlobalCacheAware, Admission::kNone, true},
      {"description", {{"description", "changed"}}, PrefillPolicy::kGlobalCacheAware, Admission::kNone, true},
      {"model", {{"model", "llama3-8b"}}},
      {"hardware", {{"hardware", "8xH800"}}},
      {"prefill_instances", {{"prefill_instances", 3}}},
      {"decode_instances", {{"decode_instances", 3}}},
      {"prefill_cache_capacity_tokens", {{"prefill_cache_capacity_tokens", 20'000}}},
      {"decode_hbm_reserved_share", {{"decode_hbm_reserved_share", 0.5}}},
      {"decode_kv_capacity_tokens", {{"decode_kv_capacity_tokens", 60'000}}},
      {"prefill_chunk_tokens", {{"prefill_chunk_tokens", 512}}},
      {"kvcache_balancing_threshold", {{"kvcache_balancing_threshold", 50.0}}},
      {"expected_output_prior_tokens",
       {{"expected_output_prior_tokens", 20'000}},
       PrefillPolicy::kGlobalCacheAware,
       Admission::kPredictive},
      {"slo.ttft_s",
       {{"slo", {{"ttft_s", 2}}}},
       PrefillPolicy::kGlobalCacheAware,
       Admission::kSlo,
       false,
       true},
      {"slo.tbt_s",
       {{"slo", {{"tbt_s", {0.015, 0.3}}}}},
       PrefillPolicy::kGlobalCacheAware,
       Admission::kSlo,
       false,
       true},
      {"seed", {{"seed", 2}}, PrefillPolicy::kRandom},
      // The roofline's coefficients of llama3-70b on 8xA800 (crescent profile --executor mock), the linear
      // layers twice as slow.
      {"profile",
       {{"profile",
         {{"linear_s_per_token", 2 * 0.000113067},
          {"attention_s_per_token_context", 2.10051e-09},
          {"decode_weight_read_s", 0.0123579},
          {"decode_s_per_request", 0},
          {"decode_kv_read_s_per_token", 2.86975e-08},
          {"prefill_iteration_overhead_s", 0}}}}},
      {"model.name",
       {{"model", {{"name", "my-70b"}}}},
       PrefillPolicy::kGlobalCacheAware,
       Admission::kNone,
       true},
      {"model.layers", {{"model", {{"layers", 60}}}}},
      {"model.hidden_size", {{"model", {{"hidden_size", 4096}}}}},
      {"model.attention_heads", {{"model", {{"attention_heads", 32}}}}},
      {"model.kv_heads", {{"model", {{"kv_heads", 16}}}}},
      {"model.bytes_per_element", {{"model", {{"bytes_per_element", 1}}}}},
      {"model.parameters", {{"model", {{"parameters", 60e9}}}}},
      {"hardware.name",
       {{"hardware", {{"name", "my-node"}}}},
       PrefillPolicy::kGlobalCacheAware,
       Admission::kNone,
       true},
      {"hardware.gpus", {{"hardware", {{"gpus", 16}}}}},
      {"hardware.peak_flops_per_gpu", {{"hardware", {{"peak_flops_per_gpu", 200e12}}}}},
      {"hardware.hbm_bytes_per_gpu", {{"hardware", {{"hbm_bytes_per_gpu", 60e9}}}}},
      {"hardware.hbm_bytes_per_s_per_gpu", {{"hardware", {{"hbm_bytes_per_s_per_gpu", 1e12}}}}},
      {"hardware.mfu", {{"hardware", {{"mfu", 0.3}}}}},
      {"hardware.memory_bandwidth_utilization", {{"hardware", {{"memory_bandwidth_utilization", 0.4}}}}},
      {"hardware.host_device_bytes_per_s", {{"hardware", {{"host_device_bytes_per_s", 5e9}}}}},
      {"hardware.network_bytes_per_s", {{"hardware", {{"network_bytes_per_s", 5e9}}}}},
  };
  return kCases;
}

const std::vector<trace::Request>& scenario_trace() {
  static const std::vector<trace::Request> kTrace = [] {
    auto t = trace::read_trace(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz",
                               {.max_requests = 400});
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(*t) : std::vector<trace::Request>{};
  }();
  return kTrace;
}

// What a user sees of a run, as text: per-request outcomes and (unless `outcomes_only`) the report, or
// (`label_only`) the config the results record.
std::string observe(const json& config_json, const FieldCase& c) {
  auto config = cluster::cluster_config_from_json(config_json, "fields.json", 512);
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  if (!config.ok()) return "";
  if (c.label_only) return to_json(*config).dump();
  auto result =
      simulate(*config, scenario_trace(), {.policy = c.policy, .admission = c.admission, .time_scale = 8});
  EXPECT_TRUE(result.ok()) << result.status().to_string();
  if (!result.ok()) return "";
  json out = json::object();
  if (!c.outcomes_only) out["report"] = to_json(cluster::summarize("run", *result, config->slo));
  for (const cluster::RequestOutcome& o : result->requests) {
    out["requests"].push_back({o.ttft_s, o.tbt_s, o.finish_s, o.prefix_hit_tokens, o.fetched_tokens,
                               o.prefill_instance, o.decode_instance, static_cast<int>(o.rejected)});
  }
  return out.dump();
}

TEST(ConfigFields, EveryFieldChangesWhatTheRunShows) {
  for (const FieldCase& c : cases()) {
    SCOPED_TRACE(c.field);
    json changed = base_config();
    changed.merge_patch(c.patch);
    ASSERT_NE(changed, base_config());
    EXPECT_NE(observe(base_config(), c), observe(changed, c));
  }
}

TEST(ConfigFields, CoversEveryField) {
  std::set<std::string> expected, covered;
  for (std::string_view f : cluster::cluster_config_fields()) {
    if (f != "slo" && f != "serve") expected.emplace(f);  // "serve" is for live runs (ServeSection below)
  }
  for (std::string_view f : cluster::slo_config_fields()) expected.insert("slo." + std::string(f));
  for (std::string_view f : perf::model_spec_fields()) expected.insert("model." + std::string(f));
  for (std::string_view f : perf::hardware_spec_fields()) expected.insert("hardware." + std::string(f));
  for (const FieldCase& c : cases()) covered.insert(c.field);
  EXPECT_EQ(covered, expected);
}

// "serve" shapes live runs only (`crescent serve`), so no simulation can show it: it is parsed, defaulted and
// checked here instead.
TEST(ConfigFields, ServeSectionIsParsedAndCheckedButLeavesSimulationsAlone) {
  json j = base_config();
  auto defaults = cluster::cluster_config_from_json(j, "fields.json", 512);
  ASSERT_TRUE(defaults.ok()) << defaults.status().to_string();
  EXPECT_EQ(defaults->serve.kv_bytes_scale, 4096);
  EXPECT_TRUE(defaults->serve.verify_kv_checksums);
  EXPECT_TRUE(defaults->serve.kv_stream_layers);
  j["serve"] = {{"kv_bytes_scale", 512},
                {"kv_transfer_timeout_s", 2.5},
                {"heartbeat_timeout_s", 0.5},
                {"stage_timeout_floor_s", 7.5},
                {"stage_timeout_factor", 2.5},
                {"store_dram_bytes", 1 << 26},
                {"store_ssd_bytes", 1 << 30},
                {"keep_prefill_cache", true},
                {"verify_kv_checksums", false},
                {"kv_stream_layers", false},
                {"policy", "random"},
                {"admission", "predictive"},
                {"http_port", 0},
                {"executor", "cpu"},
                {"model", "models/tiny"},
                {"kv_cache_bytes", 1 << 30}};
  auto config = cluster::cluster_config_from_json(j, "fields.json", 512);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->serve.kv_bytes_scale, 512);
  EXPECT_EQ(config->serve.kv_transfer_timeout_s, 2.5);
  EXPECT_EQ(config->serve.heartbeat_timeout_s, 0.5);
  EXPECT_EQ(defaults->serve.stage_timeout_floor_s, 30);
  EXPECT_EQ(defaults->serve.stage_timeout_factor, 4);
  EXPECT_EQ(config->serve.stage_timeout_floor_s, 7.5);
  EXPECT_EQ(config->serve.stage_timeout_factor, 2.5);
  EXPECT_EQ(config->serve.store_dram_bytes, 1 << 26);
  EXPECT_EQ(defaults->serve.store_ssd_bytes, 0);
  EXPECT_EQ(config->serve.store_ssd_bytes, 1 << 30);
  EXPECT_FALSE(defaults->serve.keep_prefill_cache);
  EXPECT_TRUE(config->serve.keep_prefill_cache);
  EXPECT_FALSE(config->serve.verify_kv_checksums);
  EXPECT_FALSE(config->serve.kv_stream_layers);
  EXPECT_EQ(config->serve.policy, conductor::PrefillPolicy::kRandom);
  EXPECT_EQ(config->serve.admission, conductor::Admission::kPredictive);
  EXPECT_EQ(config->serve.http_port, 0);
  EXPECT_EQ(config->serve.executor, cluster::ExecutorKind::kCpu);
  EXPECT_EQ(config->serve.model_dir, "models/tiny");
  EXPECT_EQ(config->serve.kv_cache_bytes, 1 << 30);
  EXPECT_EQ(to_json(*config), to_json(*defaults));  // results record what simulations use
  for (const auto& [field, value, message] : std::vector<std::tuple<std::string, json, std::string>>{
           {"kv_bytes_scale", 0, "'kv_bytes_scale'"},
           {"verify_kv_checksums", "yes", "'verify_kv_checksums' must be true or false"},
           {"kv_stream_layers", 1, "'kv_stream_layers' must be true or false"},
           {"store_dram_bytes", 1000, "'store_dram_bytes'"},
           {"store_ssd_bytes", -1, "'store_ssd_bytes'"},
           {"heartbeat", 1, "heartbeat"},
           {"stage_timeout_floor_s", 0, "'stage_timeout_floor_s'"},
           {"stage_timeout_factor", -1, "'stage_timeout_factor'"},
           {"policy", "fastest",
            "field 'policy': unknown prefill policy 'fastest' (valid: random, round-robin, least-loaded"},
           {"admission", "maybe", "field 'admission': unknown admission policy 'maybe' (valid: none, slo"},
           {"http_port", 70000, "'http_port' must be <= 65535"},
           {"executor", "gpu", "field 'executor': unknown executor 'gpu' (valid: mock, cpu)"},
           {"model", 3, "'model'"},
           {"kv_cache_bytes", 1000, "'kv_cache_bytes'"}}) {
    json bad = base_config();
    bad["serve"] = {{field, value}};
    auto refused = cluster::cluster_config_from_json(bad, "fields.json", 512);
    ASSERT_FALSE(refused.ok()) << field;
    EXPECT_THAT(refused.status().message(), ::testing::HasSubstr(message));
    EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("fields.json: serve"));
  }
}

// The scheduling fields reach the Conductor through cluster::conductor_options(), the one place that builds
// its options from a config.
TEST(ConfigFields, ConductorOptionsCarryTheConfigsSchedulingFields) {
  json j = base_config();
  j["kvcache_balancing_threshold"] = 3.5;
  j["expected_output_prior_tokens"] = 777;
  j["slo"] = {{"ttft_s", 12}, {"tbt_s", {0.07, 0.2}}};
  j["seed"] = 42;
  auto config = cluster::cluster_config_from_json(j, "fields.json", 512);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  const conductor::ConductorOptions o =
      cluster::conductor_options(*config, PrefillPolicy::kCacheAware, Admission::kEarly, 256);
  EXPECT_EQ(o.policy, PrefillPolicy::kCacheAware);
  EXPECT_EQ(o.admission, Admission::kEarly);
  EXPECT_EQ(o.block_size_tokens, 256);
  EXPECT_EQ(o.kvcache_balancing_threshold, 3.5);
  EXPECT_EQ(o.expected_output_prior_tokens, 777);
  EXPECT_EQ(o.ttft_slo_s, 12);
  EXPECT_EQ(o.tbt_slo_s, 0.07);
  EXPECT_EQ(o.seed, 42u);
}

}  // namespace
}  // namespace crescent::sim
