#include "common/member_handshake.h"

#include <fmt/format.h>
#include <sodium.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace crescent::net {
namespace {

constexpr uint32_t kMagic = 0x424d5243;  // bytes "CRMB" on the wire
constexpr size_t kNonceBytes = 32;
constexpr size_t kHelloBytes = 4 + kNonceBytes;
constexpr size_t kProofBytes = crypto_auth_hmacsha256_BYTES;
using Nonce = std::array<unsigned char, kNonceBytes>;
using Proof = std::array<unsigned char, kProofBytes>;

Proof proof_of(const MemberKey& key, std::string_view label, const Nonce& client, const Nonce& server) {
  crypto_auth_hmacsha256_state state;
  crypto_auth_hmacsha256_init(&state, key.data(), key.size());
  crypto_auth_hmacsha256_update(&state, reinterpret_cast<const unsigned char*>(label.data()), label.size());
  crypto_auth_hmacsha256_update(&state, client.data(), client.size());
  crypto_auth_hmacsha256_update(&state, server.data(), server.size());
  Proof proof;
  crypto_auth_hmacsha256_final(&state, proof.data());
  return proof;
}

Status failed(const Io& io, std::string_view during) {
  // Closed, or reset (closed with our bytes unread): the peer hung up on the handshake.
  if (io.code == Io::kClosed || (io.code == Io::kError && (io.error == ECONNRESET || io.error == EPIPE))) {
    return Status::permission_denied(fmt::format(
        "the peer closed the connection during the membership handshake ({}): it is not a member of this "
        "cluster, or does not take this side for one",
        during));
  }
  return Status::unavailable(fmt::format("membership handshake: {}", describe(io, during, {})));
}

}  // namespace

Status member_handshake(int fd, HandshakeSide side, const MemberKey& key, Clock::time_point deadline,
                        int stop_fd) {
  if (sodium_init() < 0) throw std::runtime_error("libsodium could not be initialised");
  Nonce mine;
  randombytes_buf(mine.data(), mine.size());
  std::byte hello[kHelloBytes];
  put_le<uint32_t>(hello, kMagic);
  std::memcpy(hello + 4, mine.data(), mine.size());
  if (Io io = send_bytes(fd, hello, sizeof(hello), deadline, stop_fd); !io.ok()) return failed(io, "hello");
  // The magic first: a peer speaking another protocol is refused at once, not at the deadline.
  std::byte magic[4];
  if (Io io = recv_all(fd, magic, sizeof(magic), deadline, stop_fd); !io.ok())
    return failed(io, "the peer's hello");
  if (get_le<uint32_t>(magic) != kMagic)
    return Status::permission_denied("the peer is not a member of this cluster (no membership handshake)");
  Nonce theirs;
  if (Io io = recv_all(fd, theirs.data(), theirs.size(), deadline, stop_fd); !io.ok())
    return failed(io, "the peer's hello");

  const bool client = side == HandshakeSide::kClient;
  const Nonce& client_nonce = client ? mine : theirs;
  const Nonce& server_nonce = client ? theirs : mine;
  const Proof my_proof = proof_of(key, client ? "client" : "server", client_nonce, server_nonce);
  const Proof expected = proof_of(key, client ? "server" : "client", client_nonce, server_nonce);
  if (Io io = send_bytes(fd, my_proof.data(), my_proof.size(), deadline, stop_fd); !io.ok())
    return failed(io, "proof");
  Proof their_proof;
  if (Io io = recv_all(fd, their_proof.data(), their_proof.size(), deadline, stop_fd); !io.ok())
    return failed(io, "the peer's proof");
  if (sodium_memcmp(their_proof.data(), expected.data(), expected.size()) != 0)
    return Status::permission_denied("the peer is not a member of this cluster (wrong key)");
  return Status();
}

}  // namespace crescent::net
