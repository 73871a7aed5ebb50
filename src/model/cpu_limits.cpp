#include "model/cpu_limits.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>

#include "model/packed_linear.h"

namespace crescent::model {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

void set_compute_threads(int threads) {
  omp_set_num_threads(std::max(threads, 1));
}

int compute_threads() {
  return omp_get_max_threads();
}

namespace {

// Runs `pass` (2·m·n·k FLOPs of `shapes` each time) as sgemm_flops_per_s describes; its FLOP/s.
template <typename Pass>
double flops_per_s(const std::vector<GemmShape>& shapes, double seconds, Pass&& pass) {
  double flops_per_pass = 0;
  for (const GemmShape& s : shapes) {
    flops_per_pass += 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
  }
  pass();
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    const Clock::time_point start = Clock::now();
    int64_t passes = 0;
    do {
      pass();
      ++passes;
    } while (seconds_since(start) < seconds / 3);
    best = std::max(best, flops_per_pass * static_cast<double>(passes) / seconds_since(start));
  }
  return best;
}

}  // namespace

double sgemm_flops_per_s(const std::vector<GemmShape>& shapes, double seconds) {
  int64_t a_size = 0, b_size = 0, c_size = 0;
  for (const GemmShape& s : shapes) {
    a_size = std::max(a_size, s.m * s.k);
    b_size = std::max(b_size, s.n * s.k);
    c_size = std::max(c_size, s.m * s.n);
  }
  std::vector<float> a(static_cast<size_t>(a_size), 0.01f), b(static_cast<size_t>(b_size), 0.02f);
  std::vector<float> c(static_cast<size_t>(c_size));
  const int previous = openblas_get_num_threads();
  openblas_set_num_threads(compute_threads());
  const double rate = flops_per_s(shapes, seconds, [&] {
    for (const GemmShape& s : shapes) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(s.m), static_cast<int>(s.n),
                  static_cast<int>(s.k), 1, a.data(), static_cast<int>(s.k), b.data(), static_cast<int>(s.k),
                  0, c.data(), static_cast<int>(s.n));
    }
  });
  openblas_set_num_threads(previous);
  return rate;
}

double packed_matmul_flops_per_s(const std::vector<GemmShape>& shapes, double seconds) {
  std::vector<PackedLinear> layers;
  int64_t a_size = 0, c_size = 0;
  for (const GemmShape& s : shapes) {
    layers.emplace_back(std::vector<float>(static_cast<size_t>(s.n * s.k), 0.02f), s.n, s.k);
    a_size = std::max(a_size, s.m * s.k);
    c_size = std::max(c_size, s.m * s.n);
  }
  std::vector<float> a(static_cast<size_t>(a_size), 0.01f), c(static_cast<size_t>(c_size));
  return flops_per_s(shapes, seconds, [&] {
    for (size_t i = 0; i < shapes.size(); ++i) layers[i].apply(a.data(), shapes[i].m, c.data(), false);
  });
}

double memory_read_bytes_per_s(int64_t bytes, int threads, int rounds) {
  threads = std::max(threads, 1);
  const auto words = static_cast<size_t>(bytes / 8);
  std::vector<uint64_t> buffer(words);
  std::iota(buffer.begin(), buffer.end(), uint64_t{1});  // touched: every page is resident
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  double best = 0;
  for (int round = 0; round < rounds; ++round) {
    const Clock::time_point start = Clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const size_t begin = words * static_cast<size_t>(t) / static_cast<size_t>(threads);
        const size_t end = words * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
        uint64_t sum = 0;
        for (size_t i = begin; i < end; ++i) sum += buffer[i];
        sums[static_cast<size_t>(t)] = sum;
      });
    }
    for (std::thread& w : workers) w.join();
    best = std::max(best, static_cast<double>(words * 8) / seconds_since(start));
  }
  // The sums are used, so the reads are not optimized away.
  volatile uint64_t sink = std::accumulate(sums.begin(), sums.end(), uint64_t{0});
  (void)sink;
  return best;
}

ResidentMemory resident_memory() {
  ResidentMemory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    const auto kib = [&] { return std::stoll(line.substr(line.find(':') + 1)) * 1024; };
    if (line.starts_with("VmRSS:")) m.rss_bytes = kib();
    if (line.starts_with("VmHWM:")) m.peak_rss_bytes = kib();
  }
  return m;
}

}  // namespace crescent::model
