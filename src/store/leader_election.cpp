#include "store/leader_election.h"

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/etcd_client.h"

namespace crescent::store {

using Clock = std::chrono::steady_clock;

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

class LeaderElection::Impl {
 public:
  Impl(const EtcdStoreOptions& options, EtcdClient client, std::string address,
       std::function<void()> on_elected, std::function<void()> on_lost)
      : options(options),
        client(std::move(client)),
        address(std::move(address)),
        on_elected(std::move(on_elected)),
        on_lost(std::move(on_lost)) {}

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
    if (lease != 0) (void)client.revoke_lease(lease);  // resign: the key goes with the lease
  }

  /// Sleeps `d` unless stopping; false when stopping.
  bool pause(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu);
    return !cv.wait_for(lock, d, [this] { return stopping; });
  }

  void run() {
    const auto ttl = std::chrono::duration_cast<std::chrono::milliseconds>(options.leader_ttl);
    // Campaign.
    while (!leader) {
      if (lease == 0) {
        auto granted = client.grant_lease(options.leader_ttl);
        if (granted.ok()) lease = *granted;
      }
      if (lease != 0) {
        auto created = client.create_if_absent(leader_key(options), address, lease);
        if (created.ok() && *created) {
          leader = true;
          if (on_elected) on_elected();
          break;
        }
        // Our own lease may have expired while we waited; keep it alive or get a new one.
        auto alive = client.keep_alive(lease);
        if (alive.ok() && !*alive) lease = 0;
      }
      if (!pause(std::max(std::chrono::milliseconds(50), ttl / 10))) return;
    }
    // Lead: keep the lease alive. etcd counts the TTL from when it receives a keepalive, so the lease lasts
    // at least until `sent + ttl` of the last one that succeeded. Step down at 3/4 of that, whatever happens
    // to later keepalives (each bounded by ttl / 4): a deposed leader never serves past its lease.
    Clock::time_point deadline = Clock::now() + ttl * 3 / 4;
    for (;;) {
      const auto until_deadline =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (!pause(std::max(std::chrono::milliseconds(1), std::min(ttl / 3, until_deadline)))) return;
      if (Clock::now() >= deadline) break;
      const Clock::time_point sent = Clock::now();
      auto alive = client.keep_alive(lease);
      if (alive.ok() && *alive) {
        deadline = sent + ttl * 3 / 4;
      } else if (alive.ok()) {
        break;  // etcd no longer has the lease
      }
    }
    leader = false;
    lease = 0;
    if (on_lost) on_lost();
  }

  EtcdStoreOptions options;
  EtcdClient client;
  std::string address;
  std::function<void()> on_elected;
  std::function<void()> on_lost;
  std::atomic<bool> leader{false};
  int64_t lease = 0;  // the election thread's, then the destructor's
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
};

Result<std::unique_ptr<LeaderElection>> LeaderElection::start(const EtcdStoreOptions& options,
                                                              std::string address,
                                                              std::function<void()> on_elected,
                                                              std::function<void()> on_lost) {
  if (options.leader_ttl < std::chrono::seconds(1)) {
    return Status::invalid_argument(
        fmt::format("leader_ttl must be at least 1 s, got {} s", options.leader_ttl.count()));
  }
  if (address.empty()) return Status::invalid_argument("leader election: the master's address is empty");
  // Requests end within a quarter of the TTL, so a leader notices a lost etcd in time to step down.
  auto client = EtcdClient::create(
      options.endpoint,
      std::min(options.request_timeout,
               std::chrono::duration_cast<std::chrono::milliseconds>(options.leader_ttl) / 4));
  if (!client.ok()) return client.status();
  auto impl = std::make_unique<Impl>(options, std::move(*client), std::move(address), std::move(on_elected),
                                     std::move(on_lost));
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<LeaderElection>(new LeaderElection(std::move(impl)));
}

LeaderElection::LeaderElection(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LeaderElection::~LeaderElection() = default;
bool LeaderElection::is_leader() const {
  return impl_->leader.load();
}

}  // namespace crescent::store
