// Simulator speed on the shipped conversation trace: one full replay per policy (all five) on the paper-fig5
// cluster. At cluster scale: sim_scale_bench.cpp.
// Reports simulated requests/s and events/s (arrivals, prefill completions, KV arrivals, decode steps).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <iostream>

#include "cluster/cluster_config.h"
#include "sim/simulator.h"
#include "trace/reader.h"

namespace {

using crescent::conductor::PrefillPolicy;

const std::vector<crescent::trace::Request>& conversation() {
  static const auto trace = [] {
    auto t = crescent::trace::read_trace(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz", {});
    if (!t.ok()) {
      std::cerr << t.status().to_string() << "\n";
      std::exit(1);
    }
    return std::move(t).value();
  }();
  return trace;
}

const crescent::cluster::ClusterConfig& paper_fig5() {
  static const auto config = [] {
    auto c = crescent::cluster::load_cluster_config(CRESCENT_SOURCE_DIR "/configs/paper-fig5.json", 512);
    if (!c.ok()) {
      std::cerr << c.status().to_string() << "\n";
      std::exit(1);
    }
    return std::move(c).value();
  }();
  return config;
}

void BM_SimulateConversation(benchmark::State& state) {
  const auto policy = static_cast<PrefillPolicy>(state.range(0));
  const auto& trace = conversation();
  int64_t events = 0;
  for (auto _ : state) {
    auto result = crescent::sim::simulate(paper_fig5(), trace, {.policy = policy});
    benchmark::DoNotOptimize(result);
    events += result->counters.events;
  }
  state.SetLabel(std::string(crescent::conductor::to_string(policy)));
  state.counters["requests/s"] =
      benchmark::Counter(static_cast<double>(trace.size() * state.iterations()), benchmark::Counter::kIsRate);
  state.counters["events/s"] = benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SimulateConversation)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();

// Baseline in the same process: reading and validating the gzip trace (what every simulate run also pays).
void BM_ReadConversationTrace(benchmark::State& state) {
  for (auto _ : state) {
    auto t = crescent::trace::read_trace(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz", {});
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_ReadConversationTrace)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
