#include "store/control_rpc.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

namespace crescent::store {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr uint16_t kEcho = 1;   // replies with the body reversed
constexpr uint16_t kFail = 2;   // replies with an error naming the body
constexpr uint16_t kSleep = 3;  // sleeps the body's number of milliseconds, then replies "slept"

ControlHandler test_handler(std::atomic<int>* calls = nullptr) {
  return [calls](uint16_t method, std::string_view body) -> Result<std::string> {
    if (calls != nullptr) calls->fetch_add(1);
    switch (method) {
      case kEcho:
        return std::string(body.rbegin(), body.rend());
      case kFail:
        return Status::invalid_argument("refused " + std::string(body));
      case kSleep:
        std::this_thread::sleep_for(milliseconds(std::stoi(std::string(body))));
        return std::string("slept");
      default:
        return Status::invalid_argument("unknown method " + std::to_string(method));
    }
  };
}

std::string address_of(const ControlServer& server) {
  return "127.0.0.1:" + std::to_string(server.port());
}

Clock::time_point in(milliseconds ms) {
  return Clock::now() + ms;
}

/// Connects a raw socket to the server and sends `bytes`; returns the fd (the caller closes it).
int send_raw(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  return fd;
}

/// A request header as control_rpc.h documents it.
std::string header(uint16_t method, uint32_t call_id, uint32_t body_bytes) {
  std::string out(16, '\0');
  auto put = [&](size_t at, uint64_t value, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) out[at + i] = static_cast<char>(value >> (8 * i));
  };
  put(0, 0x4d535243, 4);
  put(4, 1, 2);
  put(6, method, 2);
  put(8, call_id, 4);
  put(12, body_bytes, 4);
  return out;
}

TEST(ControlRpc, CallsFromManyThreadsGetTheirOwnReplies) {
  auto server = ControlServer::start("127.0.0.1:0", test_handler());
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  ControlChannel channel(address_of(**server), 4);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const std::string body = std::to_string(t) + ":" + std::to_string(i) + std::string(i % 50, 'x');
        Result<std::string> reply = channel.call(kEcho, body, in(milliseconds(5000)));
        if (!reply.ok() || *reply != std::string(body.rbegin(), body.rend())) wrong.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ControlRpc, EmptyAndLargeBodiesRoundTrip) {
  auto server = ControlServer::start("127.0.0.1:0", test_handler());
  ASSERT_TRUE(server.ok());
  ControlChannel channel(address_of(**server), 1);
  Result<std::string> empty = channel.call(kEcho, "", in(milliseconds(5000)));
  ASSERT_TRUE(empty.ok()) << empty.status().to_string();
  EXPECT_EQ(*empty, "");
  std::string large(5 << 20, '\0');  // spans several receive chunks
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>(i * 7 + i / 4096);
  Result<std::string> reply = channel.call(kEcho, large, in(milliseconds(10000)));
  ASSERT_TRUE(reply.ok()) << reply.status().to_string();
  std::reverse(large.begin(), large.end());
  EXPECT_TRUE(*reply == large);
}

TEST(ControlRpc, AnErrorReplyKeepsItsCodeAndMessageAndTheConnection) {
  std::atomic<int> calls{0};
  auto server = ControlServer::start("127.0.0.1:0", test_handler(&calls));
  ASSERT_TRUE(server.ok());
  ControlChannel channel(address_of(**server), 1);
  Result<std::string> refused = channel.call(kFail, "this", in(milliseconds(5000)));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "refused this");
  Result<std::string> unknown = channel.call(77, "", in(milliseconds(5000)));
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.status().message(), "unknown method 77");
  EXPECT_TRUE(channel.call(kEcho, "ok", in(milliseconds(5000))).ok());
  EXPECT_EQ(calls.load(), 3);
}

TEST(ControlRpc, ADeadlinePassesAndTheNextCallStillSucceeds) {
  auto server = ControlServer::start("127.0.0.1:0", test_handler());
  ASSERT_TRUE(server.ok());
  ControlChannel channel(address_of(**server), 1);
  const auto start = Clock::now();
  Result<std::string> late = channel.call(kSleep, "400", in(milliseconds(50)));
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded) << late.status().to_string();
  EXPECT_LT(Clock::now() - start, milliseconds(350));  // returned at its deadline, not the handler's end
  // The late reply arrives on the abandoned connection, never as the answer to a later call.
  Result<std::string> next = channel.call(kEcho, "abc", in(milliseconds(5000)));
  ASSERT_TRUE(next.ok()) << next.status().to_string();
  EXPECT_EQ(*next, "cba");
}

TEST(ControlRpc, UnreachableThenARestartedServerOnTheSamePort) {
  auto server = ControlServer::start("127.0.0.1:0", test_handler());
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  ControlChannel channel(address_of(**server), 4);
  ASSERT_TRUE(channel.call(kEcho, "a", in(milliseconds(5000))).ok());  // leaves an idle connection
  server->reset();
  Result<std::string> down = channel.call(kEcho, "a", in(milliseconds(2000)));
  EXPECT_EQ(down.status().code(), StatusCode::kUnavailable) << down.status().to_string();
  auto again = ControlServer::start("127.0.0.1:" + std::to_string(port), test_handler());
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  // The connection the old server closed is dropped from the pool, not used for the call.
  Result<std::string> up = channel.call(kEcho, "ab", in(milliseconds(5000)));
  ASSERT_TRUE(up.ok()) << up.status().to_string();
  EXPECT_EQ(*up, "ba");
}

TEST(ControlRpc, FramesThatAreNotOursCloseTheirConnectionOnly) {
  std::atomic<int> calls{0};
  auto server = ControlServer::start("127.0.0.1:0", test_handler(&calls));
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  std::string bad_version = header(kEcho, 1, 0);
  bad_version[4] = 9;
  const std::vector<std::string> junk = {
      "GET / HTTP/1.1\r\n\r\n",           std::string(4096, '\xff'), bad_version,
      header(kEcho, 1, (1u << 30) + 1),    // body over the limit
      header(kEcho, 1, 1u << 30) + "abc",  // a huge body that never arrives: no 1 GiB allocation
  };
  for (const std::string& bytes : junk) {
    const int fd = send_raw(port, bytes);
    char byte = 0;
    // The server closes a connection it cannot trust (the last one: when this side closes).
    if (&bytes != &junk.back()) {
      EXPECT_LE(::recv(fd, &byte, 1, 0), 0);  // EOF, or a reset when junk was left unread
    }
    ::close(fd);
  }
  // A well-formed frame on a raw socket gets its reply.
  const int fd = send_raw(port, header(kEcho, 42, 3) + "xyz");
  char reply[19] = {};
  size_t got = 0;
  while (got < sizeof(reply)) {
    const ssize_t n = ::recv(fd, reply + got, sizeof(reply) - got, 0);
    ASSERT_GT(n, 0);
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  EXPECT_EQ(std::string(reply, 16), header(0, 42, 3));  // code 0 where the method was
  EXPECT_EQ(std::string(reply + 16, 3), "zyx");
  EXPECT_EQ(calls.load(), 1);  // no junk reached the handler
  ControlChannel channel(address_of(**server), 1);
  EXPECT_TRUE(channel.call(kEcho, "still", in(milliseconds(5000))).ok());
}

TEST(ControlRpc, BadAddressesAreNamed) {
  auto no_port = ControlServer::start("127.0.0.1", test_handler());
  EXPECT_EQ(no_port.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_port.status().message().find("127.0.0.1"), std::string::npos) << no_port.status().to_string();
  auto bad_port = ControlServer::start("127.0.0.1:99999", test_handler());
  EXPECT_EQ(bad_port.status().code(), StatusCode::kInvalidArgument);
  auto server = ControlServer::start("127.0.0.1:0", test_handler());
  ASSERT_TRUE(server.ok());
  auto taken = ControlServer::start(address_of(**server), test_handler());
  EXPECT_EQ(taken.status().code(), StatusCode::kUnavailable) << taken.status().to_string();
  ControlChannel nowhere("no-such-host.invalid:1", 1);
  Result<std::string> call = nowhere.call(kEcho, "", in(milliseconds(2000)));
  EXPECT_EQ(call.status().code(), StatusCode::kUnavailable) << call.status().to_string();
  ControlChannel malformed("missing-port", 1);
  EXPECT_EQ(malformed.call(kEcho, "", in(milliseconds(2000))).status().code(), StatusCode::kInvalidArgument);
}

// Members only (issue 22 §2): a master started with the cluster secret serves its members and nobody else: a
// client without the secret, one with another cluster's, and a raw frame get nothing run, and each refusal
// is counted. A member calling a server that is not one is refused too.
TEST(ControlRpc, OnlyMembersAreServed) {
  const ClusterSecret cluster = ClusterSecret::generate();
  std::atomic<int> calls{0};
  auto server = ControlServer::start("127.0.0.1:0", test_handler(&calls), store_member_key(cluster));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  ControlChannel member(address_of(**server), 1, store_member_key(cluster));
  Result<std::string> reply = member.call(kEcho, "abc", in(milliseconds(2000)));
  ASSERT_TRUE(reply.ok()) << reply.status().to_string();
  EXPECT_EQ(*reply, "cba");

  ControlChannel stranger(address_of(**server), 1);
  ControlChannel other_cluster(address_of(**server), 1, store_member_key(ClusterSecret::generate()));
  for (ControlChannel* channel : {&stranger, &other_cluster}) {
    Result<std::string> refused = channel->call(kEcho, "abc", in(milliseconds(2000)));
    ASSERT_FALSE(refused.ok());
    if (channel == &other_cluster) {
      EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().to_string();
      EXPECT_NE(refused.status().message().find("--cluster-secret-file"), std::string::npos);
    }
  }
  const int raw = send_raw((*server)->port(), header(kEcho, 1, 3) + "abc");
  std::string got;
  char buffer[256];
  for (ssize_t n; (n = ::recv(raw, buffer, sizeof(buffer), 0)) > 0;)
    got.append(buffer, static_cast<size_t>(n));
  ::close(raw);
  EXPECT_EQ(got.size(), 36u) << "the server's hello (magic and nonce), then the connection closed unanswered";
  EXPECT_EQ(got.substr(0, 4), "CRMB");
  EXPECT_EQ(calls.load(), 1) << "only the member's call ran";
  // A refused client may give up before the server's thread has counted it (the stranger closes on the
  // server's hello): wait for the count, with a deadline.
  for (int i = 0; i < 200 && (*server)->clients_refused() < 3u; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ((*server)->clients_refused(), 3u);

  // A member does not call a server outside the cluster (its answers could be anything).
  auto open_server = ControlServer::start("127.0.0.1:0", test_handler(&calls));
  ASSERT_TRUE(open_server.ok());
  ControlChannel careful(address_of(**open_server), 1, store_member_key(cluster));
  EXPECT_EQ(careful.call(kEcho, "abc", in(milliseconds(2000))).status().code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace crescent::store
