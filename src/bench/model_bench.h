// The model bench (`crescent bench model`, issue 11 §3, docs/benchmarks.md): the CPU executor's speed
// against this machine's limits measured in the same run. Prefill tokens/s over prompt lengths, as a share
// of the BLAS library's SGEMM FLOP rate at the model's own matrix shapes; decode step time over batch sizes
// and context lengths, as a share of the memory bandwidth bound (weights + the batch's KV bytes read once per
// step ÷ measured read bandwidth); the weights' and KV cache's budgets and the process's resident memory.
// Prints nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace crescent::bench {

struct ModelBenchReport;

/// What `bench model` runs.
struct ModelBenchOptions {
  std::string model_dir;         // a model directory; empty: `preset` generated (seed 1) in a temp dir
  std::string preset = "small";  // model::llama_preset name, used without model_dir
  int threads = 0;               // compute threads (model::set_compute_threads); <= 0: leave as they are
  std::vector<int64_t> prefill_tokens = {128, 512, 2048};  // prompt lengths, each in [1, context window]
  std::vector<int64_t> batch = {1, 4, 16};                 // decode batch sizes, each >= 1
  std::vector<int64_t> context_tokens = {128, 512, 2048};  // decode context lengths, each in [0, window)
  int64_t block_size_tokens = 64;                          // KV block size
  double seconds = 1;  // minimum seconds per measurement (each is also run at least 3 times, after a warm-up)
  /// Buffer the memory read bandwidth is measured over (keep far above the caches).
  int64_t bandwidth_buffer_bytes = int64_t{1} << 30;
  /// Called with the report so far: once the limits are measured, then after each prefill and each decode
  /// row (progress display); may be empty.
  std::function<void(const ModelBenchReport&)> progress;
};

/// The model that ran.
struct ModelBenchModel {
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t parameters = 0;
  std::string dtype;  // as stored: "F32" or "BF16" (safetensors names); it computes in fp32
  int64_t kv_bytes_per_token = 0;
};

/// This machine's limits, measured in the run.
struct ModelBenchLimits {
  double sgemm_flops_per_s = 0;           // the faster of the two below: what a prefill is judged against
  double openblas_sgemm_flops_per_s = 0;  // OpenBLAS cblas_sgemm at the model's 4 weight shapes
  double onednn_matmul_flops_per_s = 0;   // oneDNN's packed matmul (what the linear layers run), same shapes
  int64_t sgemm_rows = 0;                 // rows (tokens) of those products: min(longest prompt, 512)
  double memory_read_bytes_per_s = 0;     // on the compute threads, over bandwidth_buffer_bytes
};

/// One prompt length's prefill: the best of the runs.
struct ModelBenchPrefill {
  int64_t tokens = 0;
  double seconds = 0;
  double tokens_per_s = 0;  // tokens / seconds
  double flops_per_s = 0;   // the forward pass's FLOPs / seconds
  double of_sgemm = 0;      // flops_per_s / limits.sgemm_flops_per_s
};

/// One decode step of `batch` sequences of `context_tokens` each (one new token per sequence).
struct ModelBenchDecode {
  int64_t batch = 0;
  int64_t context_tokens = 0;
  double step_seconds = 0;   // the best of the runs
  double bytes_read = 0;     // weights + batch x (context + 1) x KV bytes per token
  double bound_seconds = 0;  // bytes_read / limits.memory_read_bytes_per_s
  double of_bound = 0;       // bound_seconds / step_seconds
};

/// Memory of the run.
struct ModelBenchMemory {
  int64_t weight_bytes = 0;    // fp32, as computed
  int64_t kv_cache_bytes = 0;  // kv_cache_blocks x block bytes
  int64_t kv_cache_blocks = 0;
  int64_t rss_bytes = 0;       // this process's, at the end (model::resident_memory)
  int64_t peak_rss_bytes = 0;  // with the bandwidth buffer
};

/// Everything one model bench measured.
struct ModelBenchReport {
  ModelBenchModel model;
  int threads = 0;  // compute threads the forward pass ran on
  ModelBenchLimits limits;
  std::vector<ModelBenchPrefill> prefill;  // in prefill_tokens order
  std::vector<ModelBenchDecode> decode;    // batch-major, then context_tokens order
  ModelBenchMemory memory;                 // filled last
};

/// Loads (or generates) the model, measures the limits, then every prefill and decode configuration.
/// Errors: the preset's, generating's or loading's; kInvalidArgument for a length outside the model's
/// context window, an empty list, a batch or block size below 1 (messages name the `crescent bench model`
/// flag).
Result<ModelBenchReport> run_model_bench(const ModelBenchOptions& options);

}  // namespace crescent::bench
