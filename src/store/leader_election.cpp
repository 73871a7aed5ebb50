#include "store/leader_election.h"

#include <fmt/format.h>

#include "common/etcd_client.h"

namespace crescent::store {

std::string leader_key(const EtcdStoreOptions& options) {
  std::string prefix = options.prefix;
  while (prefix.ends_with('/')) prefix.pop_back();
  return prefix + "/master/leader";
}

Result<std::string> find_leader(const EtcdStoreOptions& options) {
  auto client = EtcdClient::create(options.endpoint, options.request_timeout);
  if (!client.ok()) return client.status();
  auto kv = client->get(leader_key(options));
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) {
    return Status::unavailable(fmt::format("no store master leads in etcd at {} (key {} is absent)",
                                           options.endpoint, leader_key(options)));
  }
  return (*kv)->value;
}

ElectionOptions election_options(const EtcdStoreOptions& options) {
  return {.endpoint = options.endpoint,
          .key = leader_key(options),
          .leader_ttl = options.leader_ttl,
          .request_timeout = options.request_timeout};
}

}  // namespace crescent::store
