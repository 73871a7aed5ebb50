// The embedded metadata services: in-process and directory (several processes on one machine).
#include "transfer/metadata.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

namespace crescent::transfer {
namespace {

SegmentDescriptor descriptor(std::string name, std::string engine) {
  return {.name = std::move(name),
          .engine = std::move(engine),
          .host_id = "host/boot",
          .length_bytes = 4096,
          .transports = {{"tcp", {{"host", "127.0.0.1"}, {"port", 9}, {"segment_id", 1}}}}};
}

TEST(SegmentDescriptorTest, JsonRoundTrip) {
  const SegmentDescriptor d = descriptor("a/kv", "a");
  auto parsed = SegmentDescriptor::from_json(d.to_json());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->to_json(), d.to_json());
}

TEST(SegmentDescriptorTest, MissingOrMistypedFieldsAreNamed) {
  nlohmann::json j = descriptor("a/kv", "a").to_json();
  j.erase("engine");
  EXPECT_NE(SegmentDescriptor::from_json(j).status().message().find("'engine'"), std::string::npos);
  j = descriptor("a/kv", "a").to_json();
  j["length_bytes"] = -1;
  EXPECT_NE(SegmentDescriptor::from_json(j).status().message().find("'length_bytes'"), std::string::npos);
  EXPECT_FALSE(SegmentDescriptor::from_json(nlohmann::json::array()).ok());
}

// The contract every embedded service keeps, run on both.
void check_contract(MetadataService& a, MetadataService& b) {
  ASSERT_TRUE(a.claim_engine("a").ok());
  EXPECT_EQ(b.claim_engine("a").code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(b.claim_engine("b").ok());
  EXPECT_EQ(a.publish(descriptor("x/kv", "x")).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.publish(descriptor("a/kv", "a")).ok());
  ASSERT_TRUE(a.publish(descriptor("a/kv", "a")).ok());  // republishing one's own is fine
  ASSERT_TRUE(b.publish(descriptor("b/kv", "b")).ok());
  EXPECT_EQ(b.publish(descriptor("a/kv", "b")).code(), StatusCode::kAlreadyExists);
  auto found = b.lookup("a/kv");
  ASSERT_TRUE(found.ok()) << found.status().to_string();
  EXPECT_EQ(found->engine, "a");
  EXPECT_EQ(found->transports["tcp"]["port"], 9);
  EXPECT_EQ(a.list_segments().value(), (std::vector<std::string>{"a/kv", "b/kv"}));
  EXPECT_EQ(a.lookup("nope").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(a.withdraw("a/kv").ok());
  EXPECT_EQ(b.lookup("a/kv").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(a.withdraw("a/kv").code(), StatusCode::kNotFound);
  ASSERT_TRUE(b.release_engine("b").ok());
  EXPECT_EQ(a.lookup("b/kv").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(a.claim_engine("b").ok());  // a released name can be claimed again
  EXPECT_EQ(a.claim_engine("").code(), StatusCode::kInvalidArgument);
}

TEST(InProcessMetadataTest, Contract) {
  auto service = make_in_process_metadata();
  check_contract(*service, *service);
}

TEST(DirectoryMetadataTest, ContractAcrossInstances) {
  test::TempDir dir;
  auto a = make_directory_metadata(dir.path());
  auto b = make_directory_metadata(dir.path());
  ASSERT_TRUE(a.ok() && b.ok());
  check_contract(**a, **b);
}

TEST(DirectoryMetadataTest, DeadOwnersLeaseEnds) {
  test::TempDir dir;
  const pid_t child = ::fork();
  if (child == 0) {
    auto service = make_directory_metadata(dir.path());
    bool ok = service.ok() && (*service)->claim_engine("gone").ok() &&
              (*service)->publish(descriptor("gone/kv", "gone")).ok();
    ::_exit(ok ? 0 : 1);  // dies without releasing anything
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  auto service = make_directory_metadata(dir.path()).value();
  EXPECT_EQ(service->lookup("gone/kv").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(service->list_segments().value().empty());
  EXPECT_TRUE(service->claim_engine("gone").ok());
}

TEST(DirectoryMetadataTest, UnwritableDirectoryIsAnError) {
  auto service = make_directory_metadata("/proc/crescent-metadata");
  ASSERT_FALSE(service.ok());
  EXPECT_EQ(service.status().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace crescent::transfer
