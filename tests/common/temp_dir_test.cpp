// TempDir: a private directory (mode 0700) removed with its contents, kept when released, moved whole, and
// an error naming the path when it cannot be made.
#include "common/temp_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace crescent {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(TempDir, IsPrivateAndRemovedWithItsContents) {
  std::string path;
  {
    Result<TempDir> dir = TempDir::create("crescent-temp-dir-test");
    ASSERT_TRUE(dir.ok()) << dir.status().message();
    path = dir->path();
    EXPECT_THAT(fs::path(path).filename().string(), StartsWith("crescent-temp-dir-test-"));
    struct stat info {};
    ASSERT_EQ(::stat(path.c_str(), &info), 0);
    EXPECT_TRUE(S_ISDIR(info.st_mode));
    EXPECT_EQ(info.st_mode & 0777, 0700u);
    EXPECT_EQ(dir->file("a.txt"), path + "/a.txt");
    std::ofstream(dir->file("a.txt")) << "x";
    fs::create_directories(dir->file("sub/deeper"));
    std::ofstream(dir->file("sub/deeper/b.txt")) << "y";
  }
  EXPECT_FALSE(fs::exists(path));
}

TEST(TempDir, TwoAreDistinct) {
  Result<TempDir> a = TempDir::create("crescent-temp-dir-test");
  Result<TempDir> b = TempDir::create("crescent-temp-dir-test");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->path(), b->path());
}

TEST(TempDir, ReleasedDirectoryOutlivesTheObject) {
  std::string path;
  {
    Result<TempDir> dir = TempDir::create("crescent-temp-dir-test");
    ASSERT_TRUE(dir.ok()) << dir.status().message();
    path = dir->release();
    EXPECT_EQ(dir->path(), "");
  }
  EXPECT_TRUE(fs::is_directory(path));
  fs::remove_all(path);
}

TEST(TempDir, MoveTransfersOwnership) {
  Result<TempDir> created = TempDir::create("crescent-temp-dir-test");
  ASSERT_TRUE(created.ok()) << created.status().message();
  const std::string path = created->path();
  TempDir moved(std::move(*created));
  EXPECT_EQ(created->path(), "");
  EXPECT_EQ(moved.path(), path);
  TempDir other;
  other = std::move(moved);
  EXPECT_EQ(other.path(), path);
  EXPECT_TRUE(fs::is_directory(path));
  Result<TempDir> next = TempDir::create("crescent-temp-dir-test");
  ASSERT_TRUE(next.ok());
  other = std::move(*next);  // the directory it held goes
  EXPECT_FALSE(fs::exists(path));
}

TEST(TempDir, ErrorNamesThePathAndTheReason) {
  Result<TempDir> dir = TempDir::create("no-such-parent-directory/x");
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().code(), StatusCode::kIoError);
  EXPECT_THAT(dir.status().message(), HasSubstr("no-such-parent-directory/x-XXXXXX"));
  EXPECT_THAT(dir.status().message(), HasSubstr("No such file or directory"));
}

// Run directories and transfer metadata (issue 22 §2): made private, and one another user made is refused.
TEST(MakePrivateDirectory, MakesItPrivateAndRefusesOneAnotherUserOwns) {
  Result<TempDir> base = TempDir::create("crescent-private-test");
  ASSERT_TRUE(base.ok());
  const std::string dir = base->file("a/b");
  ASSERT_TRUE(make_private_directory(dir).ok());
  EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms::owner_all);
  fs::permissions(dir, fs::perms::all);  // opened up since: made private again
  ASSERT_TRUE(make_private_directory(dir).ok());
  EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms::owner_all);
  if (::geteuid() != 0) GTEST_SKIP() << "giving a directory to another user needs root";
  const std::string theirs = base->file("theirs");
  fs::create_directory(theirs);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);  // nobody
  Status refused = make_private_directory(theirs);
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(), HasSubstr(theirs));
  EXPECT_THAT(refused.message(), HasSubstr("uid 65534"));
  // Inside a directory another user controls (they could swap it): refused too.
  refused = make_private_directory(theirs + "/mine");
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied) << refused.message();
}

}  // namespace
}  // namespace crescent
