#include "common/member_handshake.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <thread>

#include "common/secret.h"

namespace crescent::net {
namespace {

using namespace std::chrono_literals;

// Two ends of a connected stream socket pair, non-blocking as the servers' sockets are.
struct Pair {
  int client = -1, server = -1;
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    client = fds[0];
    server = fds[1];
  }
  ~Pair() {
    if (client >= 0) ::close(client);
    if (server >= 0) ::close(server);
  }
};

// Runs both sides at once; returns {client's status, server's status}.
std::pair<Status, Status> shake(Pair& p, const MemberKey& client_key, const MemberKey& server_key) {
  auto server = std::async(std::launch::async, [&] {
    return member_handshake(p.server, HandshakeSide::kServer, server_key, Clock::now() + 2s, -1);
  });
  const Status client = member_handshake(p.client, HandshakeSide::kClient, client_key, Clock::now() + 2s, -1);
  return {client, server.get()};
}

TEST(MemberHandshake, MembersAdmitEachOtherAndStrangersAreRefusedOnBothSides) {
  const ClusterSecret cluster = ClusterSecret::generate();
  const MemberKey key = cluster.derive("store-control");
  {
    Pair p;
    auto [client, server] = shake(p, key, key);
    EXPECT_TRUE(client.ok()) << client.message();
    EXPECT_TRUE(server.ok()) << server.message();
  }
  // Another cluster's secret, and the same secret for another protocol: refused by both ends.
  for (const MemberKey& other :
       {ClusterSecret::generate().derive("store-control"), cluster.derive("transfer-tcp")}) {
    Pair p;
    auto [client, server] = shake(p, other, key);
    EXPECT_EQ(client.code(), StatusCode::kPermissionDenied) << client.message();
    EXPECT_EQ(server.code(), StatusCode::kPermissionDenied) << server.message();
  }
}

TEST(MemberHandshake, APeerThatReflectsOurOwnProofIsRefused) {
  // A stranger posing as the server echoes the client's hello and proof back: the labels differ, so the
  // client's own proof is not a server's.
  const MemberKey key = ClusterSecret::generate().derive("transfer-tcp");
  Pair p;
  std::thread mirror([&] {
    std::byte buffer[36 + 32];
    size_t got = 0;
    while (got < sizeof(buffer)) {
      if (wait_fd(p.server, POLLIN, Clock::now() + 2s, -1).code != Io::kOk) return;
      const ssize_t n = ::recv(p.server, buffer + got, sizeof(buffer) - got, 0);
      if (n <= 0) return;
      if (got < 36 && got + static_cast<size_t>(n) >= 36)
        (void)send_bytes(p.server, buffer, 36, Clock::now() + 2s, -1);
      got += static_cast<size_t>(n);
    }
    (void)send_bytes(p.server, buffer + 36, 32, Clock::now() + 2s, -1);
  });
  const Status client = member_handshake(p.client, HandshakeSide::kClient, key, Clock::now() + 2s, -1);
  mirror.join();
  EXPECT_EQ(client.code(), StatusCode::kPermissionDenied) << client.message();
}

TEST(MemberHandshake, GarbageAClosedPeerAndASilentOneEndIt) {
  const MemberKey key = ClusterSecret::generate().derive("store-control");
  {
    Pair p;  // an old client speaking the control protocol at once
    const std::string frame(64, 'x');
    ASSERT_EQ(::send(p.client, frame.data(), frame.size(), 0), static_cast<ssize_t>(frame.size()));
    const Status server = member_handshake(p.server, HandshakeSide::kServer, key, Clock::now() + 2s, -1);
    EXPECT_EQ(server.code(), StatusCode::kPermissionDenied) << server.message();
  }
  {
    Pair p;  // a server that hangs up on a stranger
    ::close(p.server);
    p.server = -1;
    const Status client = member_handshake(p.client, HandshakeSide::kClient, key, Clock::now() + 2s, -1);
    EXPECT_EQ(client.code(), StatusCode::kPermissionDenied) << client.message();
  }
  {
    Pair p;  // a peer that says nothing: the deadline ends it
    const auto start = Clock::now();
    const Status server = member_handshake(p.server, HandshakeSide::kServer, key, Clock::now() + 200ms, -1);
    EXPECT_EQ(server.code(), StatusCode::kUnavailable) << server.message();
    EXPECT_LT(Clock::now() - start, 5s);
  }
}

}  // namespace
}  // namespace crescent::net
