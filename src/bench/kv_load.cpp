#include "bench/kv_load.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <mutex>
#include <thread>
#include <vector>

#include "common/child_process.h"  // IgnoreSigpipe
#include "common/percentile.h"

namespace crescent::bench {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

KvRunResult drive_kv_load(const KvRunSpec& spec,
                          const std::function<Result<KvWorker>(int thread_index)>& make_worker) {
  KvRunResult result;
  result.spec = spec;
  if (spec.threads < 1 || spec.batch < 1 || spec.duration.count() <= 0) {
    result.error = fmt::format("threads {}, batch {}, duration {} ms: each must be positive", spec.threads,
                               spec.batch, spec.duration.count());
    return result;
  }
  IgnoreSigpipe ignore_sigpipe;
  std::vector<KvWorker> workers;
  for (int i = 0; i < spec.threads; ++i) {
    Result<KvWorker> worker = make_worker(i);
    if (!worker.ok()) {
      result.error = fmt::format("{} worker {}: {}", spec.system, i, worker.status().message());
      return result;
    }
    workers.push_back(std::move(worker).value());
  }

  std::atomic<bool> stop{false};
  std::mutex error_mu;
  std::string error;
  Clock::time_point phase_start;  // set by the barrier's completion, read by every thread after it
  std::barrier sync(spec.threads, [&]() noexcept { phase_start = Clock::now(); });
  std::vector<std::vector<double>> call_us(spec.threads);
  std::vector<Clock::time_point> finished(spec.threads);
  const auto call = [&](int i) {
    Status status = workers[i]();
    if (status.ok()) return true;
    std::lock_guard lock(error_mu);
    if (error.empty()) error = fmt::format("{} thread {}: {}", spec.system, i, status.message());
    stop = true;
    return false;
  };
  const auto body = [&](int i) {
    sync.arrive_and_wait();
    const Clock::time_point warm_end = phase_start + spec.duration / 10;
    for (int n = 0; !stop && (n < 3 || Clock::now() < warm_end) && call(i); ++n) {
    }
    sync.arrive_and_wait();  // the timed window starts for every thread at once
    const Clock::time_point end = phase_start + spec.duration;
    while (!stop) {
      const Clock::time_point t0 = Clock::now();
      if (t0 >= end || !call(i)) break;
      finished[i] = Clock::now();
      call_us[i].push_back(std::chrono::duration<double, std::micro>(finished[i] - t0).count());
    }
  };
  {
    std::vector<std::jthread> threads;
    for (int i = 0; i < spec.threads; ++i) threads.emplace_back(body, i);
  }
  if (!error.empty()) {
    result.error = error;
    return result;
  }
  std::vector<double> all_us;
  for (const auto& v : call_us) all_us.insert(all_us.end(), v.begin(), v.end());
  const Clock::time_point last = *std::max_element(finished.begin(), finished.end());
  result.seconds = std::max(0.0, std::chrono::duration<double>(last - phase_start).count());
  result.ops = all_us.size() * spec.batch;
  result.bytes = result.ops * spec.value_bytes;
  if (result.seconds > 0) {
    result.gbps = static_cast<double>(result.bytes) / result.seconds / 1e9;
    result.ops_per_s = static_cast<double>(result.ops) / result.seconds;
  }
  std::sort(all_us.begin(), all_us.end());
  result.p50_us = nearest_rank(all_us, 50);
  result.p99_us = nearest_rank(all_us, 99);
  return result;
}

}  // namespace crescent::bench
