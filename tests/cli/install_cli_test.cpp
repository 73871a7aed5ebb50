// `cmake --install` gives a crescent that works from any directory: the binary on PATH with its bundled
// configs and traces, found relative to the binary (issue #8 §7), and its SentencePiece module.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "run_crescent.h"
#include "test_support/corpus.h"
#include "test_support/temp_dir.h"

namespace crescent::cli_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(InstallCli, InstalledBinaryFindsItsBundledFilesFromAnyDirectory) {
  test::TempDir prefix("crescent-install"), elsewhere("crescent-cwd");
  const CliRun install = run_shell(quote(CRESCENT_CMAKE) + " --install " + quote(CRESCENT_BUILD_DIR) +
                                   " --prefix " + quote(prefix.path()));
  ASSERT_EQ(install.exit_code, 0) << install.out << install.err;
  const std::string bin = prefix.file("bin/crescent");
  const std::string share = prefix.file("share/crescent");
  for (const std::string& file :
       {bin, share + "/configs/paper-fig5.json", share + "/configs/decode-bound.json",
        share + "/data/traces/conversation_trace.jsonl.gz", share + "/data/traces/synthetic_trace.jsonl.gz",
        share + "/data/traces/README.md"}) {
    EXPECT_TRUE(fs::is_regular_file(file)) << file;
  }
  // Rename the installed default config, so the output shows that this one, not the source tree's, was read.
  const std::string config = share + "/configs/paper-fig5.json";
  nlohmann::json j;
  std::ifstream(config) >> j;
  j["name"] = "installed-fig5";
  std::ofstream(config) << j.dump();

  const std::string in_elsewhere =
      "cd " + quote(elsewhere.path()) + " && PATH=" + quote(prefix.file("bin")) + ":$PATH ";
  const CliRun simulate =
      run_shell(in_elsewhere + "crescent simulate " +
                quote(share + "/data/traces/conversation_trace.jsonl.gz") + " --limit 300");
  ASSERT_EQ(simulate.exit_code, 0) << simulate.err;
  EXPECT_THAT(simulate.out, HasSubstr("cluster installed-fig5: 8 prefill + 8 decode instances"));

  // The README's relative trace paths point at the installed copy when run elsewhere.
  const CliRun relative =
      run_shell(in_elsewhere + "crescent simulate data/traces/conversation_trace.jsonl.gz");
  EXPECT_EQ(relative.exit_code, 2);
  EXPECT_THAT(relative.err, HasSubstr("the bundled trace of that name is " + share +
                                      "/data/traces/conversation_trace.jsonl.gz"));

  const CliRun experiment = run_shell(in_elsewhere + "crescent experiment scheduling --out out");
  ASSERT_EQ(experiment.exit_code, 0) << experiment.err;
  nlohmann::json result;
  std::ifstream(elsewhere.file("out/scheduling.json")) >> result;
  EXPECT_EQ(result["trace"], "data/traces/conversation_trace.jsonl.gz");  // recorded by its bundled name
  EXPECT_EQ(result["config"]["name"], "installed-fig5");

  // The SentencePiece module is installed too (lib/crescent/), and the installed binary loads that copy (the
  // dynamic loader's own log says which file; the build tree's would do as well, so the test looks).
  std::string module;
  for (const auto& entry : fs::recursive_directory_iterator(prefix.path())) {
    if (entry.path().filename() == "libcrescent_sentencepiece.so") module = entry.path().string();
  }
  ASSERT_FALSE(module.empty());
  test::write_corpus(elsewhere.file("corpus.txt"));
  const CliRun spm = run_shell(in_elsewhere +
                               "LD_DEBUG=files crescent model init --preset tiny --out m --train-tokenizer "
                               "corpus.txt --tokenizer-vocab 400");
  EXPECT_EQ(spm.exit_code, 0) << spm.err;
  EXPECT_THAT(spm.out, HasSubstr("tokenizer sentencepiece"));
  EXPECT_THAT(spm.err, HasSubstr("file=" + module));
}

}  // namespace
}  // namespace crescent::cli_test
