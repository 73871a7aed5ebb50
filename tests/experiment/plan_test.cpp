#include "experiment/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cluster/cluster_config.h"
#include "sim/simulator.h"
#include "trace/reader.h"

namespace crescent::experiment {
namespace {

using ::testing::HasSubstr;

const std::string kConversation = CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz";
const std::string kConfig = CRESCENT_SOURCE_DIR "/configs/paper-fig5.json";

struct Inputs {
  cluster::ClusterConfig config;
  std::vector<trace::Request> trace;
};

// The first `requests` of the conversation trace on paper-fig5's model, hardware and SLOs.
const Inputs& inputs(int64_t requests = 1500) {
  static const Inputs in = [&] {
    Inputs i;
    i.config = *cluster::load_cluster_config(kConfig, 512);
    i.trace = *trace::read_trace(kConversation, {.max_requests = requests});
    return i;
  }();
  return in;
}

// Only the admission policies that differ most, to keep the search small in debug builds.
PlanOptions small_search() {
  return {.max_nodes = 12,
          .admissions = {conductor::Admission::kNone, conductor::Admission::kEarly},
          .colocated_systems = {sim::System::kColocatedPrefixCache}};
}

double attainment_of(const cluster::ClusterConfig& base, const PlanCandidate& c) {
  auto run = sim::simulate(candidate_config(base, c), inputs().trace,
                           {.system = c.system, .admission = c.admission, .time_scale = c.rate_scale});
  EXPECT_TRUE(run.ok()) << run.status().message();
  return cluster::summarize("check", *run, base.slo).slo_attainment;
}

TEST(Plan, TheBoundRulesOutNothingTheFullSearchWouldChoose) {
  const Inputs& in = inputs();
  PlanOptions full = small_search();
  full.prune = false;
  auto everything = plan(in.config, in.trace, full);
  ASSERT_TRUE(everything.ok()) << everything.status().message();
  int64_t ruled_out = 0;
  for (const PlanCandidate& c : everything->candidates) {
    EXPECT_TRUE(c.simulated);  // no pruning: every candidate of every node count searched
    if (!c.bound_rules_out) continue;
    ++ruled_out;
    EXPECT_FALSE(c.meets) << candidate_name(c) << " at " << c.nodes
                          << " nodes: the bound ruled out a candidate "
                          << "that meets the target (" << c.report->slo_attainment << ")";
  }
  EXPECT_GT(ruled_out, 10);  // the bound does prune here, so the check above checks something
  EXPECT_EQ(everything->pruned, 0);

  auto pruned = plan(in.config, in.trace, small_search());
  ASSERT_TRUE(pruned.ok()) << pruned.status().message();
  EXPECT_EQ(pruned->pruned, ruled_out);
  EXPECT_EQ(pruned->simulations + pruned->pruned, everything->simulations);
  ASSERT_TRUE(pruned->recommended && everything->recommended);
  auto name_of = [](const PlanResult& r, const std::optional<size_t>& i) {
    return i ? std::to_string(r.candidates[*i].nodes) + " " + candidate_name(r.candidates[*i]) : "none";
  };
  EXPECT_EQ(name_of(*pruned, pruned->recommended), name_of(*everything, everything->recommended));
  EXPECT_EQ(name_of(*pruned, pruned->runner_up), name_of(*everything, everything->runner_up));
  EXPECT_EQ(name_of(*pruned, pruned->colocated_fewest_nodes),
            name_of(*everything, everything->colocated_fewest_nodes));
}

TEST(Plan, TheRecommendationMeetsTheTargetAndNothingOneNodeSmallerDoes) {
  const Inputs& in = inputs();
  const PlanOptions options = small_search();
  auto result = plan(in.config, in.trace, options);
  ASSERT_TRUE(result.ok()) << result.status().message();
  ASSERT_TRUE(result->recommended);
  const PlanCandidate& rec = result->candidates[*result->recommended];
  // Simulated again from its config, as `crescent simulate` would: the same attainment, above the target.
  const double attainment = attainment_of(in.config, rec);
  EXPECT_EQ(attainment, rec.report->slo_attainment);
  EXPECT_GE(attainment, options.attainment_target);
  // Every candidate of one node fewer was searched (simulated or ruled out) and none meets the target.
  int64_t smaller = 0;
  for (const PlanCandidate& c : result->candidates) {
    if (c.nodes >= rec.nodes) continue;
    EXPECT_FALSE(c.meets) << c.nodes << " " << candidate_name(c);
    smaller += c.nodes + 1 == rec.nodes ? 1 : 0;
  }
  // Every split of nodes - 1 with each cache and admission, and the colocated baseline.
  EXPECT_EQ(smaller, static_cast<int64_t>((rec.nodes - 2) * result->cache_capacities_tokens.size() * 2 + 1));
  if (result->next_smaller) {
    const PlanCandidate& next = result->candidates[*result->next_smaller];
    EXPECT_EQ(next.nodes + 1, rec.nodes);
    EXPECT_LT(attainment_of(in.config, next), options.attainment_target);
  }
  // The runner-up meets the target too, and is another cluster, not another cache or admission of it.
  ASSERT_TRUE(result->runner_up);
  const PlanCandidate& second = result->candidates[*result->runner_up];
  EXPECT_TRUE(second.meets);
  EXPECT_TRUE(second.nodes != rec.nodes || second.system != rec.system ||
              second.prefill_instances != rec.prefill_instances);
  EXPECT_GE(second.nodes, rec.nodes);
}

TEST(Plan, TheSameAnswerWhateverTheThreadCount) {
  const Inputs& in = inputs();
  PlanOptions options = small_search();
  options.threads = 1;
  auto one = plan(in.config, in.trace, options);
  options.threads = 3;
  auto three = plan(in.config, in.trace, options);
  ASSERT_TRUE(one.ok() && three.ok());
  nlohmann::json a = to_json(*one, options), b = to_json(*three, options);
  a["search"].erase("wall_s");
  b["search"].erase("wall_s");
  EXPECT_EQ(a, b);
}

TEST(Plan, ANodeBudgetFindsTheHighestLoadItSustains) {
  const Inputs& in = inputs();
  PlanOptions options = small_search();
  options.node_budget = 6;
  auto result = plan(in.config, in.trace, options);
  ASSERT_TRUE(result.ok()) << result.status().message();
  ASSERT_TRUE(result->recommended);
  const PlanCandidate& rec = result->candidates[*result->recommended];
  EXPECT_EQ(rec.nodes, 6u);
  EXPECT_GE(attainment_of(in.config, rec), options.attainment_target);
  // The highest probe that met is the answer; every probe above it missed.
  ASSERT_EQ(result->probed_rate_scales.size(), result->probe_met.size());
  bool missed_above = false;
  for (size_t i = 0; i < result->probed_rate_scales.size(); ++i) {
    const double scale = result->probed_rate_scales[i];
    if (result->probe_met[i]) {
      EXPECT_LE(scale, rec.rate_scale);
    }
    if (scale > rec.rate_scale) {
      EXPECT_FALSE(result->probe_met[i]) << scale;
      missed_above = true;
    }
  }
  EXPECT_TRUE(missed_above);
  // Within 2^(1/32) of the lowest load that missed (five bisections of a factor of 2).
  double lowest_missed = 1e300;
  for (size_t i = 0; i < result->probed_rate_scales.size(); ++i) {
    if (!result->probe_met[i]) lowest_missed = std::min(lowest_missed, result->probed_rate_scales[i]);
  }
  EXPECT_LE(lowest_missed / rec.rate_scale, std::pow(2.0, 1.0 / 32) * (1 + 1e-9));
}

TEST(Plan, ATargetNoClusterCanReachIsSaidWithoutSearching) {
  const Inputs& in = inputs();
  cluster::ClusterConfig config = in.config;
  config.slo.tbt_s = {0.005};  // below a decode step of one request alone (~12 ms for llama3-70b on 8xA800)
  auto result = plan(config, in.trace, small_search());
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_TRUE(result->hopeless);
  EXPECT_TRUE(result->candidates.empty());
  EXPECT_FALSE(result->recommended);
  // Every request with a second token is impossible; those with one output token are not.
  int64_t decoding = 0;
  for (const trace::Request& r : in.trace) decoding += r.output_tokens >= 2 ? 1 : 0;
  EXPECT_EQ(result->impossible_requests, decoding);
  EXPECT_THAT(format_plan(*result, small_search(), config.slo), HasSubstr("No cluster can meet the target"));
}

TEST(Plan, ALoadBeyondTheSearchIsSaidToBeOnlyALowerBound) {
  // Five short requests a second apart: any load of them meets the SLOs on 3 nodes.
  std::vector<trace::Request> trace;
  for (int64_t i = 0; i < 5; ++i) {
    trace.push_back({.timestamp_ms = 1000 * i,
                     .input_tokens = 512,
                     .output_tokens = 2,
                     .block_keys = {static_cast<BlockKey>(i)}});
  }
  PlanOptions options = small_search();
  options.node_budget = 3;
  auto result = plan(inputs().config, trace, options);
  ASSERT_TRUE(result.ok()) << result.status().message();
  ASSERT_TRUE(result->recommended);
  EXPECT_TRUE(result->highest_load_is_search_limit);
  EXPECT_EQ(result->candidates[*result->recommended].rate_scale, std::pow(2.0, 20));
  EXPECT_THAT(format_plan(*result, options, inputs().config.slo), HasSubstr("the search's limit"));
  // The runner-up of a node budget is another split at the same load.
  ASSERT_TRUE(result->runner_up);
  const PlanCandidate& rec = result->candidates[*result->recommended];
  const PlanCandidate& second = result->candidates[*result->runner_up];
  EXPECT_EQ(second.rate_scale, rec.rate_scale);
  EXPECT_TRUE(second.prefill_instances != rec.prefill_instances || second.system != rec.system);
  // Requests all at one instant have no rate to scale.
  for (trace::Request& r : trace) r.timestamp_ms = 0;
  EXPECT_THAT(plan(inputs().config, trace, options).status().message(), HasSubstr("same instant"));
}

TEST(Plan, BadOptionsAreRefusedNamingThem) {
  const Inputs& in = inputs();
  auto message = [&](PlanOptions options) { return plan(in.config, in.trace, options).status().message(); };
  EXPECT_THAT(message({.attainment_target = 0}), HasSubstr("attainment target 0"));
  EXPECT_THAT(message({.attainment_target = 1.5}), HasSubstr("attainment target 1.5"));
  EXPECT_THAT(message({.rate_scale = -1}), HasSubstr("rate scale -1"));
  EXPECT_THAT(message({.node_budget = 1}), HasSubstr("node budget 1"));
  EXPECT_THAT(message({.max_nodes = 1}), HasSubstr("max nodes 1"));
  EXPECT_THAT(message({.cache_dram_bytes = 0}), HasSubstr("cache DRAM"));
  EXPECT_THAT(message({.admissions = {}}), HasSubstr("admission"));
  EXPECT_THAT(message({.admissions = {conductor::Admission::kEarly, conductor::Admission::kEarly}}),
              HasSubstr("'early' is named twice"));
  EXPECT_THAT(message({.node_budget = kMaxPlanNodes + 1}), HasSubstr("at most 512"));
  EXPECT_THAT(message({.max_nodes = kMaxPlanNodes + 1}), HasSubstr("at most 512"));
  EXPECT_THAT(plan(in.config, {}, {}).status().message(), HasSubstr("no requests"));
}

}  // namespace
}  // namespace crescent::experiment
