// `crescent bench model`: the CPU executor's speed against this machine's limits measured in the same run
// (issue 11 §3). Prefill tokens/s over prompt lengths, as a share of the BLAS library's SGEMM FLOP rate at
// the model's own matrix shapes; decode step time over batch sizes and context lengths, as a share of the
// memory bandwidth bound (weights + the batch's KV bytes read once per step ÷ measured read bandwidth);
// the weights' and KV cache's budgets and the process's resident memory.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/temp_dir.h"
#include "model/cpu_limits.h"
#include "model/llama_forward.h"

namespace crescent::cli {
namespace {

struct BenchModelArgs {
  std::string model_dir;
  std::string preset = "small";
  int threads = 0;
  std::vector<int64_t> prefill_tokens = {128, 512, 2048};
  std::vector<int64_t> batch = {1, 4, 16};
  std::vector<int64_t> context = {128, 512, 2048};
  int64_t block_size = 64;
  double seconds = 1;
  bool json = false;
};

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

int run_bench_model(const BenchModelArgs& args) {
  if (args.threads > 0) model::set_compute_threads(args.threads);
  std::string dir = args.model_dir;
  TempDir temp;  // the generated model's, removed once it is loaded
  if (dir.empty()) {
    auto config = model::llama_preset(args.preset);
    if (!config.ok()) return fail(config.status());
    Result<TempDir> created = TempDir::create("crescent-bench-model");
    if (!created.ok()) return fail(created.status());
    temp = std::move(*created);
    if (Status s = model::init_llama_model(*config, 1, temp.path()); !s.ok()) return fail(s);
    dir = temp.path();
  }
  auto loaded = model::load_llama_model(dir);
  temp = TempDir();
  if (!loaded.ok()) return fail(loaded.status());
  for (int64_t v : args.prefill_tokens) {
    if (v < 1 || v > loaded->config.max_position_embeddings) {
      return fail(Status::invalid_argument(
          fmt::format("--prefill-tokens: {} is outside [1, {}]", v, loaded->config.max_position_embeddings)));
    }
  }
  for (int64_t v : args.context) {
    if (v < 0 || v >= loaded->config.max_position_embeddings) {
      return fail(Status::invalid_argument(
          fmt::format("--context: {} is outside [0, {})", v, loaded->config.max_position_embeddings)));
    }
  }
  for (int64_t v : args.batch) {
    if (v < 1) return fail(Status::invalid_argument(fmt::format("--batch: {} is below 1", v)));
  }
  if (args.block_size < 1) return fail(Status::invalid_argument("--block-size must be >= 1"));

  const model::LlamaConfig c = loaded->config;
  model::LlamaForward forward(*loaded);
  *loaded = model::LlamaModel{};  // the fp32 copy is what runs
  const int threads = model::compute_threads();
  const int64_t weight_bytes = c.parameters() * 4;  // fp32, as computed
  const int64_t kv_per_token = c.kv_bytes_per_token();
  const int64_t bs = args.block_size;
  const auto blocks_for = [&](int64_t tokens) { return (tokens + bs - 1) / bs; };
  const int64_t max_batch = *std::ranges::max_element(args.batch);
  const int64_t max_context = *std::ranges::max_element(args.context);
  const int64_t max_prompt = *std::ranges::max_element(args.prefill_tokens);
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
  const double openblas = model::sgemm_flops_per_s(shapes, args.seconds);
  const double onednn = model::packed_matmul_flops_per_s(shapes, args.seconds);
  const double sgemm = std::max(openblas, onednn);
  const double bandwidth = model::memory_read_bytes_per_s(int64_t{1} << 30, threads, 10);

  nlohmann::ordered_json report = {{"model",
                                    {{"layers", c.num_hidden_layers},
                                     {"hidden", d},
                                     {"parameters", c.parameters()},
                                     {"dtype", model::to_string(c.dtype)},
                                     {"kv_bytes_per_token", kv_per_token}}},
                                   {"threads", threads},
                                   {"limits",
                                    {{"sgemm_flops_per_s", sgemm},
                                     {"openblas_sgemm_flops_per_s", openblas},
                                     {"onednn_matmul_flops_per_s", onednn},
                                     {"sgemm_rows", m},
                                     {"memory_read_bytes_per_s", bandwidth}}}};
  fmt::print("model: {} layers, hidden {}, {:.1f}M parameters ({}), KV {} bytes/token; {} thread(s)\n",
             c.num_hidden_layers, d, static_cast<double>(c.parameters()) / 1e6, model::to_string(c.dtype),
             kv_per_token, threads);
  fmt::print(
      "limits: SGEMM {:.1f} GFLOP/s at the model's 4 weight shapes, {} rows (OpenBLAS sgemm {:.1f}, oneDNN "
      "matmul "
      "{:.1f}); memory read {:.1f} GB/s\n\n",
      sgemm / 1e9, m, openblas / 1e9, onednn / 1e9, bandwidth / 1e9);

  fmt::print("{:>14} {:>10} {:>12} {:>10} {:>9}\n", "prefill tokens", "time ms", "tokens/s", "GFLOP/s",
             "of SGEMM");
  nlohmann::json prefills = nlohmann::json::array();
  for (int64_t n : args.prefill_tokens) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 31) % c.vocab_size);
    const model::ForwardSequence seq{.tokens = tokens, .block_table = table};
    const double t = best_seconds(args.seconds, [&] { (void)forward.forward({&seq, 1}, cache); });
    const double flops = forward.prefill_flops(n, 0) / t;
    fmt::print("{:>14} {:>10.1f} {:>12.0f} {:>10.1f} {:>8.0f}%\n", n, t * 1e3, static_cast<double>(n) / t,
               flops / 1e9, 100 * flops / sgemm);
    prefills.push_back({{"tokens", n},
                        {"seconds", t},
                        {"tokens_per_s", static_cast<double>(n) / t},
                        {"flops_per_s", flops},
                        {"of_sgemm", flops / sgemm}});
  }
  report["prefill"] = prefills;

  fmt::print("\n{:>6} {:>8} {:>10} {:>10} {:>10} {:>10}\n", "batch", "context", "step ms", "MB read",
             "bound ms", "of bound");
  nlohmann::json decodes = nlohmann::json::array();
  const int64_t per_seq = blocks_for(max_context + 1);
  for (int64_t batch : args.batch) {
    for (int64_t context : args.context) {
      std::vector<int32_t> tokens(static_cast<size_t>(batch), 1);
      std::vector<model::ForwardSequence> seqs;
      for (int64_t s = 0; s < batch; ++s) {
        seqs.push_back({.tokens = std::span(tokens).subspan(static_cast<size_t>(s), 1),
                        .start_position = context,
                        .block_table = std::span(table).subspan(static_cast<size_t>(s * per_seq),
                                                                static_cast<size_t>(per_seq))});
      }
      const double t = best_seconds(args.seconds, [&] { (void)forward.forward(seqs, cache); });
      const double bytes = static_cast<double>(weight_bytes + batch * (context + 1) * kv_per_token);
      const double bound = bytes / bandwidth;
      fmt::print("{:>6} {:>8} {:>10.2f} {:>10.1f} {:>10.2f} {:>9.0f}%\n", batch, context, t * 1e3,
                 bytes / 1e6, bound * 1e3, 100 * bound / t);
      decodes.push_back({{"batch", batch},
                         {"context_tokens", context},
                         {"step_seconds", t},
                         {"bytes_read", bytes},
                         {"bound_seconds", bound},
                         {"of_bound", bound / t}});
    }
  }
  report["decode"] = decodes;

  const model::ResidentMemory rss = model::resident_memory();
  const int64_t kv_bytes = capacity_blocks * cache.layout().block_bytes();
  fmt::print(
      "\nmemory: weights {:.0f} MB (fp32 as computed), KV cache {:.0f} MB ({} blocks of {} tokens), "
      "RSS {:.0f} MB, peak {:.0f} MB (with the 1 GiB bandwidth buffer)\n",
      static_cast<double>(weight_bytes) / 1e6, static_cast<double>(kv_bytes) / 1e6, capacity_blocks, bs,
      static_cast<double>(rss.rss_bytes) / 1e6, static_cast<double>(rss.peak_rss_bytes) / 1e6);
  report["memory"] = {{"weight_bytes", weight_bytes},
                      {"kv_cache_bytes", kv_bytes},
                      {"rss_bytes", rss.rss_bytes},
                      {"peak_rss_bytes", rss.peak_rss_bytes}};
  if (args.json) fmt::print("{}\n", dump_json(report, 2));
  return 0;
}

}  // namespace

void register_bench_model(CLI::App& bench_cmd, int& exit_code) {
  auto args = std::make_shared<BenchModelArgs>();
  CLI::App* cmd = bench_cmd.add_subcommand(
      "model",
      "The CPU executor's prefill and decode speed against SGEMM and memory bandwidth measured here");
  cmd->add_option("--model", args->model_dir, "A model directory (default: --preset, seeded, in a temp dir)");
  cmd->add_option("--preset", args->preset, "The preset to generate without --model")->capture_default_str();
  cmd->add_option("--threads", args->threads, "Compute threads (default: the cores this process may use)");
  cmd->add_option("--prefill-tokens", args->prefill_tokens, "Prompt lengths to prefill")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--batch", args->batch, "Decode batch sizes")->delimiter(',')->capture_default_str();
  cmd->add_option("--context", args->context, "Decode context lengths, tokens")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--block-size", args->block_size, "KV block size, tokens")->capture_default_str();
  cmd->add_option("--seconds", args->seconds, "Minimum seconds per measurement")->capture_default_str();
  cmd->add_flag("--json", args->json, "Also print the report as JSON");
  cmd->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_bench_model(*args); }); });
}

}  // namespace crescent::cli
