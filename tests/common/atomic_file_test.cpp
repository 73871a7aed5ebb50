#include "common/atomic_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "common/secret.h"
#include "test_support/temp_dir.h"

namespace crescent {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh, empty directory, removed at the end.
struct ScratchDir {
  test::TempDir dir{"crescent-output-test"};
  fs::path path = dir.path();
  size_t entries() const { return static_cast<size_t>(std::distance(fs::directory_iterator(path), {})); }
};

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(WriteFileAtomically, WritesAndReplacesLeavingNoTemporaryFile) {
  ScratchDir dir;
  const fs::path path = dir.path / "result.json";
  ASSERT_TRUE(write_file_atomically(path, "first").ok());
  ASSERT_TRUE(write_file_atomically(path, std::string(1 << 20, 'x')).ok());
  EXPECT_EQ(read(path), std::string(1 << 20, 'x'));
  EXPECT_EQ(dir.entries(), 1u);
  const mode_t umask_bits = umask(0);
  umask(umask_bits);
  EXPECT_EQ(static_cast<mode_t>(fs::status(path).permissions()), 0666 & ~umask_bits)
      << "a result file, not a private 0600 temporary";
}

TEST(WriteFileAtomically, MissingDirectoryIsAnErrorNamingThePath) {
  ScratchDir dir;
  const fs::path path = dir.path / "missing" / "result.svg";
  const Status status = write_file_atomically(path, "x");
  EXPECT_EQ(status.code(), StatusCode::kIoError);
  EXPECT_THAT(status.message(), HasSubstr(path.string()));
  EXPECT_THAT(status.message(), HasSubstr("No such file or directory"));
  EXPECT_EQ(dir.entries(), 0u);
}

TEST(WriteFileAtomically, FailedRenameLeavesTheOldContentAndNoTemporaryFile) {
  ScratchDir dir;
  const fs::path path = dir.path / "taken";
  fs::create_directories(path / "child");  // a non-empty directory cannot be replaced by a file
  EXPECT_EQ(write_file_atomically(path, "x").code(), StatusCode::kIoError);
  EXPECT_TRUE(fs::is_directory(path / "child"));
  EXPECT_EQ(dir.entries(), 1u);
}

TEST(EnsureWritableDirectory, CreatesMissingParents) {
  ScratchDir dir;
  EXPECT_TRUE(ensure_writable_directory(dir.path / "a" / "b").ok());
  EXPECT_TRUE(fs::is_directory(dir.path / "a" / "b"));
  EXPECT_TRUE(fs::is_empty(dir.path / "a" / "b")) << "the write probe is removed";
}

TEST(EnsureWritableDirectory, PathUnderARegularFileIsAnError) {
  ScratchDir dir;
  std::ofstream(dir.path / "file") << "x";
  for (const fs::path& bad : {dir.path / "file", dir.path / "file" / "sub"}) {
    const Status status = ensure_writable_directory(bad);
    EXPECT_EQ(status.code(), StatusCode::kIoError) << bad;
    EXPECT_THAT(status.message(), HasSubstr(bad.string()));
  }
  EXPECT_EQ(dir.entries(), 1u);
}

}  // namespace
}  // namespace crescent

namespace crescent {
namespace {

// If one of several files cannot be written, none of the targets changes (an older result pair stays whole).
TEST(WriteFilesAtomically, AWriteFailureLeavesEveryTargetAsItWas) {
  const test::TempDir temp("crescent-output-pair");
  const std::filesystem::path dir = temp.path();
  const std::string svg = (dir / "x.svg").string();
  ASSERT_TRUE(write_file_atomically(svg, "old plot").ok());
  const FileContent files[] = {{svg, "new plot"}, {(dir / "missing" / "x.json").string(), "{}"}};
  const Status status = write_files_atomically(files);
  EXPECT_EQ(status.code(), StatusCode::kIoError);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("x.json"));
  std::ifstream in(svg);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "old plot");
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1u);  // no temporary file left behind
}

TEST(WriteFileAtomically, FollowsSymlinksAndWritesSpecialFilesInPlace) {
  test::TempDir dir;
  const std::string real = dir.file("real.jsonl"), link = dir.file("link.jsonl");
  std::ofstream(real) << "old";
  fs::create_symlink(real, link);
  ASSERT_TRUE(write_file_atomically(link, "new").ok());
  EXPECT_TRUE(fs::is_symlink(link));  // the link stays, its target has the content
  std::ifstream in(real);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "new");
  // A device is written, never replaced.
  ASSERT_TRUE(write_file_atomically("/dev/null", "lines\n").ok());
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
}

// Keys and secrets are read whole, and only from a small regular file.
TEST(ReadSmallFile, ReadsASmallRegularFileAndRefusesTheRest) {
  test::TempDir dir;
  const std::string key = dir.file("key");
  ASSERT_TRUE(write_file_atomically(key, "sesame\n").ok());
  EXPECT_EQ(read_small_file(key).value(), "sesame\n");
  ASSERT_TRUE(write_file_atomically(dir.file("big"), std::string(100, 'x')).ok());
  auto big = read_small_file(dir.file("big"), 99);
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), ::testing::HasSubstr("100 bytes, more than the 99 expected"));
  EXPECT_EQ(read_small_file(dir.path()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(read_small_file("/dev/zero").status().code(), StatusCode::kInvalidArgument)
      << "not a regular file";
  EXPECT_EQ(read_small_file(dir.file("missing")).status().code(), StatusCode::kIoError);
}

// Equal secrets are equal whatever their lengths; any difference, a prefix included, is not.
TEST(SecretsEqual, ComparesWholeSecrets) {
  EXPECT_TRUE(secrets_equal("sesame", "sesame"));
  EXPECT_TRUE(secrets_equal("", ""));
  EXPECT_FALSE(secrets_equal("sesame", "sesam"));
  EXPECT_FALSE(secrets_equal("sesame", "sesame "));
  EXPECT_FALSE(secrets_equal("sesame", "Sesame"));
  EXPECT_FALSE(secrets_equal("", "x"));
}

// The members' secret: written private and read back; a file others may read, or that is not a secret's,
// is refused by name; what is derived from it differs by purpose and is the same for every holder.
TEST(ClusterSecret, IsWrittenPrivateReadBackAndDerivesKeysByPurpose) {
  test::TempDir dir;
  const std::string path = dir.file("secret");
  const ClusterSecret secret = ClusterSecret::generate();
  ASSERT_TRUE(secret.write_to(path).ok());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(secret.write_to(path).code(), StatusCode::kIoError) << "an existing secret is never overwritten";
  auto read = ClusterSecret::from_file(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->derive("a"), secret.derive("a"));
  EXPECT_NE(secret.derive("a"), secret.derive("b"));
  EXPECT_NE(ClusterSecret::generate().derive("a"), secret.derive("a"));
  EXPECT_EQ(read->curve_key_pair("k").public_key, secret.curve_key_pair("k").public_key);
  EXPECT_NE(secret.curve_key_pair("k").public_key, secret.curve_key_pair("k").secret_key);

  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  EXPECT_THAT(ClusterSecret::from_file(path).status().message(), HasSubstr("lets others read it"));
  ASSERT_TRUE(write_file_atomically(dir.file("short"), "abcd\n").ok());
  ASSERT_EQ(::chmod(dir.file("short").c_str(), 0600), 0);
  EXPECT_THAT(ClusterSecret::from_file(dir.file("short")).status().message(), HasSubstr("64 hex digits"));
  EXPECT_EQ(ClusterSecret::from_file(dir.file("missing")).status().code(), StatusCode::kInvalidArgument);
}

// Request ids (issue 22 §1): no repeats in a long run, and two Conductors' sequences unrelated (SipHash of
// a counter under keys of their own), so no id tells another.
TEST(UnguessableIds, DoNotRepeatAndDifferPerGenerator) {
  UnguessableIds a, b;
  std::set<uint64_t> seen;
  for (int i = 0; i < 100'000; ++i) EXPECT_TRUE(seen.insert(a.next()).second) << i;
  int equal = 0;
  for (int i = 0; i < 1000; ++i) equal += a.next() == b.next();
  EXPECT_EQ(equal, 0);
  // Not a counter in disguise: consecutive ids differ in about half their bits.
  int bits = 0;
  uint64_t previous = b.next();
  for (int i = 0; i < 1000; ++i) {
    const uint64_t id = b.next();
    bits += std::popcount(id ^ previous);
    previous = id;
  }
  EXPECT_NEAR(bits / 1000.0, 32.0, 2.0);
}

}  // namespace
}  // namespace crescent
