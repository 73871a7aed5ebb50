// What this machine's CPUs can do, measured in the same run as the model's speed (issue 11 §3): the BLAS
// library's own SGEMM FLOP rate at the model's matrix shapes, and memory read bandwidth. A prefill is judged
// against the first, a decode step (which reads every weight and the batch's KV once) against the second.
#pragma once

#include <cstdint>
#include <vector>

namespace crescent::model {

/// Sets the threads the forward pass runs on (>= 1): oneDNN's matmuls and the attention tasks (OpenMP).
/// OpenBLAS, which computes each attention product on the thread that calls it, stays single-threaded
/// (LlamaForward sets it so: its own threads would spin against OpenMP's).
void set_compute_threads(int threads);
/// The threads the forward pass runs on.
int compute_threads();

/// A matrix product C[m, n] = A[m, k] × B[n, k]^T (a linear layer on m tokens).
struct GemmShape {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
};

/// FLOP/s of OpenBLAS's cblas_sgemm over `shapes`, on compute_threads() threads: each is run once to warm
/// up, then all of them in turn, repeatedly, for at least `seconds`; total 2·m·n·k FLOPs over the total time
/// of the best of three such rounds.
double sgemm_flops_per_s(const std::vector<GemmShape>& shapes, double seconds);
/// The same for oneDNN's matmul over packed weights (PackedLinear: what the model's linear layers run).
double packed_matmul_flops_per_s(const std::vector<GemmShape>& shapes, double seconds);

/// Bytes/s of reading a `bytes` buffer (far larger than the caches: >= 256 MiB) on `threads` threads, each
/// summing its slice as 64-bit integers; the best of `rounds` passes.
double memory_read_bytes_per_s(int64_t bytes, int threads, int rounds);

/// This process's resident set and its peak, bytes (/proc/self/status VmRSS and VmHWM; 0 when unknown).
struct ResidentMemory {
  int64_t rss_bytes = 0;
  int64_t peak_rss_bytes = 0;
};
ResidentMemory resident_memory();

}  // namespace crescent::model
