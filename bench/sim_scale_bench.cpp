// Simulator speed at cluster scale (issue 26 §2), the two runs docs/benchmarks.md reports:
//   - the conversation trace made 84 times larger (`crescent trace transform --copies 84`: 1,010,604
//     requests, generated into $TMPDIR on first use, not shipped) on paper-fig5 with 512 prefill + 512 decode
//     instances: wall time and the process's peak RSS;
//   - the four policies of `simulate --compare` on the conversation trace, one after another and one per
//     thread (common/parallel.h, as the CLI runs them), over one read of the trace.
// Each is one long iteration; run one at a time with --benchmark_filter. Like `crescent simulate`, the bench
// starts once more with a heap of huge pages (common/huge_pages.h).
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "cluster/cluster_config.h"
#include "common/huge_pages.h"
#include "common/parallel.h"
#include "sim/simulator.h"
#include "trace/reader.h"
#include "trace/transform.h"
#include "trace/writer.h"

namespace {

using namespace crescent;
using conductor::PrefillPolicy;

const std::string kConversation = CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz";

template <typename T>
T or_exit(Result<T> result) {
  if (!result.ok()) {
    std::cerr << result.status().to_string() << "\n";
    std::exit(1);
  }
  return std::move(result).value();
}

// The conversation trace in `copies` copies, written once to $TMPDIR and read back.
std::vector<trace::Request> conversation_copies(int64_t copies) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = fmt::format("{}/crescent-conversation-x{}.jsonl", tmp ? tmp : "/tmp", copies);
  if (!std::filesystem::exists(path)) {
    auto writer = or_exit(trace::TraceWriter::open(path));
    trace::TransformOptions options;
    options.copies = copies;
    or_exit(trace::transform_trace({kConversation}, options, *writer));
    if (Status s = writer->commit(); !s.ok()) {
      std::cerr << s.to_string() << "\n";
      std::exit(1);
    }
  }
  return or_exit(trace::read_trace(path, {}));
}

cluster::ClusterConfig paper_fig5(uint32_t prefill, uint32_t decode) {
  auto config = or_exit(cluster::load_cluster_config(CRESCENT_SOURCE_DIR "/configs/paper-fig5.json", 512));
  config.prefill_instances = prefill;
  config.decode_instances = decode;
  return config;
}

double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024;  // kilobytes on Linux
}

// Argument: copies of the conversation trace; the cluster is 512 + 512 instances whatever it is.
void BM_SimulateAtClusterScale(benchmark::State& state) {
  const auto trace = conversation_copies(state.range(0));
  const auto config = paper_fig5(512, 512);
  for (auto _ : state) {
    auto result = sim::simulate(config, trace, {.policy = PrefillPolicy::kGlobalCacheAware});
    if (!result.ok()) {
      state.SkipWithError(result.status().to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(result);
  }
  state.counters["requests"] = static_cast<double>(trace.size());
  state.counters["requests/s"] =
      benchmark::Counter(static_cast<double>(trace.size() * state.iterations()), benchmark::Counter::kIsRate);
  state.counters["peak_rss_GB"] = peak_rss_bytes() / 1e9;
}
BENCHMARK(BM_SimulateAtClusterScale)->Arg(84)->Arg(8)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

// Argument: threads (1: one policy after another).
void BM_CompareFourPolicies(benchmark::State& state) {
  const auto trace = or_exit(trace::read_trace(kConversation, {}));
  const auto config = paper_fig5(8, 8);
  const std::vector<PrefillPolicy> policies{PrefillPolicy::kRandom, PrefillPolicy::kLeastLoaded,
                                            PrefillPolicy::kCacheAware, PrefillPolicy::kGlobalCacheAware};
  for (auto _ : state) {
    parallel_for(policies.size(), static_cast<unsigned>(state.range(0)), [&](size_t i) {
      auto result = sim::simulate(config, trace, {.policy = policies[i]});
      benchmark::DoNotOptimize(result);
    });
  }
}
BENCHMARK(BM_CompareFourPolicies)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

// Runs with the heap `crescent simulate` has: of huge pages, where the kernel gives them when asked
// (common/huge_pages.h; CRESCENT_HUGE_PAGES=0 to compare without).
int main(int argc, char** argv) {
  crescent::reexec_with_huge_page_heap(argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
