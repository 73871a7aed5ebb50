// Proving membership on a plain TCP connection (docs/store.md, "Who may use the pool"): the store's control
// protocol and the transfer engine's tcp transport start every connection with a mutual challenge-response
// over a key derived from the cluster secret (common/secret.h), so only members are served and a member
// never sends its bytes to a stranger posing as a peer. The secret never crosses the wire.
//
// Wire (both sides send at once, then read):
//   hello  (36 bytes): u32 magic "CRMB" | 32-byte random nonce
//   proof  (32 bytes): HMAC-SHA-256(key, label | nonce_client | nonce_server), label "client" or "server"
// Distinct labels keep a side from replaying the other's proof back to it; fresh nonces on both sides keep a
// recorded proof from being replayed on another connection.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "common/socket_io.h"
#include "common/status.h"

namespace crescent::net {

/// Which end of the connection: the one that connected, or the one that accepted.
enum class HandshakeSide { kClient, kServer };

/// A 32-byte key both ends derived from the cluster secret for one protocol (ClusterSecret::derive).
using MemberKey = std::array<uint8_t, 32>;

/// Runs the handshake on `fd` (a connected, non-blocking socket) by `deadline`; `stop_fd` (an eventfd, -1
/// for none) ends it early. OK when the peer proved it holds `key`. kPermissionDenied when it did not (a
/// wrong proof, bytes that are not a handshake, or a peer that closed the connection during it: "not a
/// member of this cluster"); kUnavailable when the connection failed or `deadline` passed first. The
/// connection must be closed after an error.
Status member_handshake(int fd, HandshakeSide side, const MemberKey& key, Clock::time_point deadline,
                        int stop_fd);

}  // namespace crescent::net
