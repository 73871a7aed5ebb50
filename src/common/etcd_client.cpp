// EtcdClient: etcd's v3 JSON gateway over cpp-httplib, base64 through OpenSSL.
#include "common/etcd_client.h"

#include <fmt/format.h>
#include <httplib.h>
#include <openssl/evp.h>

#include <charconv>
#include <utility>

namespace crescent {
namespace {

using nlohmann::json;

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

/// Maps a gateway error (a gRPC status code in the JSON reply) to ours.
StatusCode code_of_grpc_error(int64_t grpc_code, int http_status) {
  switch (grpc_code) {
    case 3:   // INVALID_ARGUMENT, e.g. a value over etcd's request size limit
    case 11:  // OUT_OF_RANGE
      return StatusCode::kInvalidArgument;
    case 4:  // DEADLINE_EXCEEDED
      return StatusCode::kDeadlineExceeded;
    case 5:   // NOT_FOUND: "requested lease not found" for the calls made here; recovers with a new lease
    case 8:   // RESOURCE_EXHAUSTED: rate limits, too many requests
    case 10:  // ABORTED
    case 14:  // UNAVAILABLE: no leader, member stopping
      return StatusCode::kUnavailable;
    default:
      return http_status >= 500 ? StatusCode::kUnavailable : StatusCode::kInternal;
  }
}

}  // namespace

json EtcdTxnResult::response(size_t i) const {
  if (!responses.is_array() || i >= responses.size() || !responses[i].is_object() || responses[i].empty()) {
    return json::object();
  }
  return responses[i].begin().value();
}

Result<EtcdClient> EtcdClient::create(const std::string& endpoint,
                                      std::chrono::milliseconds request_timeout) {
  if (request_timeout <= std::chrono::milliseconds(0)) {
    return Status::invalid_argument(
        fmt::format("etcd request_timeout must be positive, got {} ms", request_timeout.count()));
  }
  auto url = normalize_endpoint(endpoint);
  if (!url.ok()) return url.status();
  return EtcdClient(endpoint, std::move(*url), request_timeout);
}

Result<json> EtcdClient::call(const char* path, const json& body) const {
  // A fresh client per call keeps concurrent callers (lookups from many threads, a keepalive thread)
  // independent.
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
    if (lease_lost_ && message.find("requested lease not found") != std::string::npos) lease_lost_();
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

Result<EtcdTxnResult> EtcdClient::transaction(const std::vector<json>& compare,
                                              const std::vector<json>& success,
                                              const std::vector<json>& failure) const {
  json body = {{"compare", compare}, {"success", success}};
  if (!failure.empty()) body["failure"] = failure;
  auto reply = call("/v3/kv/txn", body);
  if (!reply.ok()) return reply.status();
  EtcdTxnResult out;
  out.succeeded = reply->value("succeeded", false);
  out.responses = reply->value("responses", json::array());
  return out;
}

Result<int64_t> EtcdClient::grant_lease(std::chrono::seconds ttl) const {
  if (ttl < std::chrono::seconds(1)) {
    return Status::invalid_argument(
        fmt::format("etcd lease TTL must be at least 1 s, got {} s", ttl.count()));
  }
  auto reply = call("/v3/lease/grant", {{"TTL", ttl.count()}});
  if (!reply.ok()) return reply.status();
  int64_t id = int64_field(*reply, "ID");
  if (id == 0) {
    return Status::unavailable(
        fmt::format("etcd at {} granted no lease: {}", endpoint_, reply->value("error", reply->dump())));
  }
  return id;
}

Result<bool> EtcdClient::keep_alive(int64_t lease) const {
  auto reply = call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}});
  if (!reply.ok()) return reply.status();
  auto result = reply->find("result");  // the gateway wraps each message of the response stream
  if (result == reply->end() || !result->is_object()) {
    return Status::unavailable(
        fmt::format("etcd at {}: keepalive of lease {} failed: {}", endpoint_, lease, reply->dump()));
  }
  return int64_field(*result, "TTL") > 0;  // an unknown lease comes back with no TTL
}

Status EtcdClient::revoke_lease(int64_t lease) const {
  return call("/v3/lease/revoke", {{"ID", std::to_string(lease)}}).status();
}

Result<std::optional<EtcdKeyValue>> EtcdClient::get(const std::string& key) const {
  auto reply = call("/v3/kv/range", {{"key", base64_encode(key)}});
  if (!reply.ok()) return reply.status();
  return first_kv(*reply);
}

Result<std::vector<std::string>> EtcdClient::list_keys(const std::string& prefix) const {
  auto entries = list(prefix);
  if (!entries.ok()) return entries.status();
  std::vector<std::string> keys;
  keys.reserve(entries->size());
  for (auto& [key, kv] : *entries) keys.push_back(std::move(key));
  return keys;
}

Result<std::vector<std::pair<std::string, EtcdKeyValue>>> EtcdClient::list(const std::string& prefix) const {
  // etcd refuses an empty key; "\0" up to range_end "\0" is the whole keyspace.
  const std::string start = prefix.empty() ? std::string(1, '\0') : prefix;
  auto reply = call("/v3/kv/range", {{"key", base64_encode(start)},
                                     {"range_end", base64_encode(prefix_range_end(prefix))},
                                     {"keys_only", true}});
  if (!reply.ok()) return reply.status();
  std::vector<std::pair<std::string, EtcdKeyValue>> entries;
  if (auto kvs = reply->find("kvs"); kvs != reply->end() && kvs->is_array()) {
    for (const json& kv : *kvs) {
      auto key = base64_decode(kv.value("key", ""));
      if (!key.ok()) return key.status();
      EtcdKeyValue entry;
      entry.lease = int64_field(kv, "lease");
      entry.create_revision = int64_field(kv, "create_revision");
      entry.mod_revision = int64_field(kv, "mod_revision");
      entries.emplace_back(std::move(*key), std::move(entry));
    }
  }
  return entries;
}

Result<bool> EtcdClient::create_if_absent(const std::string& key, const std::string& value, int64_t lease,
                                          std::optional<EtcdKeyValue>* existing) const {
  // The failure branch reads the key in the same revision as the compare, so it is there to report.
  std::vector<json> failure;
  if (existing != nullptr) failure.push_back(range_op(key));
  auto txn = transaction({compare_absent(key)}, {put_op(key, value, lease)}, failure);
  if (!txn.ok()) return txn.status();
  if (txn->succeeded) return true;
  if (existing != nullptr) {
    auto kv = first_kv(txn->response(0));
    if (!kv.ok()) return kv.status();
    *existing = std::move(*kv);
  }
  return false;
}

Result<bool> EtcdClient::delete_if_lease(const std::string& key, int64_t lease) const {
  auto txn = transaction({compare_lease(key, lease)}, {delete_op(key)}, {});
  if (!txn.ok()) return txn.status();
  // With lease 0 the compare also holds for an absent key: count what was deleted.
  return txn->succeeded && int64_field(txn->response(0), "deleted") > 0;
}

json EtcdClient::compare_absent(const std::string& key) {
  return {{"key", base64_encode(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}};
}

json EtcdClient::compare_lease(const std::string& key, int64_t lease) {
  return {{"key", base64_encode(key)},
          {"target", "LEASE"},
          {"result", "EQUAL"},
          {"lease", std::to_string(lease)}};
}

json EtcdClient::put_op(const std::string& key, const std::string& value, int64_t lease) {
  return {{"request_put",
           {{"key", base64_encode(key)}, {"value", base64_encode(value)}, {"lease", std::to_string(lease)}}}};
}

json EtcdClient::range_op(const std::string& key) {
  return {{"request_range", {{"key", base64_encode(key)}}}};
}

json EtcdClient::delete_op(const std::string& key) {
  return {{"request_delete_range", {{"key", base64_encode(key)}}}};
}

std::string EtcdClient::prefix_range_end(std::string prefix) {
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

Result<std::optional<EtcdKeyValue>> EtcdClient::first_kv(const json& range_response) {
  auto kvs = range_response.find("kvs");
  if (kvs == range_response.end() || !kvs->is_array() || kvs->empty()) return std::optional<EtcdKeyValue>();
  const json& kv = kvs->front();
  EtcdKeyValue out;
  out.lease = int64_field(kv, "lease");
  out.create_revision = int64_field(kv, "create_revision");
  out.mod_revision = int64_field(kv, "mod_revision");
  if (auto v = kv.find("value"); v != kv.end() && v->is_string()) {
    auto decoded = base64_decode(v->get_ref<const std::string&>());
    if (!decoded.ok()) return decoded.status();
    out.value = std::move(*decoded);
  }
  return std::optional<EtcdKeyValue>(std::move(out));
}

std::string EtcdClient::base64_encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');  // + 1: EVP_EncodeBlock NUL-terminates
  int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Result<std::string> EtcdClient::base64_decode(std::string_view text) {
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

int64_t EtcdClient::int64_field(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) return 0;
  const std::string& s = it->get_ref<const std::string&>();
  int64_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

}  // namespace crescent
