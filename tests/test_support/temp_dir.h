// A private temporary directory for one test: crescent::TempDir (common/temp_dir.h), created by the
// constructor, as tests want it (no Result to unwrap). Shared by every test that writes files.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>  // what tests do with the paths
#include <string>
#include <utility>

#include "common/temp_dir.h"

namespace crescent::test {

/// crescent::TempDir::create(`prefix`) at construction, removed with its contents by the destructor. When
/// it cannot be created the test fails (ADD_FAILURE with the error) and path() is empty.
class TempDir : public crescent::TempDir {
 public:
  explicit TempDir(const std::string& prefix = "crescent-test") : crescent::TempDir(create_or_fail(prefix)) {}

 private:
  static crescent::TempDir create_or_fail(const std::string& prefix) {
    Result<crescent::TempDir> dir = crescent::TempDir::create(prefix);
    if (!dir.ok()) {
      ADD_FAILURE() << dir.status().message();
      return crescent::TempDir();
    }
    return std::move(*dir);
  }
};

}  // namespace crescent::test
