// Conductor decision throughput: Conductor::schedule for the conversation trace's requests against 16, 128
// and 1,024 prefill instances (and 16 decode instances) whose prefix caches index 1M distinct blocks, for
// least-loaded and global-cache-aware. Goal (issue 26): 1,000,000 decisions/s at 1,024 instances for
// global-cache-aware on one core; docs/benchmarks.md has the figures. Baselines in the same process: each
// decision with the Conductor's busy order (third argument 1, conductor/busy_order.h) and with the loop over
// every instance it replaces (0); and the prefix match alone (BlockIndex::match_prefix), the part that must
// not grow with instances × cached blocks. The fourth argument 1 makes the cluster change as a simulated one
// does: each decision's prefill joins its instance's queue (busy_until moves, logged as ClusterState logs
// it) and the clock advances 2 ms per request (about three quarters of the prefill pool's capacity at 1,024
// instances); 0 keeps every busy time as it started.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <iostream>

#include "conductor/conductor.h"
#include "perf/cost_model.h"
#include "trace/reader.h"

namespace {

using namespace crescent;

constexpr int64_t kIndexedBlocks = 1'000'000;

const std::vector<trace::Request>& conversation() {
  static const auto trace = [] {
    auto t = trace::read_trace(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz", {});
    if (!t.ok()) {
      std::cerr << t.status().to_string() << "\n";
      std::exit(1);
    }
    return std::move(t).value();
  }();
  return trace;
}

class BenchCluster : public conductor::ClusterView {
 public:
  explicit BenchCluster(uint32_t prefill) : busy_until_s_(prefill), decode_(16) {
    // Every request's blocks cached on one pseudo-randomly chosen instance: shared prefixes (system prompts)
    // end up replicated on many instances, as under a cache-aware scheduler. Then filler blocks up to 1M
    // keys.
    const auto& trace = conversation();
    for (size_t r = 0; r < trace.size(); ++r) {
      auto holder = static_cast<InstanceId>((r * 2654435761u) % prefill);
      for (BlockKey k : trace[r].block_keys) index_.add(k, holder);
    }
    for (BlockKey k = 1ull << 40; index_.blocks() < kIndexedBlocks; ++k) {
      index_.add(k, static_cast<InstanceId>(k % prefill));
    }
    for (uint32_t i = 0; i < prefill; ++i) busy_until_s_[i] = static_cast<double>((i * 7919u) % 1000) / 100.0;
    for (uint32_t d = 0; d < decode_.size(); ++d) {
      const int64_t running = 20 + d;
      decode_[d].running = {running, running * 10'000, running * 11'000};
      decode_[d].kv_capacity_tokens = 1'300'000;
    }
    decode_choice_.set_all(decode_, {});  // the loads never change here
  }
  uint32_t prefill_instance_count() const override { return static_cast<uint32_t>(busy_until_s_.size()); }
  std::span<const double> prefill_busy_until_s() const override { return busy_until_s_; }
  std::span<const kv::DecodeLoad> decode_loads() const override { return decode_; }
  const conductor::DecodeChoiceLoads* decode_choice_loads() const override { return &decode_choice_; }
  const kv::BlockIndex& block_index() const override { return index_; }
  double prefix_ready_s(InstanceId, std::span<const BlockKey>, double) const override { return 0; }
  conductor::PrefillChanges prefill_changes() const override { return changes_.changes(); }

  /// An accepted decision's prefill joins its instance's queue (as ClusterState::on_request_placed predicts
  /// it).
  void place(const conductor::Decision& d, double now_s) {
    auto& busy = busy_until_s_[d.prefill_instance];
    busy = std::max(busy, now_s) + d.transfer_s + d.prefill_s;
    changes_.note(d.prefill_instance);
  }

 private:
  std::vector<double> busy_until_s_;
  std::vector<kv::DecodeLoad> decode_;
  conductor::DecodeChoiceLoads decode_choice_;
  kv::BlockIndex index_;
  conductor::PrefillChangeLog changes_;
};

const perf::CostModel& cost_model() {
  static const perf::CostModel cost(*perf::model_preset("llama3-70b"), *perf::hardware_preset("8xA800"));
  return cost;
}

void BM_ConductorDecision(benchmark::State& state) {
  const auto policy = static_cast<conductor::PrefillPolicy>(state.range(1));
  BenchCluster cluster(static_cast<uint32_t>(state.range(0)));
  conductor::Conductor conductor(cost_model(), {.policy = policy});
  const bool busy_order = state.range(2) != 0;
  const bool changing = state.range(3) != 0;
  conductor.set_busy_order_enabled(busy_order);
  const auto& trace = conversation();
  size_t r = 0;
  double now_s = 5.0;
  for (auto _ : state) {
    const auto& req = trace[r];
    r = r + 1 == trace.size() ? 0 : r + 1;
    const auto d = conductor.schedule(cluster, {req.input_tokens, req.block_keys, req.output_tokens}, now_s);
    benchmark::DoNotOptimize(d);
    if (changing) {
      if (d.rejected == conductor::RejectReason::kNone) cluster.place(d, now_s);
      now_s += 0.002;
    }
  }
  state.SetLabel(std::string(conductor::to_string(policy)) + (busy_order ? "" : ", loop (no busy order)") +
                 (changing ? ", busy times change" : ""));
  state.counters["order share"] =
      static_cast<double>(conductor.busy_order_choices()) /
      static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  state.counters["decisions/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ConductorDecision)
    ->ArgsProduct({{16, 128, 1024},
                   {static_cast<int64_t>(conductor::PrefillPolicy::kLeastLoaded),
                    static_cast<int64_t>(conductor::PrefillPolicy::kGlobalCacheAware)},
                   {1, 0},
                   {0, 1}})
    ->Unit(benchmark::kMicrosecond);

void BM_PrefixMatchOnly(benchmark::State& state) {
  BenchCluster cluster(static_cast<uint32_t>(state.range(0)));
  kv::PrefixMatch match;
  const auto& trace = conversation();
  size_t r = 0;
  for (auto _ : state) {
    cluster.block_index().match_prefix(trace[r].block_keys, match);
    benchmark::DoNotOptimize(match);
    r = r + 1 == trace.size() ? 0 : r + 1;
  }
  state.counters["matches/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PrefixMatchOnly)->Arg(16)->Arg(1024)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
