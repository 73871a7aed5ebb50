// The chat-template oracle (issue 23 §2): tests/jinja/jinja_oracle.py, Debian's python3-jinja2 set up as
// Hugging Face's apply_chat_template sets it up, run once per batch of cases. Shared by the jinja, model,
// CLI and serve tests that compare crescent's renderings with it.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "test_support/temp_dir.h"

namespace crescent::test {

/// Debian's python3 (python3-jinja2 is installed for it by scripts/install-deps.sh).
inline const std::string kDebianPython3 = "/usr/bin/python3";
inline const std::string kJinjaOracle = CRESCENT_SOURCE_DIR "/tests/jinja/jinja_oracle.py";

/// Success when Debian's python3 imports jinja2; else a failure saying to run install-deps.
inline ::testing::AssertionResult jinja_oracle_installed() {
  const std::string command = kDebianPython3 + " -c 'import jinja2' > /dev/null 2>&1";
  if (std::system(command.c_str()) != 0) {
    return ::testing::AssertionFailure()
           << kDebianPython3 << " cannot import jinja2: run scripts/install-deps.sh (python3-jinja2)";
  }
  return ::testing::AssertionSuccess();
}

/// The oracle's answer to each case (jinja_oracle.py's request and answer shapes): {"ok": true, "text"} or
/// {"ok": false, "error"}. An empty vector (and a test failure) when the oracle cannot run.
inline std::vector<nlohmann::ordered_json> run_jinja_oracle(
    const std::vector<nlohmann::ordered_json>& cases) {
  TempDir dir("crescent-jinja-oracle");
  const std::string in = dir.file("cases.jsonl"), out = dir.file("answers.jsonl"),
                    err = dir.file("oracle.err");
  {
    std::ofstream f(in);
    for (const auto& c : cases) f << c.dump() << '\n';
  }
  const std::string command = kDebianPython3 + " " + kJinjaOracle + " < " + in + " > " + out + " 2> " + err;
  if (std::system(command.c_str()) != 0) {
    std::ifstream e(err);
    std::stringstream message;
    message << e.rdbuf();
    ADD_FAILURE() << "the jinja2 oracle failed: " << command << "\n" << message.str();
    return {};
  }
  std::vector<nlohmann::ordered_json> answers;
  std::ifstream f(out);
  for (std::string line; std::getline(f, line);) answers.push_back(nlohmann::ordered_json::parse(line));
  if (answers.size() != cases.size()) {
    ADD_FAILURE() << "the jinja2 oracle answered " << answers.size() << " of " << cases.size() << " cases";
    return {};
  }
  return answers;
}

}  // namespace crescent::test
