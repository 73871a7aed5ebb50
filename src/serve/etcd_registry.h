// The cluster's registry in etcd (issue 10 §2), for clusters spread over machines: the leading Conductor
// holds PREFIX/conductor, its control endpoint (Conductors campaign for it: common/leader_election.h, and
// instances follow whoever holds it), and each instance registers PREFIX/instances/NAME
// ("prefill-0", ...), every key attached to a lease its owner keeps alive. The Conductor takes as up only
// instances that are registered and reporting: one whose lease lapses (it died, hung, or lost etcd) leaves
// the Conductor's view. Without etcd, the Conductor's control socket is the registry (an instance is up while
// it reports).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "common/etcd_client.h"
#include "common/status.h"

namespace crescent::serve {

/// The key an instance named `name` registers under `prefix`, and the Conductor's key.
std::string etcd_instance_key(const std::string& prefix, const std::string& name);
std::string etcd_instances_prefix(const std::string& prefix);
std::string etcd_conductor_key(const std::string& prefix);
/// Where the leading Conductor publishes its HTTP URL (under its leadership's lease).
std::string etcd_conductor_http_key(const std::string& prefix);

/// A key kept in etcd while this object lives: put under a lease of `ttl`, kept alive every ttl/3 from a
/// thread, put again under a new lease when the old one was lost (expired while etcd was unreachable, or
/// revoked), and deleted (its lease revoked) on destruction.
class LeasedKey {
 public:
  /// The first put's error (kUnavailable: etcd unreachable); kInvalidArgument for a ttl under 1 s.
  static Result<std::unique_ptr<LeasedKey>> start(EtcdClient client, std::string key, std::string value,
                                                  std::chrono::seconds ttl);
  ~LeasedKey();
  LeasedKey(const LeasedKey&) = delete;
  LeasedKey& operator=(const LeasedKey&) = delete;

  /// The lease the key is attached to now.
  int64_t lease() const { return lease_; }

 private:
  LeasedKey(EtcdClient client, std::string key, std::string value, std::chrono::seconds ttl)
      : client_(std::move(client)), key_(std::move(key)), value_(std::move(value)), ttl_(ttl) {}
  Status put();
  void keep_alive_loop();

  EtcdClient client_;
  const std::string key_, value_;
  const std::chrono::seconds ttl_;
  std::atomic<int64_t> lease_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

/// The value of `key`, waiting up to `timeout` for it to appear (e.g. an instance finding its Conductor).
/// kUnavailable naming the key when it does not.
Result<std::string> wait_for_etcd_value(const EtcdClient& client, const std::string& key,
                                        std::chrono::milliseconds timeout);

}  // namespace crescent::serve
