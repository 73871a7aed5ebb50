#include "common/leader_election.h"

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "common/etcd_client.h"

namespace crescent {

using Clock = std::chrono::steady_clock;

class LeaderElection::Impl {
 public:
  Impl(const ElectionOptions& options, EtcdClient client, std::string address,
       std::function<void(int64_t)> on_elected, std::function<void()> on_lost)
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
        std::optional<EtcdKeyValue> existing;
        auto created = client.create_if_absent(options.key, address, lease, &existing);
        // Held under our own lease: an earlier create took effect though its answer was lost (a timeout).
        const bool ours = created.ok() && !*created && existing && existing->lease == lease;
        if (created.ok() && (*created || ours)) {
          leader = true;
          leader_lease = lease;
          if (on_elected) on_elected(lease);
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
    leader_lease = 0;
    lease = 0;
    if (on_lost) on_lost();
  }

  ElectionOptions options;
  EtcdClient client;
  std::string address;
  std::function<void(int64_t)> on_elected;
  std::function<void()> on_lost;
  std::atomic<bool> leader{false};
  std::atomic<int64_t> leader_lease{0};  // lease while leading, for lease()
  int64_t lease = 0;                     // the election thread's, then the destructor's
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
};

Result<std::unique_ptr<LeaderElection>> LeaderElection::start(const ElectionOptions& options,
                                                              std::string address,
                                                              std::function<void(int64_t)> on_elected,
                                                              std::function<void()> on_lost) {
  if (options.leader_ttl < std::chrono::seconds(1)) {
    return Status::invalid_argument(
        fmt::format("leader_ttl must be at least 1 s, got {} s", options.leader_ttl.count()));
  }
  if (address.empty())
    return Status::invalid_argument("leader election: the leader's value (its address) is empty");
  if (options.key.empty()) return Status::invalid_argument("leader election: the leader key is empty");
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
int64_t LeaderElection::lease() const {
  return impl_->leader_lease.load();
}

}  // namespace crescent
