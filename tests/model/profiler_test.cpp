#include "model/profiler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sched.h>

#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "perf/hardware_spec.h"
#include "perf/model_spec.h"
#include "test_support/temp_dir.h"

namespace crescent::model {
namespace {

void expect_within(double fitted, double truth, double tolerance, const char* name) {
  if (truth == 0) {
    EXPECT_NEAR(fitted, 0, 1e-12) << name;
  } else {
    EXPECT_NEAR(fitted / truth, 1.0, tolerance) << name << ": " << fitted << " vs " << truth;
  }
}

// Profiling the mock gives back the cost model's own coefficients within 2% (issue 11 §4), for a GPU node
// whose decode is memory-bound and configs/cpu.json's core, whose bigger batches are compute-bound (a
// coefficient no point of the grid depends on could not be recovered: the grid spans both sides).
TEST(Profiler, RecoversTheMocksCostModel) {
  perf::HardwareSpec slow = perf::hardware_preset("8xA800").value();
  slow.gpus = 1;
  slow.peak_flops_per_gpu = 1.8e11;  // configs/cpu.json's core: llama3-8b's big batches are compute-bound
  slow.hbm_bytes_per_s_per_gpu = 1.5e10;
  for (const auto& [model, hardware] : std::vector<std::pair<std::string, perf::HardwareSpec>>{
           {"llama3-70b", perf::hardware_preset("8xA800").value()}, {"llama3-8b", slow}}) {
    const perf::CostModel cost(perf::model_preset(model).value(), hardware);
    auto target = mock_profile_target(cost);
    auto report = profile_target(*target, {}, "mock");
    ASSERT_TRUE(report.ok()) << report.status().message();
    const perf::Profile& fit = report->profile;
    const perf::Profile& truth = cost.coefficients();
    expect_within(fit.linear_s_per_token, truth.linear_s_per_token, 0.02, "linear");
    expect_within(fit.attention_s_per_token_context, truth.attention_s_per_token_context, 0.02, "attention");
    expect_within(fit.decode_weight_read_s, truth.decode_weight_read_s, 0.02, "weights");
    expect_within(fit.decode_kv_read_s_per_token, truth.decode_kv_read_s_per_token, 0.02, "kv");
    EXPECT_LT(fit.decode_s_per_request, 0.02 * truth.decode_weight_read_s);
    EXPECT_LT(fit.prefill_iteration_overhead_s, 0.02 * truth.decode_weight_read_s);
    EXPECT_LT(report->prefill_rms_relative, 0.01);
    EXPECT_LT(report->decode_rms_relative, 0.01);
    ASSERT_EQ(report->chunked.size(), 4u);
    for (const ChunkedPrefill& m : report->chunked) EXPECT_NEAR(m.predicted_chunked_s / m.chunked_s, 1, 1e-6);
  }
}

// The cpu executor profiles too (its times are whatever they are; what is checked is that every point was
// timed, the fit is a valid profile, and the chunked measurement covers the prompt).
TEST(Profiler, ProfilesTheCpuExecutor) {
  test::TempDir dir;
  ASSERT_TRUE(init_llama_model(llama_preset("tiny").value(), 1, dir.path()).ok());
  LlamaForward forward(load_llama_model(dir.path()).value());
  auto target = cpu_profile_target(forward, 16, 512);
  ProfileGrid grid{.prefill_tokens = {16, 32, 64},
                   .prefix_tokens = {0, 32},
                   .decode_batch = {1, 2},
                   .decode_context = {32, 64},
                   .chunked_prompt_tokens = 96,
                   .chunk_tokens = {32},
                   .chunked_decode_batch = 2,
                   .chunked_decode_context = 32,
                   .repeats = 1};
  auto report = profile_target(*target, grid, "cpu: tiny");
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->points.size(), 6u + 4u);
  for (const ProfilePoint& p : report->points) EXPECT_GT(p.measured_s, 0);
  EXPECT_TRUE(perf::profile_from_json(to_json(*report), "report").ok());
  ASSERT_EQ(report->chunked.size(), 1u);
  EXPECT_EQ(report->chunked[0].chunks, 3);
  grid.decode_batch = {};
  EXPECT_EQ(profile_target(*target, grid, "x").status().code(), StatusCode::kInvalidArgument);
}

// A target that notes what its neighbour was running at each timing.
class RecordingTarget final : public ProfileTarget {
 public:
  explicit RecordingTarget(const NeighbourWork& neighbour) : neighbour_(neighbour) {}
  Result<double> prefill_s(int64_t n, int64_t p) override { return note("prefill", 1e-3 * n + 1e-6 * p); }
  Result<double> decode_s(int64_t b, int64_t ctx) override {
    return note("decode", 1e-2 + 1e-3 * b + 1e-6 * b * ctx);
  }
  Result<double> mixed_s(int64_t, int64_t, int64_t n, int64_t) override {
    return note("mixed", 1e-2 + 1e-3 * n);
  }
  std::vector<std::pair<std::string, NeighbourWork>> seen;

 private:
  double note(const char* kind, double seconds) {
    seen.emplace_back(kind, neighbour_);
    return seconds;
  }
  const NeighbourWork& neighbour_;
};

class RecordingNeighbour final : public ProfileNeighbour {
 public:
  void set_work(NeighbourWork work) override { work_ = work; }
  int64_t iterations() const override { return 0; }
  Status status() const override { return Status(); }
  NeighbourWork work_ = NeighbourWork::kIdle;
};

// Each kind is timed beside the other role (decode steps beside prefill, prefill beside decode steps), the
// colocated engine's chunked iterations beside nothing, and the neighbour is left idle.
TEST(Profiler, TimesEachKindBesideTheOtherRole) {
  RecordingNeighbour neighbour;
  RecordingTarget target(neighbour.work_);
  auto report = profile_target(target, {}, "recorded", {}, &neighbour);
  ASSERT_TRUE(report.ok()) << report.status().message();
  std::map<std::string, std::set<NeighbourWork>> beside;
  for (const auto& [kind, work] : target.seen) beside[kind].insert(work);
  EXPECT_EQ(beside["prefill"], std::set{NeighbourWork::kDecode});
  EXPECT_EQ(beside["decode"], std::set{NeighbourWork::kPrefill});
  EXPECT_EQ(beside["mixed"], std::set{NeighbourWork::kIdle});
  EXPECT_EQ(neighbour.work_, NeighbourWork::kIdle);
}

// An empty chunk_tokens skips the chunked-prefill measurement (a target that cannot time a mixed iteration,
// e.g. an engine over HTTP): mixed_s is never called and the report has no chunked rows.
TEST(Profiler, NoChunkSizesSkipTheChunkedPrefill) {
  NeighbourWork none = NeighbourWork::kIdle;
  RecordingTarget target(none);
  ProfileGrid grid;
  grid.chunk_tokens = {};
  auto report = profile_target(target, grid, "recorded");
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_TRUE(report->chunked.empty());
  for (const auto& [kind, work] : target.seen) EXPECT_NE(kind, "mixed");
  EXPECT_EQ(to_json(*report)["chunked_prefill"], nlohmann::json::array());
}

// A timing that fails ends the profile with the target's error.
TEST(Profiler, AFailedTimingIsTheProfilesError) {
  class Failing final : public ProfileTarget {
   public:
    Result<double> prefill_s(int64_t, int64_t) override { return 0.01; }
    Result<double> decode_s(int64_t, int64_t) override {
      return Status::unavailable("http://127.0.0.1:1: could not connect");
    }
    Result<double> mixed_s(int64_t, int64_t, int64_t, int64_t) override { return 0.01; }
  } target;
  auto report = profile_target(target, {}, "failing");
  EXPECT_EQ(report.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(report.status().message(), testing::HasSubstr("could not connect"));
}

// The cpu neighbour computes what it is asked on the core it is given, stops when idle, and refuses a core
// this process cannot run on.
TEST(Profiler, ACpuNeighbourComputesTheOtherRoleOnItsCore) {
  test::TempDir dir;
  ASSERT_TRUE(init_llama_model(llama_preset("tiny").value(), 1, dir.path()).ok());
  const LlamaModel model = load_llama_model(dir.path()).value();
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  int core = 0;
  while (!CPU_ISSET(core, &mine)) ++core;
  auto neighbour = cpu_profile_neighbour(model, core, 16, 64, 64);
  ASSERT_TRUE(neighbour.ok()) << neighbour.status().message();
  EXPECT_EQ((*neighbour)->iterations(), 0);
  for (NeighbourWork work : {NeighbourWork::kPrefill, NeighbourWork::kDecode}) {
    const int64_t before = (*neighbour)->iterations();
    (*neighbour)->set_work(work);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while ((*neighbour)->iterations() < before + 3 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_GE((*neighbour)->iterations(), before + 3);
  }
  (*neighbour)->set_work(NeighbourWork::kIdle);  // returns once the iteration under way has ended
  const int64_t idle = (*neighbour)->iterations();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ((*neighbour)->iterations(), idle);
  neighbour->reset();

  auto refused = cpu_profile_neighbour(model, CPU_SETSIZE + 1, 16, 64, 64);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), testing::HasSubstr("cannot run a thread on that core"));
}

}  // namespace
}  // namespace crescent::model
