// `crescent model`: model directories for the real executor (issue 11).
//   crescent model init --preset tiny|small --seed N --out DIR   seeded random weights, HF format
//       [--tokenizer FILE | --train-tokenizer TEXT [--tokenizer-vocab N]]   with a SentencePiece
//       tokenizer.model
//   crescent model check DIR                                     read it back, every tensor checked
//   crescent model run DIR --prompt TEXT [--max-tokens N ...]    generate in this process (one colocated
//                                                                engine with the cpu executor)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "common/atomic_file.h"
#include "engine/engine_core.h"
#include "kv/block_key.h"
#include "model/cpu_executor.h"
#include "model/llama.h"
#include "model/tokenizer.h"

namespace crescent::cli {
namespace {

struct ModelArgs {
  std::string preset;
  uint64_t seed = 1;
  std::string out;
  std::string dtype = "float32";
  std::string tokenizer;        // a SentencePiece model to copy in
  std::string train_tokenizer;  // a text file to train one on
  int64_t tokenizer_vocab = 2048;
  std::string dir;
  // run
  std::string prompt;
  int64_t max_tokens = 16;
  double temperature = 0;
  double top_p = 1;
  uint64_t run_seed = 0;
  int64_t block_size = 16;
  bool ignore_eos = false;
  bool json = false;
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
  const std::string tokenizer_path = (std::filesystem::path(args.out) / "tokenizer.model").string();
  std::string tokenizer_kind = "bytes";
  if (!args.tokenizer.empty() || !args.train_tokenizer.empty()) {
    // The tokenizer first: its vocabulary sizes the embedding and the LM head.
    if (Status s = ensure_writable_directory(args.out); !s.ok()) return fail(s);
    Status made;
    if (!args.tokenizer.empty()) {
      std::error_code ec;
      std::filesystem::copy_file(args.tokenizer, tokenizer_path,
                                 std::filesystem::copy_options::overwrite_existing, ec);
      if (ec)
        made = Status::invalid_argument(fmt::format("--tokenizer {}: {}", args.tokenizer, ec.message()));
    } else {
      made = model::train_sentencepiece(args.train_tokenizer, args.tokenizer_vocab, tokenizer_path);
    }
    if (!made.ok()) return fail(made);
    auto tokenizer = model::load_tokenizer(args.out, std::numeric_limits<int64_t>::max());
    if (!tokenizer.ok()) {
      std::filesystem::remove(tokenizer_path);
      return fail(tokenizer.status());
    }
    config->vocab_size = (*tokenizer)->vocab_size();
    tokenizer_kind = fmt::format("{} ({})", (*tokenizer)->kind(), tokenizer_path);
  } else if (std::filesystem::exists(tokenizer_path)) {
    return fail(
        Status::invalid_argument(fmt::format("{} is there from before and would not match the new model's "
                                             "256-token vocabulary: remove it, or give "
                                             "--tokenizer or --train-tokenizer",
                                             tokenizer_path)));
  }
  if (Status s = model::init_llama_model(*config, args.seed, args.out); !s.ok()) return fail(s);
  fmt::print("wrote {}: preset {}, seed {}: {}; tokenizer {}\n", args.out, args.preset, args.seed,
             describe(*config), tokenizer_kind);
  return 0;
}

int run_check(const ModelArgs& args) {
  auto loaded = model::load_llama_model(args.dir);
  if (!loaded.ok()) return fail(loaded.status());
  fmt::print("{}: {} tensors, {}\n", args.dir, loaded->weights.tensors().size(), describe(loaded->config));
  return 0;
}

// Listens to one request on a colocated engine: when it finished, and its tokens then.
class RunListener final : public engine::EngineListener {
 public:
  explicit RunListener(const model::CpuExecutor& executor) : executor_(executor) {}
  void on_prefill_start(engine::RequestId, double, const engine::PrefillStart&) override {}
  void on_first_token(engine::RequestId, double now_s) override { first_token_s = now_s; }
  void on_finished(engine::RequestId id, double now_s, const std::optional<engine::StepLog::Gaps>&) override {
    const auto out = executor_.output(id);
    tokens.assign(out.begin(), out.end());
    error = executor_.error(id);
    finished_s = now_s;
  }
  std::vector<int32_t> tokens;
  std::string error;
  double first_token_s = 0, finished_s = 0;

 private:
  const model::CpuExecutor& executor_;
};

int run_generate(const ModelArgs& args) {
  if (args.max_tokens < 1) return fail(Status::invalid_argument("--max-tokens must be >= 1"));
  if (args.block_size < 1) return fail(Status::invalid_argument("--block-size must be >= 1"));
  const model::SamplingParams sampling{
      .temperature = args.temperature, .top_p = args.top_p, .seed = args.run_seed};
  if (Status s = model::validate(sampling); !s.ok()) return fail(s);
  auto loaded = model::load_llama_model(args.dir);
  if (!loaded.ok()) return fail(loaded.status());
  auto tokenizer = model::load_tokenizer(args.dir, loaded->config.vocab_size);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  const std::vector<int64_t> ids = (*tokenizer)->encode(args.prompt);
  const auto n = static_cast<int64_t>(ids.size());
  model::LlamaForward forward(*loaded);
  const int64_t blocks = (n + args.max_tokens + args.block_size - 1) / args.block_size;
  model::CpuExecutor executor(
      forward, {.block_size_tokens = args.block_size, .capacity_blocks = std::max<int64_t>(blocks, 1)});
  // The prompt's block keys as a served request's (kv/block_key.h), seeded with the model's identity.
  const std::vector<BlockKey> keys = kv::prompt_block_keys(ids, args.block_size, loaded->identity);
  if (Status s = executor.add_request(1, {.prompt = std::vector<int32_t>(ids.begin(), ids.end()),
                                          .block_keys = keys,
                                          .output_tokens = args.max_tokens,
                                          .sampling = sampling});
      !s.ok()) {
    return fail(Status::invalid_argument(fmt::format("--prompt: {}", s.message())));
  }
  RunListener listener(executor);
  engine::EngineCore engine(
      {.kv_capacity_tokens = blocks * args.block_size, .block_size_tokens = args.block_size}, executor,
      listener);
  engine.submit_prompt(1, n, args.max_tokens, keys, 0);
  while (engine.busy()) engine.advance_until(engine.next_event_s());
  if (!listener.error.empty()) return fail(Status::internal(listener.error));
  // The answer ends at the tokenizer's EOS, as served (serve/output_text.h), unless --ignore-eos.
  std::string_view finish_reason = "length";
  if (const auto eos = (*tokenizer)->eos_token(); eos && !args.ignore_eos) {
    const auto at = std::find(listener.tokens.begin(), listener.tokens.end(), *eos);
    if (at != listener.tokens.end()) {
      listener.tokens.erase(at, listener.tokens.end());
      finish_reason = "stop";
    }
  }
  std::string text;
  for (int32_t t : listener.tokens) text += (*tokenizer)->token_bytes(t);
  if (args.json) {
    const nlohmann::json j = {{"text", text},
                              {"token_ids", listener.tokens},
                              {"prompt_tokens", n},
                              {"completion_tokens", listener.tokens.size()},
                              {"finish_reason", finish_reason},
                              {"prefill_seconds", listener.first_token_s},
                              {"decode_seconds", listener.finished_s - listener.first_token_s}};
    fmt::print("{}\n", dump_json(j));
  } else {
    fmt::print("{}\n", text);
    fmt::print(stderr, "{} prompt tokens ({} tokenizer), {} generated; prefill {:.3f} s, decode {:.3f} s\n",
               n, (*tokenizer)->kind(), listener.tokens.size(), listener.first_token_s,
               listener.finished_s - listener.first_token_s);
  }
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
  CLI::Option* tokenizer = init->add_option("--tokenizer", args->tokenizer,
                                            "A SentencePiece model to copy in as DIR/tokenizer.model (the "
                                            "vocabulary becomes its size; default: bytes)");
  CLI::Option* train =
      init->add_option(
              "--train-tokenizer", args->train_tokenizer,
              "A UTF-8 text file to train DIR/tokenizer.model on (SentencePiece BPE with byte fallback)")
          ->excludes(tokenizer);
  init->add_option("--tokenizer-vocab", args->tokenizer_vocab,
                   "Pieces in the trained tokenizer (at least its characters + 259)")
      ->capture_default_str()
      ->needs(train);
  init->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_init(*args); }); });
  CLI::App* check =
      cmd->add_subcommand("check", "Read a model directory and check every tensor against its config");
  check->add_option("dir", args->dir, "The model directory")->required();
  check->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_check(*args); }); });
  CLI::App* run = cmd->add_subcommand(
      "run", "Generate from a prompt in this process (one colocated engine running the cpu executor)");
  run->add_option("dir", args->dir, "The model directory")->required();
  run->add_option("--prompt", args->prompt, "The prompt (tokenized as the server does)")->required();
  run->add_option("--max-tokens", args->max_tokens, "Tokens to generate")->capture_default_str();
  run->add_option("--temperature", args->temperature, "0: greedy")->capture_default_str();
  run->add_option("--top-p", args->top_p, "Nucleus sampling")->capture_default_str();
  run->add_option("--seed", args->run_seed, "The sampler's seed")->capture_default_str();
  run->add_option("--block-size", args->block_size, "KV block size, tokens")->capture_default_str();
  run->add_flag("--ignore-eos", args->ignore_eos, "Go on past the tokenizer's EOS to --max-tokens");
  run->add_flag("--json", args->json, "Print the text, token ids and timings as JSON");
  run->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_generate(*args); }); });
}

}  // namespace crescent::cli
