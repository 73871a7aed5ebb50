// Conversions between the store's types and their protobuf messages (store.proto), shared by the master's
// server and the client. Internal to src/store.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "store.pb.h"
#include "store/master.h"
#include "store/types.h"

namespace crescent::store {

/// The master's control-protocol methods (control_rpc.h), with their request and reply messages in
/// store.proto. The numbers are on the wire: never reuse one.
enum class MasterMethod : uint16_t {
  kHello = 1,           // HelloRequest -> HelloReply
  kMountSegment = 2,    // MountSegmentRequest -> StatusReply
  kUnmountSegment = 3,  // SegmentRequest -> StatusReply
  kRenewSegment = 4,    // RenewSegmentRequest -> RenewSegmentReply
  kPutStart = 5,        // PutStartRequest -> ReplicaListsReply
  kPutEnd = 6,          // PutFinishRequest -> StatusesReply
  kPutRevoke = 7,       // PutFinishRequest -> StatusesReply
  kGetReplicaList = 8,  // KeysRequest -> ReplicaListsReply
  kExists = 9,          // KeysRequest -> ExistsReply
  kRemove = 10,         // KeysRequest -> StatusesReply
  kRemoveAll = 11,      // RemoveAllRequest -> RemoveAllReply
  kStats = 12,          // StatsRequest -> StatsReply
};

}  // namespace crescent::store

namespace crescent::store::rpc_convert {

inline void to_proto(const Status& status, rpc::Status* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_message(status.message());
}

/// A Status from the wire; an out-of-range code becomes kInternal naming it.
inline Status from_proto(const rpc::Status& status) {
  if (status.code() == 0) return Status();
  if (status.code() < 0 || status.code() > static_cast<int32_t>(StatusCode::kCancelled)) {
    return Status::internal("master answered an unknown status code " + std::to_string(status.code()) + ": " +
                            status.message());
  }
  return Status(static_cast<StatusCode>(status.code()), status.message());
}

inline void to_proto(const ReplicaLocation& replica, rpc::Replica* out) {
  out->set_segment(replica.segment);
  out->set_host_id(replica.host_id);
  out->set_offset_bytes(replica.offset_bytes);
  out->set_size_bytes(replica.size_bytes);
  out->set_tier(static_cast<uint32_t>(replica.tier));
}

inline ReplicaLocation from_proto(const rpc::Replica& replica) {
  return {
      replica.segment(), replica.host_id(), replica.offset_bytes(), replica.size_bytes(),
      replica.tier() == static_cast<uint32_t>(ReplicaTier::kSsd) ? ReplicaTier::kSsd : ReplicaTier::kDram};
}

inline void to_proto(const ReplicateConfig& config, rpc::ReplicateConfig* out) {
  out->set_replica_num(config.replica_num);
  out->set_preferred_segment(config.preferred_segment);
  out->set_pin(static_cast<uint32_t>(config.pin));
}

/// kInvalidArgument for a pin value that names no PinKind.
inline Result<ReplicateConfig> from_proto(const rpc::ReplicateConfig& config) {
  if (config.pin() > static_cast<uint32_t>(PinKind::kHard)) {
    return Status::invalid_argument("replicate config: unknown pin value " + std::to_string(config.pin()));
  }
  return ReplicateConfig{config.replica_num(), config.preferred_segment(),
                         static_cast<PinKind>(config.pin())};
}

inline void to_proto(const HeldObject& held, rpc::HeldObject* out) {
  out->set_key(held.key);
  out->set_offset_bytes(held.offset_bytes);
  out->set_size_bytes(held.size_bytes);
  out->set_tier(static_cast<uint32_t>(held.tier));
}

inline HeldObject from_proto(const rpc::HeldObject& held) {
  return {held.key(), held.offset_bytes(), held.size_bytes(),
          held.tier() == static_cast<uint32_t>(ReplicaTier::kSsd) ? ReplicaTier::kSsd : ReplicaTier::kDram};
}

/// The keys of a request as views into it.
template <typename Repeated>
std::vector<std::string_view> key_views(const Repeated& keys) {
  return std::vector<std::string_view>(keys.begin(), keys.end());
}

}  // namespace crescent::store::rpc_convert
