// `crescent model`: model directories for the real executor (issue 11).
//   crescent model init --preset tiny|small --seed N --out DIR   seeded random weights, HF format
//   crescent model check DIR                                     read it back, every tensor checked
#include <fmt/format.h>

#include <memory>
#include <string>

#include "cli/commands.h"
#include "model/llama.h"

namespace crescent::cli {
namespace {

struct ModelArgs {
  std::string preset;
  uint64_t seed = 1;
  std::string out;
  std::string dtype = "float32";
  std::string dir;
};

// One line about `config`: its shape, size and KV bytes per token.
std::string describe(const model::LlamaConfig& c) {
  const int64_t parameters = c.parameters();
  return fmt::format(
      "{} layers, hidden {}, {} heads ({} KV), MLP {}, vocab {}, {:.1f}M parameters ({:.1f} MB of {}), KV {} "
      "bytes "
      "per token, context {} tokens",
      c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size,
      c.vocab_size, static_cast<double>(parameters) / 1e6,
      static_cast<double>(parameters * static_cast<int64_t>(model::dtype_bytes(c.dtype))) / 1e6,
      model::to_string(c.dtype), c.kv_bytes_per_token(), c.max_position_embeddings);
}

int run_init(const ModelArgs& args) {
  auto config = model::llama_preset(args.preset);
  if (!config.ok()) return fail(config.status());
  if (args.dtype != "float32" && args.dtype != "bfloat16") {
    return fail(
        Status::invalid_argument(fmt::format("--dtype must be float32 or bfloat16, got \"{}\"", args.dtype)));
  }
  config->dtype = args.dtype == "bfloat16" ? model::DType::kBF16 : model::DType::kF32;
  if (Status s = model::init_llama_model(*config, args.seed, args.out); !s.ok()) return fail(s);
  fmt::print("wrote {}: preset {}, seed {}: {}\n", args.out, args.preset, args.seed, describe(*config));
  return 0;
}

int run_check(const ModelArgs& args) {
  auto loaded = model::load_llama_model(args.dir);
  if (!loaded.ok()) return fail(loaded.status());
  fmt::print("{}: {} tensors, {}\n", args.dir, loaded->weights.tensors().size(), describe(loaded->config));
  return 0;
}

}  // namespace

void register_model(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ModelArgs>();
  CLI::App* cmd = app.add_subcommand("model", "Model directories (config.json + model.safetensors)");
  cmd->require_subcommand(1);
  CLI::App* init = cmd->add_subcommand("init", "Write a model of a preset with seeded random weights");
  init->add_option("--preset", args->preset, "tiny (tests) or small (about 100M parameters)")->required();
  init->add_option("--seed", args->seed, "Random seed: the same seed writes the same bytes")
      ->capture_default_str();
  init->add_option("--out", args->out, "The directory to write (created)")->required();
  init->add_option("--dtype", args->dtype, "Weights as float32 or bfloat16")->capture_default_str();
  init->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_init(*args); }); });
  CLI::App* check =
      cmd->add_subcommand("check", "Read a model directory and check every tensor against its config");
  check->add_option("dir", args->dir, "The model directory")->required();
  check->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_check(*args); }); });
}

}  // namespace crescent::cli
