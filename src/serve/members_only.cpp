#include "serve/members_only.h"

#include <sodium.h>

#include <cstring>
#include <vector>
#include <zmq_addon.hpp>

namespace crescent::serve {
namespace {

// What the keys are derived for (ClusterSecret::curve_key_pair): the servers' pair, the members' pair.
constexpr std::string_view kServerKeys = "zmq-server";
constexpr std::string_view kMemberKeys = "zmq-member";

}  // namespace

MembersOnly::MembersOnly(zmq::context_t& context, const ClusterSecret& secret)
    : handler_(context, zmq::socket_type::rep),
      member_public_key_(secret.curve_key_pair(kMemberKeys).public_key) {}

Result<std::unique_ptr<MembersOnly>> MembersOnly::start(zmq::context_t& context,
                                                        const ClusterSecret& secret) {
  std::unique_ptr<MembersOnly> zap(new MembersOnly(context, secret));
  try {
    zap->handler_.set(zmq::sockopt::linger, 0);
    zap->handler_.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    return Status::internal(std::string("cannot start the members-only check (ZAP): ") + e.what());
  }
  zap->thread_ = std::thread([raw = zap.get()] { raw->run(); });
  return zap;
}

MembersOnly::~MembersOnly() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

// ZAP (ZeroMQ RFC 27): a request is [version "1.0", request id, domain, address, identity, mechanism,
// credentials...]; the reply [version, request id, status code, status text, user id, metadata].
void MembersOnly::run() {
  zmq::pollitem_t item{handler_.handle(), 0, ZMQ_POLLIN, 0};
  while (!stopping_) {
    zmq::poll(&item, 1, std::chrono::milliseconds(50));
    if ((item.revents & ZMQ_POLLIN) == 0) continue;
    std::vector<zmq::message_t> request;
    if (!zmq::recv_multipart(handler_, std::back_inserter(request), zmq::recv_flags::dontwait)) continue;
    bool admitted = false;
    if (request.size() >= 7 && request[5].to_string_view() == "CURVE" && request[6].size() == 32) {
      admitted = sodium_memcmp(request[6].data(), member_public_key_.data(), 32) == 0;
    }
    if (!admitted) ++refused_;
    const std::string id = request.size() >= 2 ? request[1].to_string() : std::string();
    std::array<zmq::const_buffer, 6> reply{zmq::str_buffer("1.0"),
                                           zmq::buffer(id),
                                           admitted ? zmq::str_buffer("200") : zmq::str_buffer("400"),
                                           admitted ? zmq::str_buffer("OK") : zmq::str_buffer("not a member"),
                                           zmq::str_buffer(""),
                                           zmq::str_buffer("")};
    (void)zmq::send_multipart(handler_, reply);
  }
}

void make_member_server(zmq::socket_t& socket, const ClusterSecret& secret) {
  const CurveKeyPair keys = secret.curve_key_pair(kServerKeys);
  socket.set(zmq::sockopt::curve_server, true);
  socket.set(zmq::sockopt::curve_secretkey,
             zmq::const_buffer(keys.secret_key.data(), keys.secret_key.size()));
  socket.set(zmq::sockopt::zap_domain, "crescent");
}

void make_member_client(zmq::socket_t& socket, const ClusterSecret& secret) {
  const CurveKeyPair server = secret.curve_key_pair(kServerKeys);
  const CurveKeyPair member = secret.curve_key_pair(kMemberKeys);
  socket.set(zmq::sockopt::curve_serverkey,
             zmq::const_buffer(server.public_key.data(), server.public_key.size()));
  socket.set(zmq::sockopt::curve_publickey,
             zmq::const_buffer(member.public_key.data(), member.public_key.size()));
  socket.set(zmq::sockopt::curve_secretkey,
             zmq::const_buffer(member.secret_key.data(), member.secret_key.size()));
}

}  // namespace crescent::serve
