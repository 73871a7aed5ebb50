#include "bench/model_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <span>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "model/cpu_limits.h"
#include "model/llama_forward.h"

namespace crescent::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The best time of `run` over at least 3 runs and `seconds` (after one warm-up run).
template <typename F>
double best_seconds(double seconds, F&& run) {
  run();
  double best = 1e30, total = 0;
  for (int i = 0; i < 3 || total < seconds; ++i) {
    const Clock::time_point start = Clock::now();
    run();
    const double t = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, t);
    total += t;
  }
  return best;
}

// The model of `options`: loaded from model_dir, or the preset generated in a temp dir removed once loaded.
Result<model::LlamaModel> load_model(const ModelBenchOptions& options) {
  if (!options.model_dir.empty()) return model::load_llama_model(options.model_dir);
  auto config = model::llama_preset(options.preset);
  if (!config.ok()) return config.status();
  Result<TempDir> dir = TempDir::create("crescent-bench-model");
  if (!dir.ok()) return dir.status();
  if (Status s = model::init_llama_model(*config, 1, dir->path()); !s.ok()) return s;
  return model::load_llama_model(dir->path());
}

Status check_options(const ModelBenchOptions& options, const model::LlamaConfig& config) {
  if (options.prefill_tokens.empty()) return Status::invalid_argument("--prefill-tokens: no length");
  if (options.batch.empty()) return Status::invalid_argument("--batch: no batch size");
  if (options.context_tokens.empty()) return Status::invalid_argument("--context: no length");
  for (int64_t v : options.prefill_tokens) {
    if (v < 1 || v > config.max_position_embeddings) {
      return Status::invalid_argument(
          fmt::format("--prefill-tokens: {} is outside [1, {}]", v, config.max_position_embeddings));
    }
  }
  for (int64_t v : options.context_tokens) {
    if (v < 0 || v >= config.max_position_embeddings) {
      return Status::invalid_argument(
          fmt::format("--context: {} is outside [0, {})", v, config.max_position_embeddings));
    }
  }
  for (int64_t v : options.batch) {
    if (v < 1) return Status::invalid_argument(fmt::format("--batch: {} is below 1", v));
  }
  if (options.block_size_tokens < 1) return Status::invalid_argument("--block-size must be >= 1");
  return Status();
}

}  // namespace

Result<ModelBenchReport> run_model_bench(const ModelBenchOptions& options) {
  if (options.threads > 0) model::set_compute_threads(options.threads);
  Result<model::LlamaModel> loaded = load_model(options);
  if (!loaded.ok()) return loaded.status();
  CRESCENT_RETURN_IF_ERROR(check_options(options, loaded->config));

  const model::LlamaConfig c = loaded->config;
  model::LlamaForward forward(*loaded);
  *loaded = model::LlamaModel{};  // the fp32 copy is what runs
  ModelBenchReport report;
  report.threads = model::compute_threads();
  report.model = {.layers = c.num_hidden_layers,
                  .hidden = c.hidden_size,
                  .parameters = c.parameters(),
                  .dtype = std::string(model::to_string(c.dtype)),
                  .kv_bytes_per_token = c.kv_bytes_per_token()};
  const int64_t weight_bytes = c.parameters() * 4;  // fp32, as computed
  const int64_t kv_per_token = c.kv_bytes_per_token();
  const int64_t bs = options.block_size_tokens;
  const auto blocks_for = [&](int64_t tokens) { return (tokens + bs - 1) / bs; };
  const int64_t max_batch = *std::ranges::max_element(options.batch);
  const int64_t max_context = *std::ranges::max_element(options.context_tokens);
  const int64_t max_prompt = *std::ranges::max_element(options.prefill_tokens);
  const int64_t capacity_blocks = std::max(max_batch * blocks_for(max_context + 1), blocks_for(max_prompt));
  model::PagedKvCache cache(forward.kv_layout(bs), capacity_blocks);
  std::vector<int32_t> table(static_cast<size_t>(capacity_blocks));
  for (auto& b : table) b = cache.allocate().value();

  // Limits, in this run.
  const int64_t d = c.hidden_size, hd = c.head_dim();
  const int64_t m = std::min<int64_t>(max_prompt, 512);
  const std::vector<model::GemmShape> shapes = {
      {m, (c.num_attention_heads + 2 * c.num_key_value_heads) * hd, d},
      {m, d, c.num_attention_heads * hd},
      {m, 2 * c.intermediate_size, d},
      {m, d, c.intermediate_size}};
  // The product limit is the faster of OpenBLAS's sgemm and oneDNN's matmul (which the model's linear layers
  // run), on the same threads.
  ModelBenchLimits& limits = report.limits;
  limits.openblas_sgemm_flops_per_s = model::sgemm_flops_per_s(shapes, options.seconds);
  limits.onednn_matmul_flops_per_s = model::packed_matmul_flops_per_s(shapes, options.seconds);
  limits.sgemm_flops_per_s = std::max(limits.openblas_sgemm_flops_per_s, limits.onednn_matmul_flops_per_s);
  limits.sgemm_rows = m;
  limits.memory_read_bytes_per_s =
      model::memory_read_bytes_per_s(options.bandwidth_buffer_bytes, report.threads, 10);
  if (options.progress) options.progress(report);

  for (int64_t n : options.prefill_tokens) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 31) % c.vocab_size);
    const model::ForwardSequence seq{.tokens = tokens, .block_table = table};
    const double t = best_seconds(options.seconds, [&] { (void)forward.forward({&seq, 1}, cache); });
    const double flops = forward.prefill_flops(n, 0) / t;
    report.prefill.push_back({.tokens = n,
                              .seconds = t,
                              .tokens_per_s = static_cast<double>(n) / t,
                              .flops_per_s = flops,
                              .of_sgemm = flops / limits.sgemm_flops_per_s});
    if (options.progress) options.progress(report);
  }

  const int64_t per_seq = blocks_for(max_context + 1);
  for (int64_t batch : options.batch) {
    for (int64_t context : options.context_tokens) {
      std::vector<int32_t> tokens(static_cast<size_t>(batch), 1);
      std::vector<model::ForwardSequence> seqs;
      for (int64_t s = 0; s < batch; ++s) {
        seqs.push_back({.tokens = std::span(tokens).subspan(static_cast<size_t>(s), 1),
                        .start_position = context,
                        .block_table = std::span(table).subspan(static_cast<size_t>(s * per_seq),
                                                                static_cast<size_t>(per_seq))});
      }
      const double t = best_seconds(options.seconds, [&] { (void)forward.forward(seqs, cache); });
      const double bytes = static_cast<double>(weight_bytes + batch * (context + 1) * kv_per_token);
      const double bound = bytes / limits.memory_read_bytes_per_s;
      report.decode.push_back({.batch = batch,
                               .context_tokens = context,
                               .step_seconds = t,
                               .bytes_read = bytes,
                               .bound_seconds = bound,
                               .of_bound = bound / t});
      if (options.progress) options.progress(report);
    }
  }

  const model::ResidentMemory rss = model::resident_memory();
  report.memory = {.weight_bytes = weight_bytes,
                   .kv_cache_bytes = capacity_blocks * cache.layout().block_bytes(),
                   .kv_cache_blocks = capacity_blocks,
                   .rss_bytes = rss.rss_bytes,
                   .peak_rss_bytes = rss.peak_rss_bytes};
  return report;
}

}  // namespace crescent::bench
