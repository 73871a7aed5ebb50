// `crescent model init|check` as a user runs them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/run_crescent.h"
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
  EXPECT_THAT(spm.err, HasSubstr("tokenizer.model: SentencePiece tokenizers are not supported yet"));
}

}  // namespace
}  // namespace crescent::cli_test
