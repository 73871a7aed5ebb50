// The etcd-backed MetadataService: etcd 3.4+ spoken to through its v3 JSON gateway (grpc-gateway), so the
// only client dependency is an HTTP library. The gateway's conventions: every request is a POST of a JSON
// body, keys and values are base64, int64 fields (revisions, lease ids, TTLs) travel as JSON strings, and
// fields holding their zero value (an empty value, lease 0, succeeded=false) are omitted from replies.
#include <fmt/format.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "transfer/metadata.h"

namespace crescent::transfer {
namespace {

using nlohmann::json;

std::string base64_encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');  // + 1: EVP_EncodeBlock NUL-terminates
  int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Result<std::string> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) {
    return Status::invalid_argument(
        fmt::format("'{}' is not base64: length {} is not a multiple of 4", text, text.size()));
  }
  std::string out(text.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0) return Status::invalid_argument(fmt::format("'{}' is not base64", text));
  // EVP_DecodeBlock decodes the '=' padding as zero bytes and counts them; the padding says how many.
  size_t padding = 0;
  for (size_t i = text.size(); i > 0 && padding < 2 && text[i - 1] == '='; --i) ++padding;
  out.resize(static_cast<size_t>(n) - padding);
  return out;
}

/// The gateway's int64s are JSON strings (numbers also accepted); absent means 0, as for any proto3 field.
int64_t int64_field(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) return 0;
  const std::string& s = it->get_ref<const std::string&>();
  int64_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

/// The smallest key greater than every key starting with `prefix`: etcd's range_end for a prefix scan.
std::string prefix_range_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();  // 0xff cannot be incremented; carry into the byte before
  }
  return std::string(1, '\0');  // "\0" as range_end means "to the end of the keyspace"
}

/// `endpoint` as "scheme://host:port" for httplib, or kInvalidArgument naming what is malformed. Accepts
/// http and https, an optional port (default 80 / 443), bracketed IPv6 hosts and a trailing '/'.
Result<std::string> normalize_endpoint(const std::string& endpoint) {
  auto bad = [&](std::string_view why) {
    return Status::invalid_argument(
        fmt::format("etcd endpoint '{}' is malformed: {} (expected http://HOST:PORT)", endpoint, why));
  };
  std::string_view rest = endpoint;
  std::string scheme;
  if (rest.starts_with("http://")) {
    scheme = "http";
  } else if (rest.starts_with("https://")) {
    scheme = "https";
  } else {
    return bad("the scheme must be http:// or https://");
  }
  rest.remove_prefix(scheme.size() + 3);
  if (rest.ends_with('/')) rest.remove_suffix(1);
  if (rest.find_first_of("/?#@ ") != std::string_view::npos) {
    return bad("only scheme, host and port are allowed (no path, query or user)");
  }
  std::string_view host;
  std::string_view port;
  if (rest.starts_with('[')) {  // [IPv6]:port
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad("unterminated '[' in the host");
    host = rest.substr(0, close + 1);
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad("unexpected characters after the IPv6 host");
      port = after.substr(1);
    }
  } else {
    size_t colon = rest.find(':');
    host = rest.substr(0, colon);
    if (colon != std::string_view::npos) port = rest.substr(colon + 1);
    if (port.find(':') != std::string_view::npos) return bad("IPv6 hosts must be in brackets");
  }
  if (host.empty() || host == "[]") return bad("the host is empty");
  int port_number = scheme == "http" ? 80 : 443;
  if (!port.empty() || rest.ends_with(':')) {
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), port_number);
    if (ec != std::errc() || end != port.data() + port.size() || port_number < 1 || port_number > 65535) {
      return bad(fmt::format("port '{}' is not a number in 1..65535", port));
    }
  }
  return fmt::format("{}://{}:{}", scheme, host, port_number);
}

// Txn building blocks, in the gateway's JSON shape of etcdserverpb.{Compare,RequestOp}.
json compare_absent(const std::string& key) {
  return {{"key", base64_encode(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}};
}
json compare_lease(const std::string& key, int64_t lease) {
  return {{"key", base64_encode(key)},
          {"target", "LEASE"},
          {"result", "EQUAL"},
          {"lease", std::to_string(lease)}};
}
json put_op(const std::string& key, const std::string& value, int64_t lease) {
  return {{"request_put",
           {{"key", base64_encode(key)}, {"value", base64_encode(value)}, {"lease", std::to_string(lease)}}}};
}
json range_op(const std::string& key) {
  return {{"request_range", {{"key", base64_encode(key)}}}};
}
json delete_op(const std::string& key) {
  return {{"request_delete_range", {{"key", base64_encode(key)}}}};
}

/// One key as a range reports it.
struct KeyValue {
  std::string value;
  int64_t lease = 0;
};

/// The first kv of a RangeResponse, nullopt when the key is absent.
Result<std::optional<KeyValue>> first_kv(const json& range_response) {
  auto kvs = range_response.find("kvs");
  if (kvs == range_response.end() || !kvs->is_array() || kvs->empty()) return std::optional<KeyValue>();
  const json& kv = kvs->front();
  KeyValue out;
  out.lease = int64_field(kv, "lease");
  if (auto v = kv.find("value"); v != kv.end() && v->is_string()) {
    auto decoded = base64_decode(v->get_ref<const std::string&>());
    if (!decoded.ok()) return decoded.status();
    out.value = std::move(*decoded);
  }
  return std::optional<KeyValue>(std::move(out));
}

/// Maps a gateway error (a gRPC status code in the JSON reply) to ours.
StatusCode code_of_grpc_error(int64_t grpc_code, int http_status) {
  switch (grpc_code) {
    case 3:   // INVALID_ARGUMENT, e.g. a value over etcd's request size limit
    case 11:  // OUT_OF_RANGE
      return StatusCode::kInvalidArgument;
    case 4:  // DEADLINE_EXCEEDED
      return StatusCode::kDeadlineExceeded;
    case 5:   // NOT_FOUND: only "requested lease not found" for the calls made here; recovers on retry
    case 8:   // RESOURCE_EXHAUSTED: rate limits, too many requests
    case 10:  // ABORTED
    case 14:  // UNAVAILABLE: no leader, member stopping
      return StatusCode::kUnavailable;
    default:
      return http_status >= 500 ? StatusCode::kUnavailable : StatusCode::kInternal;
  }
}

std::string claim_value(std::string_view engine) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  // The owner's pid and host only serve error messages ("claimed by pid N on host H"); the key holds the
  // name, so bytes that are not UTF-8 may be replaced here rather than fail the claim.
  return json{{"engine", engine}, {"pid", static_cast<int64_t>(getpid())}, {"host", host}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

std::string describe_claim_owner(const std::string& value) {
  json owner = json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!owner.is_object() || !owner.contains("pid") || !owner.contains("host") || !owner["host"].is_string()) {
    return "another process";
  }
  return fmt::format("pid {} on host {}", owner["pid"].dump(), owner["host"].get<std::string>());
}

class EtcdMetadata final : public MetadataService {
 public:
  EtcdMetadata(const EtcdOptions& options, std::string url)
      : endpoint_(options.endpoint),
        url_(std::move(url)),
        prefix_(options.prefix),
        lease_ttl_(options.lease_ttl),
        timeout_(options.request_timeout) {
    while (prefix_.ends_with('/')) prefix_.pop_back();  // "/crescent/" and "/crescent" name the same keys
  }

  ~EtcdMetadata() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (keepalive_thread_.joinable()) keepalive_thread_.join();
    // Revoking deletes every key attached to the lease: the claims and descriptors vanish now instead of
    // one TTL later. Best effort: if etcd is unreachable they still expire with the lease.
    if (lease_id_ != 0) (void)call("/v3/lease/revoke", {{"ID", std::to_string(lease_id_)}});
  }

  /// Grants the lease and starts its keepalive thread.
  Status start() {
    auto lease = grant_lease();
    if (!lease.ok()) return lease.status();
    lease_id_ = *lease;
    keepalive_thread_ = std::thread([this] { keepalive_loop(); });
    return Status();
  }

  Status claim_engine(std::string_view engine) override {
    CRESCENT_RETURN_IF_ERROR(validate_metadata_name("engine", engine));
    std::lock_guard lock(mutex_);
    std::string name(engine);
    if (engines_.contains(name)) {
      return Status::already_exists(fmt::format("engine '{}' is already claimed by this process", engine));
    }
    const std::string key = engine_key(name);
    auto txn =
        transaction({compare_absent(key)}, {put_op(key, claim_value(engine), lease_id_)}, {range_op(key)});
    if (!txn.ok()) return txn.status();
    if (!txn->succeeded) {
      auto owner = first_kv(txn->response(0));
      std::string who =
          owner.ok() && owner->has_value() ? describe_claim_owner((*owner)->value) : "another owner";
      return Status::already_exists(
          fmt::format("engine '{}' is already claimed in etcd at {} under '{}' (by {})", engine, endpoint_,
                      prefix_, who));
    }
    engines_.insert(std::move(name));
    return Status();
  }

  Status release_engine(std::string_view engine) override {
    std::lock_guard lock(mutex_);
    auto claimed = engines_.find(std::string(engine));
    if (claimed == engines_.end()) return Status();
    // Segments first, so that nobody sees them once the name is free to be claimed again. Each delete is
    // conditional on the key still holding our lease: after a lease loss the name may belong to a new owner.
    for (auto it = segments_.begin(); it != segments_.end();) {
      if (it->second.engine != engine) {
        ++it;
        continue;
      }
      const std::string key = segment_key(it->first);
      CRESCENT_RETURN_IF_ERROR(transaction({compare_lease(key, lease_id_)}, {delete_op(key)}, {}).status());
      it = segments_.erase(it);
    }
    const std::string key = engine_key(*claimed);
    CRESCENT_RETURN_IF_ERROR(transaction({compare_lease(key, lease_id_)}, {delete_op(key)}, {}).status());
    engines_.erase(claimed);
    return Status();
  }

  Status publish(const SegmentDescriptor& descriptor) override {
    CRESCENT_RETURN_IF_ERROR(validate_metadata_name("segment", descriptor.name));
    std::string value;
    try {
      value = descriptor.to_json().dump();
    } catch (const json::exception& e) {  // e.g. a string field that is not UTF-8
      return Status::invalid_argument(fmt::format(
          "publish: descriptor of segment '{}' cannot be serialized: {}", descriptor.name, e.what()));
    }
    std::lock_guard lock(mutex_);
    if (!engines_.contains(descriptor.engine)) {
      return Status::failed_precondition(fmt::format(
          "publish: engine '{}' of segment '{}' is not claimed by this process (claim_engine first; "
          "a claim is also lost when its lease expires and another owner takes the name)",
          descriptor.engine, descriptor.name));
    }
    const std::string key = segment_key(descriptor.name);
    // Create if absent, else replace if it is ours (our lease and our engine). A failed compare of the
    // second step means the key changed hands in between; start over, a bounded number of times.
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto created = transaction({compare_absent(key)}, {put_op(key, value, lease_id_)}, {range_op(key)});
      if (!created.ok()) return created.status();
      if (!created->succeeded) {
        auto existing = first_kv(created->response(0));
        if (!existing.ok()) return existing.status();
        if (!existing->has_value()) continue;  // deleted in between
        std::string owner = owner_engine((*existing)->value);
        if ((*existing)->lease != lease_id_ || owner != descriptor.engine) {
          return Status::already_exists(
              fmt::format("segment '{}' is already published in etcd at {} under '{}' by engine '{}'",
                          descriptor.name, endpoint_, prefix_, owner));
        }
        auto replaced = transaction({compare_lease(key, lease_id_)}, {put_op(key, value, lease_id_)}, {});
        if (!replaced.ok()) return replaced.status();
        if (!replaced->succeeded) continue;
      }
      segments_[descriptor.name] = PublishedSegment{descriptor.engine, std::move(value)};
      return Status();
    }
    return Status::unavailable(
        fmt::format("publish: segment '{}' kept changing owner in etcd at {} while publishing; retry",
                    descriptor.name, endpoint_));
  }

  Status withdraw(std::string_view segment) override {
    std::lock_guard lock(mutex_);
    auto it = segments_.find(std::string(segment));
    if (it == segments_.end()) {
      return Status::not_found(
          fmt::format("withdraw: segment '{}' is not published by this process", segment));
    }
    const std::string key = segment_key(it->first);
    auto txn = transaction({compare_lease(key, lease_id_)}, {delete_op(key)}, {});
    if (!txn.ok()) return txn.status();
    segments_.erase(it);
    if (!txn->succeeded) {
      return Status::not_found(fmt::format(
          "withdraw: segment '{}' was no longer ours in etcd at {} (its lease expired)", segment, endpoint_));
    }
    return Status();
  }

  Result<SegmentDescriptor> lookup(std::string_view segment) override {
    auto reply = call("/v3/kv/range", {{"key", base64_encode(segment_key(segment))}});
    if (!reply.ok()) return reply.status();
    auto kv = first_kv(*reply);
    if (!kv.ok()) return kv.status();
    if (!kv->has_value()) {
      return Status::not_found(
          fmt::format("segment '{}' not found in etcd at {} under '{}'", segment, endpoint_, prefix_));
    }
    auto where = [&] {
      return fmt::format("segment '{}' in etcd at {} under '{}'", segment, endpoint_, prefix_);
    };
    json parsed = json::parse((*kv)->value, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) return Status::invalid_argument(fmt::format("{}: value is not JSON", where()));
    auto descriptor = SegmentDescriptor::from_json(parsed);
    if (!descriptor.ok()) {
      return Status::invalid_argument(fmt::format("{}: {}", where(), descriptor.status().message()));
    }
    if (descriptor->name != segment) {
      return Status::invalid_argument(
          fmt::format("{}: holds the descriptor of segment '{}'", where(), descriptor->name));
    }
    return descriptor;
  }

  Result<std::vector<std::string>> list_segments() override {
    const std::string start = prefix_ + "/segments/";
    auto reply = call("/v3/kv/range", {{"key", base64_encode(start)},
                                       {"range_end", base64_encode(prefix_range_end(start))},
                                       {"keys_only", true}});
    if (!reply.ok()) return reply.status();
    std::vector<std::string> names;
    if (auto kvs = reply->find("kvs"); kvs != reply->end() && kvs->is_array()) {
      for (const json& kv : *kvs) {
        auto key = base64_decode(kv.value("key", ""));
        if (!key.ok()) return key.status();
        if (key->starts_with(start)) names.push_back(key->substr(start.size()));
      }
    }
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  struct PublishedSegment {
    std::string engine;
    std::string value;  // the JSON stored in etcd, kept to restore it under a new lease
  };

  struct TxnResult {
    bool succeeded = false;
    json responses;  // one per executed op, e.g. {"response_range": {...}}

    /// The i-th op's response body, unwrapped from its one-field wrapper ({} if absent).
    json response(size_t i) const {
      if (!responses.is_array() || i >= responses.size() || !responses[i].is_object() ||
          responses[i].empty()) {
        return json::object();
      }
      return responses[i].begin().value();
    }
  };

  std::string engine_key(std::string_view engine) const {
    return fmt::format("{}/engines/{}", prefix_, engine);
  }
  std::string segment_key(std::string_view segment) const {
    return fmt::format("{}/segments/{}", prefix_, segment);
  }

  static std::string owner_engine(const std::string& value) {
    json parsed = json::parse(value, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object() && parsed.contains("engine") && parsed["engine"].is_string()) {
      return parsed["engine"].get<std::string>();
    }
    return "?";
  }

  /// POSTs `body` to the gateway's `path`; the reply's JSON, or the error in our codes. A fresh client per
  /// call keeps concurrent callers (lookups from many threads, the keepalive thread) independent.
  Result<json> call(const char* path, const json& body) const {
    httplib::Client client(url_);
    client.set_connection_timeout(timeout_);
    client.set_read_timeout(timeout_);
    client.set_write_timeout(timeout_);
    // The gateway sends its errors chunked with an HTTP trailer (Grpc-Trailer-Content-Type), which httplib
    // 0.11 cannot parse: it reports Error::Read and drops the response. Capturing status and body as they
    // arrive keeps etcd's error; a body that parses as JSON arrived whole.
    httplib::Request request;
    request.method = "POST";
    request.path = path;
    request.headers = {{"Content-Type", "application/json"}};
    request.body = body.dump();
    int http_status = 0;
    std::string received;
    request.response_handler = [&](const httplib::Response& response) {
      http_status = response.status;
      return true;
    };
    request.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
      received.append(data, length);
      return true;
    };
    auto result = client.send(request);
    json reply = json::parse(received, nullptr, /*allow_exceptions=*/false);
    if (!result && (http_status == 0 || !reply.is_object())) {
      return Status::unavailable(fmt::format("etcd at {} cannot be reached: POST {} failed: {}", endpoint_,
                                             path, httplib::to_string(result.error())));
    }
    if (http_status != 200) {
      std::string message = reply.is_object() && reply.contains("message") && reply["message"].is_string()
                                ? reply["message"].get<std::string>()
                                : received.substr(0, 200);
      StatusCode code = code_of_grpc_error(reply.is_object() ? int64_field(reply, "code") : 0, http_status);
      if (message.find("requested lease not found") != std::string::npos) {
        // Our lease expired behind the keepalive thread's back; have it restore the claims now. Set without
        // mutex_ (lookups do not hold it), so a wakeup may be missed; the next tick then catches it.
        lease_suspect_.store(true);
        wake_.notify_all();
      }
      return Status(code, fmt::format("etcd at {}: POST {} failed with HTTP {}: {}", endpoint_, path,
                                      http_status, message));
    }
    if (!reply.is_object()) {
      return Status::unavailable(
          fmt::format("etcd at {}: POST {} answered with something that is not a JSON object (is this etcd's "
                      "client URL?)",
                      endpoint_, path));
    }
    return reply;
  }

  // Vectors, not json: a braced list of one json object would collapse into that object, not an array.
  Result<TxnResult> transaction(const std::vector<json>& compare, const std::vector<json>& success,
                                const std::vector<json>& failure) const {
    json body = {{"compare", compare}, {"success", success}};
    if (!failure.empty()) body["failure"] = failure;
    auto reply = call("/v3/kv/txn", body);
    if (!reply.ok()) return reply.status();
    TxnResult out;
    out.succeeded = reply->value("succeeded", false);
    out.responses = reply->value("responses", json::array());
    return out;
  }

  Result<int64_t> grant_lease() const {
    auto reply = call("/v3/lease/grant", {{"TTL", lease_ttl_.count()}});
    if (!reply.ok()) return reply.status();
    int64_t id = int64_field(*reply, "ID");
    if (id == 0) {
      return Status::unavailable(
          fmt::format("etcd at {} granted no lease: {}", endpoint_, reply->value("error", reply->dump())));
    }
    return id;
  }

  /// One keepalive of `lease`: true if etcd still has it, false if it expired or was revoked.
  Result<bool> keep_alive(int64_t lease) const {
    auto reply = call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}});
    if (!reply.ok()) return reply.status();
    auto result = reply->find("result");  // the gateway wraps each message of the response stream
    if (result == reply->end() || !result->is_object()) {
      return Status::unavailable(
          fmt::format("etcd at {}: keepalive of lease {} failed: {}", endpoint_, lease, reply->dump()));
    }
    return int64_field(*result, "TTL") > 0;  // an unknown lease comes back with no TTL
  }

  void keepalive_loop() {
    const auto interval = std::chrono::duration_cast<std::chrono::milliseconds>(lease_ttl_) / 3;
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait_for(lock, interval, [&] { return stop_ || lease_suspect_.load(); });
      if (stop_) return;
      lease_suspect_.store(false);
      const int64_t lease = lease_id_;
      lock.unlock();
      auto alive = keep_alive(lease);  // a network error is retried at the next tick
      lock.lock();
      if (stop_) return;
      if (alive.ok() && !*alive && lease == lease_id_) restore_under_new_lease();
    }
  }

  /// The lease is gone (etcd was unreachable for longer than the TTL, or someone revoked it), and with it
  /// every key. Re-creates what is still free under a new lease and forgets what another owner took.
  /// REQUIRES: mutex_ held.
  void restore_under_new_lease() {
    auto lease = grant_lease();
    if (!lease.ok()) return;  // still unreachable; the next tick retries
    auto abandon = [&] { (void)call("/v3/lease/revoke", {{"ID", std::to_string(*lease)}}); };
    std::set<std::string> engines;
    for (const std::string& engine : engines_) {
      const std::string key = engine_key(engine);
      auto txn = transaction({compare_absent(key)}, {put_op(key, claim_value(engine), *lease)}, {});
      if (!txn.ok()) return abandon();
      if (txn->succeeded) engines.insert(engine);
    }
    std::map<std::string, PublishedSegment> segments;
    for (auto& [name, segment] : segments_) {
      if (!engines.contains(segment.engine)) continue;
      const std::string key = segment_key(name);
      auto txn = transaction({compare_absent(key)}, {put_op(key, segment.value, *lease)}, {});
      if (!txn.ok()) return abandon();
      if (txn->succeeded) segments.emplace(name, segment);
    }
    lease_id_ = *lease;
    engines_ = std::move(engines);
    segments_ = std::move(segments);
  }

  const std::string endpoint_;  // as the caller wrote it, for messages
  const std::string url_;       // normalized for httplib
  std::string prefix_;          // without a trailing '/'
  const std::chrono::seconds lease_ttl_;
  const std::chrono::milliseconds timeout_;

  std::mutex mutex_;  // guards the fields below; held across a mutation's etcd calls to serialize mutations
  mutable std::condition_variable wake_;  // mutable: call() nudges the keepalive thread
  bool stop_ = false;
  int64_t lease_id_ = 0;
  std::set<std::string> engines_;                     // claimed by this instance
  std::map<std::string, PublishedSegment> segments_;  // published by this instance, by name
  mutable std::atomic<bool> lease_suspect_{false};    // a call saw "lease not found": check before the tick
  std::thread keepalive_thread_;
};

}  // namespace

Result<std::shared_ptr<MetadataService>> make_etcd_metadata(const EtcdOptions& options) {
  // etcd raises a TTL below its minimum (1.5 election timeouts: 2 s by default) to that minimum; the
  // keepalive period stays a third of what was asked, which is only more frequent than needed.
  if (options.lease_ttl < std::chrono::seconds(1)) {
    return Status::invalid_argument(
        fmt::format("etcd lease_ttl must be at least 1 s, got {} s", options.lease_ttl.count()));
  }
  if (options.request_timeout <= std::chrono::milliseconds(0)) {
    return Status::invalid_argument(
        fmt::format("etcd request_timeout must be positive, got {} ms", options.request_timeout.count()));
  }
  auto url = normalize_endpoint(options.endpoint);
  if (!url.ok()) return url.status();
  auto service = std::make_shared<EtcdMetadata>(options, std::move(*url));
  CRESCENT_RETURN_IF_ERROR(service->start());
  return std::shared_ptr<MetadataService>(std::move(service));
}

}  // namespace crescent::transfer
