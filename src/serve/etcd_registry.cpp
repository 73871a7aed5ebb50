#include "serve/etcd_registry.h"

#include <fmt/format.h>

namespace crescent::serve {

std::string etcd_instances_prefix(const std::string& prefix) {
  return prefix + "/instances/";
}
std::string etcd_instance_key(const std::string& prefix, const std::string& name) {
  return etcd_instances_prefix(prefix) + name;
}
std::string etcd_conductor_key(const std::string& prefix) {
  return prefix + "/conductor";
}

std::string etcd_conductor_http_key(const std::string& prefix) {
  return prefix + "/conductor-http";
}

Result<std::unique_ptr<LeasedKey>> LeasedKey::start(EtcdClient client, std::string key, std::string value,
                                                    std::chrono::seconds ttl) {
  if (ttl < std::chrono::seconds(1))
    return Status::invalid_argument("an etcd lease needs a TTL of 1 s or more");
  std::unique_ptr<LeasedKey> leased(new LeasedKey(std::move(client), std::move(key), std::move(value), ttl));
  CRESCENT_RETURN_IF_ERROR(leased->put());
  leased->thread_ = std::thread([k = leased.get()] { k->keep_alive_loop(); });
  return leased;
}

LeasedKey::~LeasedKey() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  (void)client_.revoke_lease(lease_);  // deletes the key; best effort (etcd may be gone)
}

Status LeasedKey::put() {
  auto lease = client_.grant_lease(ttl_);
  if (!lease.ok()) return lease.status();
  // Unconditional: a key left by an earlier incarnation (its lease not yet expired) is taken over.
  auto put = client_.transaction({}, {EtcdClient::put_op(key_, value_, *lease)}, {});
  if (!put.ok()) return put.status();
  lease_ = *lease;
  return Status();
}

void LeasedKey::keep_alive_loop() {
  const auto period = std::chrono::duration_cast<std::chrono::milliseconds>(ttl_) / 3;
  auto next = std::chrono::steady_clock::now() + period;
  while (!stopping_) {
    if (std::chrono::steady_clock::now() < next) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    next += period;
    auto alive = client_.keep_alive(lease_);
    if (alive.ok() && !*alive) (void)put();  // lost: register again (an error is retried next period)
  }
}

Result<std::string> wait_for_etcd_value(const EtcdClient& client, const std::string& key,
                                        std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Status last;
  while (std::chrono::steady_clock::now() < deadline) {
    auto kv = client.get(key);
    if (kv.ok() && kv->has_value()) return (*kv)->value;
    if (!kv.ok()) last = kv.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Status::unavailable(fmt::format("no '{}' in etcd {} after {} ms{}", key, client.endpoint(),
                                         timeout.count(), last.ok() ? "" : ": " + last.message()));
}

}  // namespace crescent::serve
