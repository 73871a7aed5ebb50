// `crescent model init|check` as a user runs them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/run_crescent.h"
#include "test_support/corpus.h"
#include "test_support/temp_dir.h"

namespace crescent::cli_test {
namespace {

using ::testing::HasSubstr;

TEST(ModelCli, InitWritesAModelThatChecksAndBadModelsExitWith2) {
  test::TempDir dir;
  const std::string out = dir.file("tiny");
  CliRun init = run_crescent("model init --preset tiny --seed 3 --out " + quote(out));
  ASSERT_EQ(init.exit_code, 0) << init.err;
  EXPECT_THAT(init.out, HasSubstr("2 layers, hidden 64"));
  CliRun check = run_crescent("model check " + quote(out));
  ASSERT_EQ(check.exit_code, 0) << check.err;
  EXPECT_THAT(check.out, HasSubstr("21 tensors"));

  CliRun preset = run_crescent("model init --preset huge --out " + quote(dir.file("x")));
  EXPECT_EQ(preset.exit_code, 2);
  EXPECT_THAT(preset.err, HasSubstr("no model preset \"huge\" (presets: small, tiny)"));
  std::filesystem::resize_file(out + "/model.safetensors", 1000);
  CliRun truncated = run_crescent("model check " + quote(out));
  EXPECT_EQ(truncated.exit_code, 2);
  EXPECT_THAT(truncated.err, HasSubstr("model.safetensors: truncated"));
  CliRun missing = run_crescent("model check " + quote(dir.file("nothing")));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("config.json"));
}

// `model run` generates in one process; the same seed samples the same text; bad input exits 2 naming it.
TEST(ModelCli, RunGeneratesAndRefusesWhatCannotRun) {
  test::TempDir dir;
  const std::string model = dir.file("tiny");
  ASSERT_EQ(run_crescent("model init --preset tiny --seed 4 --out " + quote(model)).exit_code, 0);
  const auto run = [&](const std::string& flags) {
    return run_crescent("model run " + quote(model) + " " + flags);
  };
  CliRun greedy = run("--prompt 'Once upon a time' --max-tokens 7 --json");
  ASSERT_EQ(greedy.exit_code, 0) << greedy.err;
  const auto out = nlohmann::json::parse(greedy.out);
  EXPECT_EQ(out["prompt_tokens"], 16);
  EXPECT_EQ(out["token_ids"].size(), 7u);
  const auto token_ids = [&](const std::string& flags) {
    return nlohmann::json::parse(
        run("--prompt 'Once upon a time' --max-tokens 12 --json " + flags).out)["token_ids"];
  };
  const auto sampled = token_ids("--temperature 1 --seed 9");
  EXPECT_EQ(token_ids("--temperature 1 --seed 9"), sampled);
  EXPECT_NE(token_ids(""), sampled);

  CliRun too_long = run("--prompt hello --max-tokens 4092");
  EXPECT_EQ(too_long.exit_code, 2);
  EXPECT_THAT(too_long.err,
              HasSubstr("a prompt of 5 tokens and 4092 output tokens is 4097 tokens, the model's "
                        "context is 4096"));
  CliRun bad_top_p = run("--prompt hello --top-p 0");
  EXPECT_EQ(bad_top_p.exit_code, 2);
  EXPECT_THAT(bad_top_p.err, HasSubstr("'top_p'"));
  std::ofstream(model + "/tokenizer.model") << "not a sentencepiece model";
  CliRun spm = run("--prompt hello");
  EXPECT_EQ(spm.exit_code, 2);
  EXPECT_THAT(spm.err,
              HasSubstr("tokenizer.model: not a SentencePiece model that libsentencepiece can load"));
}

// `model init --train-tokenizer` writes a SentencePiece tokenizer.model and sizes the vocabulary to it;
// `model run` tokenizes with it, in the binary that also holds the store's protobuf (the two protobufs would
// clash if libsentencepiece were linked in: sentencepiece_module.h). An old tokenizer.model is not kept
// silently.
TEST(ModelCli, ASentencePieceTokenizerIsTrainedAndUsed) {
  test::TempDir dir;
  test::write_corpus(dir.file("corpus.txt"));
  const std::string model = dir.file("spm");
  CliRun init =
      run_crescent("model init --preset tiny --seed 5 --out " + quote(model) + " --train-tokenizer " +
                   quote(dir.file("corpus.txt")) + " --tokenizer-vocab 500");
  ASSERT_EQ(init.exit_code, 0) << init.err;
  EXPECT_THAT(init.out, HasSubstr("vocab 500"));
  EXPECT_THAT(init.out, HasSubstr("tokenizer sentencepiece"));
  CliRun check = run_crescent("model check " + quote(model));
  EXPECT_EQ(check.exit_code, 0) << check.err;
  CliRun run =
      run_crescent("model run " + quote(model) + " --prompt 'the quick brown fox' --max-tokens 5 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto out = nlohmann::json::parse(run.out);
  EXPECT_LE(out["prompt_tokens"], 5);  // BOS + a piece a word, where bytes would be 19
  EXPECT_EQ(out["token_ids"].size(), 5u);
  for (const auto& id : out["token_ids"]) EXPECT_LT(id, 500);

  // The same tokenizer copied into another model with --tokenizer.
  const std::string copy = dir.file("copy");
  CliRun copied = run_crescent("model init --preset tiny --out " + quote(copy) + " --tokenizer " +
                               quote(model + "/tokenizer.model"));
  ASSERT_EQ(copied.exit_code, 0) << copied.err;
  EXPECT_THAT(copied.out, HasSubstr("vocab 500"));
  // Re-initialising without a tokenizer would leave one that does not match: refused.
  CliRun stale = run_crescent("model init --preset tiny --out " + quote(copy));
  EXPECT_EQ(stale.exit_code, 2);
  EXPECT_THAT(stale.err, HasSubstr("tokenizer.model is there from before"));
  CliRun too_small =
      run_crescent("model init --preset tiny --out " + quote(dir.file("small")) + " --train-tokenizer " +
                   quote(dir.file("corpus.txt")) + " --tokenizer-vocab 50");
  EXPECT_EQ(too_small.exit_code, 2);
  EXPECT_THAT(too_small.err, HasSubstr("training a 50-piece SentencePiece tokenizer failed"));
}

// `crescent profile` writes a profile that simulate takes with --profile: the mock's gives back the
// roofline's (so the same numbers), a real one changes them; bad input exits 2.
TEST(ModelCli, ProfileFeedsSimulate) {
  test::TempDir dir;
  const std::string profile = dir.file("mock.json");
  CliRun mock = run_crescent("profile --executor mock --out " + quote(profile));
  ASSERT_EQ(mock.exit_code, 0) << mock.err;
  EXPECT_THAT(mock.out, HasSubstr("residuals (RMS, relative): prefill 0.0%, decode 0.0%"));
  const std::string trace = quote(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz");
  const std::string sim = "simulate " + trace + " --limit 300 --json";
  const auto ttft = [](const CliRun& run) {
    return nlohmann::json::parse(run.out)["policies"][0]["ttft_mean_s"].get<double>();
  };
  const CliRun plain = run_crescent(sim);
  const CliRun profiled = run_crescent(sim + " --profile " + quote(profile));
  ASSERT_EQ(profiled.exit_code, 0) << profiled.err;
  EXPECT_NEAR(ttft(profiled) / ttft(plain), 1.0, 1e-6);
  // Twice the linear cost: prefill takes longer.
  auto j = nlohmann::json::parse(std::ifstream(profile));
  j["linear_s_per_token"] = 2 * j["linear_s_per_token"].get<double>();
  std::ofstream(dir.file("slow.json")) << j.dump();
  EXPECT_GT(ttft(run_crescent(sim + " --profile " + quote(dir.file("slow.json")))), 1.2 * ttft(plain));

  CliRun no_model = run_crescent("profile --executor cpu --out " + quote(dir.file("x.json")));
  EXPECT_EQ(no_model.exit_code, 2);
  EXPECT_THAT(no_model.err, HasSubstr("--executor cpu needs --model DIR"));
  CliRun missing = run_crescent(sim + " --profile " + quote(dir.file("none.json")));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("cannot open profile"));
  j.erase("decode_weight_read_s");
  std::ofstream(dir.file("broken.json")) << j.dump();
  CliRun broken = run_crescent(sim + " --profile " + quote(dir.file("broken.json")));
  EXPECT_EQ(broken.exit_code, 2);
  EXPECT_THAT(broken.err, HasSubstr("field 'decode_weight_read_s' is missing"));
}

}  // namespace
}  // namespace crescent::cli_test
