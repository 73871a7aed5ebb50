#include "common/bundled_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "test_support/temp_dir.h"

namespace crescent {
namespace {

using ::testing::HasSubstr;

// Sets an environment variable for one scope.
struct ScopedEnv {
  ScopedEnv(const char* name, const std::string& value) : name(name) { ::setenv(name, value.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name); }
  const char* name;
};

TEST(BundledFiles, FindsTheShippedConfigOutsideTheWorkingDirectory) {
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(std::filesystem::temp_directory_path());
  auto path = bundled_file("configs/paper-fig5.json");
  std::filesystem::current_path(cwd);
  ASSERT_TRUE(path.ok()) << path.status().to_string();
  EXPECT_TRUE(std::filesystem::is_regular_file(*path));
}

TEST(BundledFiles, DataDirFromTheEnvironmentComesFirst) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.file("configs"));
  std::ofstream(dir.file("configs/paper-fig5.json")) << "{}";
  ScopedEnv env("CRESCENT_DATA_DIR", dir.path());
  EXPECT_EQ(bundled_file_dirs().front(), dir.path());
  auto path = bundled_file("configs/paper-fig5.json");
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*path, dir.file("configs/paper-fig5.json"));
}

TEST(BundledFiles, MissingFileNamesEveryPlaceLooked) {
  test::TempDir dir;
  ScopedEnv env("CRESCENT_DATA_DIR", dir.path());
  auto path = bundled_file("configs/nope.json");
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(path.status().message(),
              HasSubstr("bundled file 'configs/nope.json' not found in " + dir.path()));
  EXPECT_THAT(path.status().message(), HasSubstr("share/crescent"));
  EXPECT_THAT(path.status().message(), HasSubstr("CRESCENT_DATA_DIR"));
}

}  // namespace
}  // namespace crescent
