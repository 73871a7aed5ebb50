// `crescent bench model`: the CPU executor's speed against this machine's limits measured in the same run
// (issue 11 §3). This file parses the flags and prints the rows as they are measured; the measurement code
// is bench/model_bench.h.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/model_bench.h"
#include "cli/commands.h"

namespace crescent::cli {
namespace {

using bench::ModelBenchDecode;
using bench::ModelBenchOptions;
using bench::ModelBenchPrefill;
using bench::ModelBenchReport;

struct BenchModelArgs {
  ModelBenchOptions options;  // the flags' defaults are the options'
  bool json = false;
};

// The text report, printed as the bench goes: the model and the limits, then each row once measured.
class TextPrinter {
 public:
  // The lines of what `report` holds beyond what was printed already.
  void print_new(const ModelBenchReport& report) {
    if (!head_printed_) {
      const bench::ModelBenchModel& m = report.model;
      const bench::ModelBenchLimits& l = report.limits;
      fmt::print("model: {} layers, hidden {}, {:.1f}M parameters ({}), KV {} bytes/token; {} thread(s)\n",
                 m.layers, m.hidden, static_cast<double>(m.parameters) / 1e6, m.dtype, m.kv_bytes_per_token,
                 report.threads);
      fmt::print(
          "limits: SGEMM {:.1f} GFLOP/s at the model's 4 weight shapes, {} rows (OpenBLAS sgemm {:.1f}, "
          "oneDNN "
          "matmul "
          "{:.1f}); memory read {:.1f} GB/s\n\n",
          l.sgemm_flops_per_s / 1e9, l.sgemm_rows, l.openblas_sgemm_flops_per_s / 1e9,
          l.onednn_matmul_flops_per_s / 1e9, l.memory_read_bytes_per_s / 1e9);
      fmt::print("{:>14} {:>10} {:>12} {:>10} {:>9}\n", "prefill tokens", "time ms", "tokens/s", "GFLOP/s",
                 "of SGEMM");
      head_printed_ = true;
    }
    for (; prefills_printed_ < report.prefill.size(); ++prefills_printed_) {
      const ModelBenchPrefill& p = report.prefill[prefills_printed_];
      fmt::print("{:>14} {:>10.1f} {:>12.0f} {:>10.1f} {:>8.0f}%\n", p.tokens, p.seconds * 1e3,
                 p.tokens_per_s, p.flops_per_s / 1e9, 100 * p.flops_per_s / report.limits.sgemm_flops_per_s);
    }
    if (!report.decode.empty()) print_decode_head();
    for (; decodes_printed_ < report.decode.size(); ++decodes_printed_) {
      const ModelBenchDecode& d = report.decode[decodes_printed_];
      fmt::print("{:>6} {:>8} {:>10.2f} {:>10.1f} {:>10.2f} {:>9.0f}%\n", d.batch, d.context_tokens,
                 d.step_seconds * 1e3, d.bytes_read / 1e6, d.bound_seconds * 1e3,
                 100 * d.bound_seconds / d.step_seconds);
    }
  }

  // The closing memory line.
  void print_end(const ModelBenchReport& report) {
    print_new(report);
    print_decode_head();
    const bench::ModelBenchMemory& m = report.memory;
    fmt::print(
        "\nmemory: weights {:.0f} MB (fp32 as computed), KV cache {:.0f} MB ({} blocks of {} tokens), "
        "RSS {:.0f} MB, peak {:.0f} MB (with the 1 GiB bandwidth buffer)\n",
        static_cast<double>(m.weight_bytes) / 1e6, static_cast<double>(m.kv_cache_bytes) / 1e6,
        m.kv_cache_blocks, block_size_tokens_, static_cast<double>(m.rss_bytes) / 1e6,
        static_cast<double>(m.peak_rss_bytes) / 1e6);
  }

  explicit TextPrinter(int64_t block_size_tokens) : block_size_tokens_(block_size_tokens) {}

 private:
  void print_decode_head() {
    if (decode_head_printed_) return;
    fmt::print("\n{:>6} {:>8} {:>10} {:>10} {:>10} {:>10}\n", "batch", "context", "step ms", "MB read",
               "bound ms", "of bound");
    decode_head_printed_ = true;
  }

  int64_t block_size_tokens_;
  bool head_printed_ = false;
  bool decode_head_printed_ = false;
  size_t prefills_printed_ = 0;
  size_t decodes_printed_ = 0;
};

nlohmann::ordered_json report_json(const ModelBenchReport& report) {
  const bench::ModelBenchLimits& l = report.limits;
  nlohmann::ordered_json out = {{"model",
                                 {{"layers", report.model.layers},
                                  {"hidden", report.model.hidden},
                                  {"parameters", report.model.parameters},
                                  {"dtype", report.model.dtype},
                                  {"kv_bytes_per_token", report.model.kv_bytes_per_token}}},
                                {"threads", report.threads},
                                {"limits",
                                 {{"sgemm_flops_per_s", l.sgemm_flops_per_s},
                                  {"openblas_sgemm_flops_per_s", l.openblas_sgemm_flops_per_s},
                                  {"onednn_matmul_flops_per_s", l.onednn_matmul_flops_per_s},
                                  {"sgemm_rows", l.sgemm_rows},
                                  {"memory_read_bytes_per_s", l.memory_read_bytes_per_s}}}};
  // The rows are nlohmann::json objects (keys sorted), as they always were.
  nlohmann::json prefills = nlohmann::json::array();
  for (const ModelBenchPrefill& p : report.prefill) {
    prefills.push_back({{"tokens", p.tokens},
                        {"seconds", p.seconds},
                        {"tokens_per_s", p.tokens_per_s},
                        {"flops_per_s", p.flops_per_s},
                        {"of_sgemm", p.of_sgemm}});
  }
  out["prefill"] = prefills;
  nlohmann::json decodes = nlohmann::json::array();
  for (const ModelBenchDecode& d : report.decode) {
    decodes.push_back({{"batch", d.batch},
                       {"context_tokens", d.context_tokens},
                       {"step_seconds", d.step_seconds},
                       {"bytes_read", d.bytes_read},
                       {"bound_seconds", d.bound_seconds},
                       {"of_bound", d.of_bound}});
  }
  out["decode"] = decodes;
  out["memory"] = {{"weight_bytes", report.memory.weight_bytes},
                   {"kv_cache_bytes", report.memory.kv_cache_bytes},
                   {"rss_bytes", report.memory.rss_bytes},
                   {"peak_rss_bytes", report.memory.peak_rss_bytes}};
  return out;
}

int run_bench_model(const BenchModelArgs& args) {
  ModelBenchOptions options = args.options;
  TextPrinter printer(options.block_size_tokens);
  options.progress = [&](const ModelBenchReport& report) { printer.print_new(report); };
  Result<ModelBenchReport> report = bench::run_model_bench(options);
  if (!report.ok()) return fail(report.status());
  printer.print_end(*report);
  if (args.json) fmt::print("{}\n", dump_json(report_json(*report), 2));
  return 0;
}

}  // namespace

void register_bench_model(CLI::App& bench_cmd, int& exit_code) {
  auto args = std::make_shared<BenchModelArgs>();
  ModelBenchOptions& o = args->options;
  CLI::App* cmd = bench_cmd.add_subcommand(
      "model",
      "The CPU executor's prefill and decode speed against SGEMM and memory bandwidth measured here");
  cmd->add_option("--model", o.model_dir, "A model directory (default: --preset, seeded, in a temp dir)");
  cmd->add_option("--preset", o.preset, "The preset to generate without --model")->capture_default_str();
  cmd->add_option("--threads", o.threads, "Compute threads (default: the cores this process may use)");
  cmd->add_option("--prefill-tokens", o.prefill_tokens, "Prompt lengths to prefill")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--batch", o.batch, "Decode batch sizes")->delimiter(',')->capture_default_str();
  cmd->add_option("--context", o.context_tokens, "Decode context lengths, tokens")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--block-size", o.block_size_tokens, "KV block size, tokens")->capture_default_str();
  cmd->add_option("--seconds", o.seconds, "Minimum seconds per measurement")->capture_default_str();
  cmd->add_flag("--json", args->json, "Also print the report as JSON");
  cmd->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_bench_model(*args); }); });
}

}  // namespace crescent::cli
