// A small client of etcd 3.4+'s v3 JSON gateway (grpc-gateway): key-value reads, transactions and leases over
// HTTP with cpp-httplib, errors as crescent Status codes. Shared by the transfer engine's etcd
// MetadataService (transfer/etcd_metadata.cpp), the store's leader election and serve's registry: anything
// that keeps state in etcd under a lease. Its own library, crescent_etcd, so that only its users link
// cpp-httplib and OpenSSL.
//
// The gateway's conventions, handled here: every request is a POST of a JSON body, keys and values are
// base64, int64 fields (revisions, lease ids, TTLs) travel as JSON strings, and fields holding their zero
// value (an empty value, lease 0, succeeded=false) are omitted from replies.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace crescent {

/// One key as a range reports it (the key itself is what was asked for).
struct EtcdKeyValue {
  std::string value;            // raw bytes, decoded from base64
  int64_t lease = 0;            // the lease the key is attached to; 0 for none
  int64_t create_revision = 0;  // revision of the put that created the key (changes only if it is re-created)
  int64_t mod_revision = 0;     // revision of the key's last put
};

/// Outcome of a txn: which branch ran and the responses of its ops.
struct EtcdTxnResult {
  bool succeeded = false;    // true: every compare held and the success ops ran; false: the failure ops ran
  nlohmann::json responses;  // one per executed op, e.g. {"response_range": {...}}

  /// The i-th op's response body, unwrapped from its one-field wrapper ({} if absent).
  nlohmann::json response(size_t i) const;
};

/// Talks to one etcd endpoint. Every call opens a fresh HTTP connection, so one client may be used from any
/// number of threads at once (set_lease_lost_callback aside). Copyable; a copy keeps the callback.
///
/// Errors of every call: kUnavailable when etcd cannot be reached or times out (request_timeout per request),
/// answers with something that is not a JSON object, has no leader, or rate-limits; kDeadlineExceeded when
/// etcd reports its own deadline passed; kInvalidArgument for a request etcd refuses (e.g. a value over its
/// size limit); kUnavailable also for etcd's "requested lease not found" (a put under, or a revoke of, a
/// lease etcd no longer has), which recovers once the caller has a new lease. Messages name the endpoint and
/// the gateway path.
class EtcdClient {
 public:
  /// A client of `endpoint`, "http[s]://HOST[:PORT][/]" (port 80 / 443 by default, IPv6 hosts in brackets).
  /// Does not contact etcd. kInvalidArgument naming what is malformed (quoting `endpoint`), or when
  /// `request_timeout` is not positive.
  static Result<EtcdClient> create(const std::string& endpoint, std::chrono::milliseconds request_timeout);

  /// The endpoint as given to create (for messages).
  const std::string& endpoint() const { return endpoint_; }
  /// The per-request timeout (connect, read and write each).
  std::chrono::milliseconds request_timeout() const { return timeout_; }

  /// POSTs `body` to the gateway's `path` ("/v3/kv/range", "/v3/kv/txn", "/v3/lease/grant", ...): the reply
  /// (a JSON object), or the error in crescent codes (see the class comment).
  Result<nlohmann::json> call(const char* path, const nlohmann::json& body) const;

  /// One txn: if every `compare` holds, runs `success`, else `failure` (ops built with the helpers below).
  /// Vectors, not json: a braced list of one json object would collapse into that object, not an array.
  Result<EtcdTxnResult> transaction(const std::vector<nlohmann::json>& compare,
                                    const std::vector<nlohmann::json>& success,
                                    const std::vector<nlohmann::json>& failure) const;

  /// Grants a lease of `ttl` (etcd raises a TTL below its minimum, 1.5 election timeouts, to that minimum);
  /// its id. kInvalidArgument when `ttl` is under 1 s; kUnavailable when etcd grants none.
  Result<int64_t> grant_lease(std::chrono::seconds ttl) const;
  /// One keepalive of `lease`: true if etcd still has it (its TTL restarts), false if it expired or was
  /// revoked. An error means the answer is unknown (e.g. etcd unreachable), not that the lease is gone.
  Result<bool> keep_alive(int64_t lease) const;
  /// Revokes `lease`, deleting every key attached to it. kUnavailable when etcd does not have it (anymore),
  /// like every "requested lease not found" (which also runs the lease-lost callback).
  Status revoke_lease(int64_t lease) const;

  /// The value of `key`; nullopt when it is absent. kInvalidArgument when etcd's reply cannot be decoded.
  Result<std::optional<EtcdKeyValue>> get(const std::string& key) const;
  /// Every key starting with `prefix` (whole keys, prefix included), sorted by bytes. Keys only, no values.
  Result<std::vector<std::string>> list_keys(const std::string& prefix) const;
  /// The same keys, each with its lease and revisions (EtcdKeyValue::value left empty: values are not
  /// read). A key deleted and put again (e.g. its lease lapsed and its owner registered anew) comes back
  /// with a new create_revision.
  Result<std::vector<std::pair<std::string, EtcdKeyValue>>> list(const std::string& prefix) const;
  /// Puts `key` = `value` attached to `lease` (0: none) only if the key does not exist, atomically. true when
  /// created; false when the key existed, and then `*existing` (if not null) receives it as it was.
  Result<bool> create_if_absent(const std::string& key, const std::string& value, int64_t lease,
                                std::optional<EtcdKeyValue>* existing = nullptr) const;
  /// Deletes `key` only while it is attached to `lease`, atomically. true if deleted; false when the key is
  /// absent or attached to another lease (or none).
  Result<bool> delete_if_lease(const std::string& key, int64_t lease) const;

  /// Sets what to run when etcd answers a call with "requested lease not found" (one of the caller's leases
  /// expired or was revoked behind its back); run on the calling thread, after the reply, before the call
  /// returns its error. Empty: nothing. REQUIRES: no call in progress (set it before sharing the client).
  void set_lease_lost_callback(std::function<void()> callback) { lease_lost_ = std::move(callback); }

  // Txn building blocks, in the gateway's JSON shape of etcdserverpb.{Compare,RequestOp}.

  /// Compare: `key` does not exist (create_revision == 0).
  static nlohmann::json compare_absent(const std::string& key);
  /// Compare: `key` is attached to `lease` (false when the key is absent and `lease` is not 0).
  static nlohmann::json compare_lease(const std::string& key, int64_t lease);
  /// Op: put `key` = `value` attached to `lease` (0: none).
  static nlohmann::json put_op(const std::string& key, const std::string& value, int64_t lease);
  /// Op: range over the single key `key`.
  static nlohmann::json range_op(const std::string& key);
  /// Op: delete the single key `key`.
  static nlohmann::json delete_op(const std::string& key);

  // Gateway encoding helpers, for requests built by hand for call().

  /// The smallest key greater than every key starting with `prefix`: etcd's range_end for a prefix scan
  /// ("\0", meaning the end of the keyspace, when every byte of `prefix` is 0xff or it is empty).
  static std::string prefix_range_end(std::string prefix);
  /// The first kv of a RangeResponse (a range call's reply or a txn's response_range), nullopt when the key
  /// is absent. kInvalidArgument when its value is not base64.
  static Result<std::optional<EtcdKeyValue>> first_kv(const nlohmann::json& range_response);
  /// Standard base64 with padding, as the gateway wants keys and values.
  static std::string base64_encode(std::string_view bytes);
  /// The bytes of standard padded base64; kInvalidArgument quoting `text` when it is not.
  static Result<std::string> base64_decode(std::string_view text);
  /// The int64 field `key` of a reply object: a JSON string (numbers also accepted); 0 when absent or not a
  /// number, as for any proto3 field.
  static int64_t int64_field(const nlohmann::json& object, const char* key);

 private:
  EtcdClient(std::string endpoint, std::string url, std::chrono::milliseconds timeout)
      : endpoint_(std::move(endpoint)), url_(std::move(url)), timeout_(timeout) {}

  std::string endpoint_;  // as the caller wrote it, for messages
  std::string url_;       // normalized for httplib: scheme://host:port
  std::chrono::milliseconds timeout_;
  std::function<void()> lease_lost_;
};

}  // namespace crescent
