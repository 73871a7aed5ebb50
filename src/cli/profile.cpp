// `crescent profile`: fits the cost model's coefficients to an executor's timed iterations (issue 11 §4) and
// writes a profile that simulate, experiment and serve take with --profile (or a config's "profile").
//   crescent profile --executor cpu --model DIR [--threads N] [--neighbour-core C] --out profile.json
//   crescent profile --executor mock [--config FILE] --out profile.json   (must give back the roofline's)
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cluster/cluster_config.h"
#include "common/atomic_file.h"
#include "model/cpu_limits.h"
#include "model/profiler.h"

namespace crescent::cli {
namespace {

struct ProfileArgs {
  std::string executor = "cpu";
  std::string model_dir;
  std::string config_path;
  std::string out;
  int threads = 0;
  int64_t block_size = 64;
  int repeats = 3;
  bool quick = false;
  std::optional<int> neighbour_core;
};

void print_report(const model::ProfileReport& r, const perf::Profile* truth) {
  const perf::Profile& p = r.profile;
  fmt::print("{:<32} {:>14}{}\n", "coefficient", "fitted",
             truth ? fmt::format(" {:>14} {:>9}", "roofline", "error") : "");
  const auto row = [&](const char* name, double fitted, double expected) {
    std::string tail;
    if (truth) {
      tail = fmt::format(" {:>14.6g} {:>8.2f}%", expected,
                         expected > 0 ? 100 * (fitted - expected) / expected : 100 * fitted);
    }
    fmt::print("{:<32} {:>14.6g}{}\n", name, fitted, tail);
  };
  const perf::Profile zero;
  const perf::Profile& t = truth ? *truth : zero;
  row("linear_s_per_token", p.linear_s_per_token, t.linear_s_per_token);
  row("attention_s_per_token_context", p.attention_s_per_token_context, t.attention_s_per_token_context);
  row("decode_weight_read_s", p.decode_weight_read_s, t.decode_weight_read_s);
  row("decode_s_per_request", p.decode_s_per_request, t.decode_s_per_request);
  row("decode_kv_read_s_per_token", p.decode_kv_read_s_per_token, t.decode_kv_read_s_per_token);
  row("prefill_iteration_overhead_s", p.prefill_iteration_overhead_s, t.prefill_iteration_overhead_s);
  fmt::print("residuals (RMS, relative): prefill {:.1f}%, decode {:.1f}% over {} points\n",
             100 * r.prefill_rms_relative, 100 * r.decode_rms_relative, r.points.size());
  if (!r.chunked.empty()) {
    fmt::print(
        "\nchunked prefill beside a decode batch: the prompt whole (one iteration) vs in chunks, measured "
        "and "
        "as the fitted profile predicts\n");
    fmt::print("{:>7} {:>7} {:>10} {:>11} {:>12} {:>13} {:>15}\n", "chunk", "chunks", "whole s", "chunked s",
               "extra/chunk", "predicted s", "predicted extra");
    for (const model::ChunkedPrefill& m : r.chunked) {
      const double extra = (m.chunked_s - m.whole_s) / static_cast<double>(m.chunks - 1);
      const double predicted_extra =
          (m.predicted_chunked_s - m.predicted_whole_s) / static_cast<double>(m.chunks - 1);
      fmt::print("{:>7} {:>7} {:>10.4f} {:>11.4f} {:>12.5f} {:>13.4f} {:>15.5f}\n", m.chunk_tokens, m.chunks,
                 m.whole_s, m.chunked_s, extra, m.predicted_chunked_s, predicted_extra);
    }
  }
}

int run_profile(const ProfileArgs& args) {
  if (args.executor != "cpu" && args.executor != "mock") {
    return fail(
        Status::invalid_argument(fmt::format("--executor must be cpu or mock, got \"{}\"", args.executor)));
  }
  if (args.block_size < 1) return fail(Status::invalid_argument("--block-size must be >= 1"));
  if (args.repeats < 1) return fail(Status::invalid_argument("--repeats must be >= 1"));
  if (args.neighbour_core && args.executor != "cpu") {
    return fail(
        Status::invalid_argument("--neighbour-core needs --executor cpu (the mock's time is the model's)"));
  }
  model::ProfileGrid grid;
  grid.repeats = args.repeats;
  if (args.quick) {  // seconds, not minutes: for tests and a first look
    grid.prefill_tokens = {32, 64, 128};
    grid.prefix_tokens = {0, 4 * args.block_size};
    grid.decode_batch = {1, 2, 4};
    grid.decode_context = {64, 256};
    grid.chunked_prompt_tokens = 256;
    grid.chunk_tokens = {64, 128};
    grid.chunked_decode_batch = 2;
    grid.chunked_decode_context = 128;
  }
  for (int64_t p : grid.prefix_tokens) {
    if (p % args.block_size != 0) {
      return fail(Status::invalid_argument(
          fmt::format("--block-size {} must divide the prefix sizes ({})", args.block_size, p)));
    }
  }
  const auto progress = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  Result<model::ProfileReport> report = Status::internal("not run");
  std::optional<perf::Profile> truth;
  if (args.executor == "mock") {
    auto config = load_cluster_config_or_default(args.config_path, args.block_size);
    if (!config.ok()) return fail(config.status());
    config->profile.reset();  // the mock's own roofline is what must come back
    const perf::CostModel cost = cluster::cost_model(*config);
    truth = cost.coefficients();
    auto target = model::mock_profile_target(cost);
    report = model::profile_target(
        *target, grid, fmt::format("mock: {} on {}", config->model.name, config->hardware.name), progress);
  } else {
    if (args.model_dir.empty()) {
      return fail(Status::invalid_argument(
          "--executor cpu needs --model DIR (a directory `crescent model init` writes)"));
    }
    if (args.threads > 0) model::set_compute_threads(args.threads);
    auto loaded = model::load_llama_model(args.model_dir);
    if (!loaded.ok()) return fail(loaded.status());
    const int64_t longest =
        std::max(grid.chunked_prompt_tokens, *std::ranges::max_element(grid.prefill_tokens) +
                                                 *std::ranges::max_element(grid.prefix_tokens));
    const int64_t decode_tokens = *std::ranges::max_element(grid.decode_batch) *
                                  (*std::ranges::max_element(grid.decode_context) + args.block_size);
    if (longest + 1 > loaded->config.max_position_embeddings) {
      return fail(Status::invalid_argument(
          fmt::format("the grid's longest prompt ({} tokens) exceeds the model's context of {}", longest,
                      loaded->config.max_position_embeddings)));
    }
    model::LlamaForward forward(*loaded);
    std::string source = fmt::format("cpu: {} ({} thread{})", args.model_dir, model::compute_threads(),
                                     model::compute_threads() == 1 ? "" : "s");
    std::unique_ptr<model::ProfileNeighbour> neighbour;
    if (args.neighbour_core) {
      // The other role's typical iteration: a prefill chunk of the longest grid prompt, or a decode step
      // over the grid's middle context.
      auto made = model::cpu_profile_neighbour(*loaded, *args.neighbour_core, args.block_size,
                                               *std::ranges::max_element(grid.prefill_tokens),
                                               grid.decode_context[grid.decode_context.size() / 2]);
      if (!made.ok()) return fail(made.status());
      neighbour = std::move(*made);
      source += fmt::format(", beside the other role on core {}", *args.neighbour_core);
    }
    *loaded = model::LlamaModel{};
    const int64_t blocks = 2 * (longest + decode_tokens) / args.block_size + 64;
    auto target = model::cpu_profile_target(forward, args.block_size, blocks);
    report = model::profile_target(*target, grid, source, progress, neighbour.get());
    if (neighbour) {
      progress(fmt::format("profile: the neighbour on core {} ran {} iterations beside the timed ones",
                           *args.neighbour_core, neighbour->iterations()));
    }
  }
  if (!report.ok()) return fail(report.status());
  print_report(*report, truth ? &*truth : nullptr);
  if (Status s = write_file_atomically(args.out, dump_json(model::to_json(*report), 2) + "\n"); !s.ok())
    return fail(s);
  fmt::print("wrote {}\n", args.out);
  return 0;
}

}  // namespace

void register_profile(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ProfileArgs>();
  CLI::App* cmd = app.add_subcommand(
      "profile",
      "Fit the cost model's coefficients to an executor's timed iterations; write a profile for --profile");
  cmd->add_option("--executor", args->executor,
                  "cpu (a model on this machine) or mock (the config's cost model)")
      ->capture_default_str();
  cmd->add_option("--model", args->model_dir, "With cpu: the model directory");
  cmd->add_option("--config", args->config_path,
                  "With mock: the cluster config whose cost model is profiled");
  cmd->add_option("--out", args->out, "Where to write the profile (JSON)")->required();
  cmd->add_option("--threads", args->threads,
                  "With cpu: compute threads (default: the cores this process may use)");
  cmd->add_option("--block-size", args->block_size, "KV block size, tokens")->capture_default_str();
  cmd->add_option("--repeats", args->repeats, "Times each point is measured (the median counts)")
      ->capture_default_str();
  cmd->add_flag("--quick", args->quick, "A small grid (seconds): for tests and a first look");
  cmd->add_option("--neighbour-core", args->neighbour_core,
                  "With cpu: time each point while a second copy of the model computes the other role on "
                  "this core (prefill beside decode steps, decode beside prefill), as a prefill and a "
                  "decode instance sharing this host do");
  cmd->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_profile(*args); }); });
}

}  // namespace crescent::cli
