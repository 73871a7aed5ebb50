// `crescent model init|check` as a user runs them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

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

}  // namespace
}  // namespace crescent::cli_test
