// Segment descriptors and the metadata service through which transfer engines find each other's segments
// (paper §3.2.3: segments are published to a metadata service; peers open them by name).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace crescent::transfer {

/// What a peer needs to reach a named segment: its owner, size, and one entry per transport the owner
/// serves it on (`transports["tcp"]`, `["shm"]`, `["ucx"]`; each transport defines its own fields).
struct SegmentDescriptor {
  std::string name;           // unique in the cluster
  std::string engine;         // name of the owning engine
  std::string host_id;        // identifies the owner's machine (hostname + boot id); shm needs equal ids
  uint64_t length_bytes = 0;  // offsets 0 .. length_bytes - 1 are valid
  nlohmann::json transports = nlohmann::json::object();

  /// {"name","engine","host_id","length_bytes","transports"}.
  nlohmann::json to_json() const;
  /// Parses to_json's shape; kInvalidArgument naming the missing or mistyped field.
  static Result<SegmentDescriptor> from_json(const nlohmann::json& json);
};

/// The rule every MetadataService applies to engine and segment names: 1..200 bytes, no control characters
/// (names become keys and file names). kInvalidArgument naming `what` ("engine", "segment") otherwise.
Status validate_metadata_name(std::string_view what, std::string_view name);

/// Where engines publish and look up segment descriptors. Implementations are thread-safe.
///
/// Ownership and leases: an engine claims its name once (claim_engine) and publishes descriptors under it.
/// When the owner goes away without withdrawing (its process dies, or its lease keepalive stops), its claim
/// and descriptors disappear: at once for the embedded services, within the lease TTL for etcd.
class MetadataService {
 public:
  virtual ~MetadataService() = default;

  /// Claims `engine` as this process's engine name. kAlreadyExists when a live owner holds it.
  virtual Status claim_engine(std::string_view engine) = 0;
  /// Releases the claim and every descriptor published under it. Unknown names are ignored.
  virtual Status release_engine(std::string_view engine) = 0;

  /// Publishes a descriptor of a segment of `descriptor.engine` (which this process claimed).
  /// kAlreadyExists when another engine owns a segment of that name; kFailedPrecondition when the engine
  /// was not claimed here.
  virtual Status publish(const SegmentDescriptor& descriptor) = 0;
  /// Removes this process's descriptor of `segment`. kNotFound when there is none.
  virtual Status withdraw(std::string_view segment) = 0;
  /// The descriptor of `segment`. kNotFound when no live owner publishes it; kUnavailable when the service
  /// cannot be reached.
  virtual Result<SegmentDescriptor> lookup(std::string_view segment) = 0;
  /// Names of every published segment, sorted.
  virtual Result<std::vector<std::string>> list_segments() = 0;
};

/// An embedded service for engines in one process: a map behind a mutex, no external service. Share one
/// instance (shared_ptr) between the engines that should see each other.
std::shared_ptr<MetadataService> make_in_process_metadata();

/// An embedded service for engines in several processes on one machine, still without an external
/// service: one file per engine claim and per descriptor under `directory` (created if missing), written
/// atomically (temporary file + rename). A claim records the owner's pid; entries of a dead pid are ignored
/// and reclaimed, which is this service's lease. kIoError when the directory cannot be created.
Result<std::shared_ptr<MetadataService>> make_directory_metadata(const std::string& directory);

/// Settings of the etcd-backed service.
struct EtcdOptions {
  std::string endpoint = "http://127.0.0.1:2379";  // etcd's client URL (v3 JSON gateway)
  std::string prefix = "/crescent";   // cluster prefix: keys live under PREFIX/engines, /segments
  std::chrono::seconds lease_ttl{5};  // descriptors vanish this long after the owner stops
  std::chrono::milliseconds request_timeout{2000};  // per HTTP request to etcd
};

/// The cluster service: etcd 3.4+ through its v3 JSON gateway (/v3/kv/*, /v3/lease/*). Keys:
/// PREFIX/engines/NAME and PREFIX/segments/NAME, values are JSON, all attached to one lease per process that
/// a background thread keeps alive every ttl/3. Engine claims use a transaction (create only if absent).
/// kUnavailable when etcd cannot be reached at creation.
Result<std::shared_ptr<MetadataService>> make_etcd_metadata(const EtcdOptions& options);

/// The spec of the service every member of one cluster shares when none is given:
/// "dir:/tmp/crescent-store-UID/metadata" (one machine; per user).
std::string default_metadata_spec();

/// Opens the service a spec names: "dir:PATH" (make_directory_metadata) or "etcd:URL" (make_etcd_metadata,
/// prefix /crescent-store). kInvalidArgument for another form; the service's error when it cannot be opened.
/// The store's master hands its spec to nodes and clients (Hello); instances that expose memory without the
/// store (a decode instance) are given the same spec.
Result<std::shared_ptr<MetadataService>> open_metadata(std::string_view spec);

}  // namespace crescent::transfer
