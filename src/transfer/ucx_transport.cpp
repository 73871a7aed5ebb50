// UCX transport: one-sided reads and writes with UCP RMA (ucp_get_nbx; ucp_put_nbx + ucp_ep_flush_nbx).
//
// expose() maps the segment (ucp_mem_map of the existing range) and publishes in the descriptor's "ucx" entry
// what a peer needs: this engine's worker address and the packed rkey (both hex), the segment's base address,
// its id, and this process's pid. open() creates (or reuses) one endpoint per remote worker from that address
// and unpacks the rkey on it. Local buffers are not mapped: put/get here are software emulation over active
// messages (below), which copy through the local buffer and never consult a memh, and on RDMA hardware UCX's
// registration cache registers an unregistered buffer on first use by itself.
//
// Threading: one ucp_context and one ucp_worker per engine (its own UCX_TLS through ucp_config_modify, so
// engines of one process may differ), owned by one progress thread that makes every UCX call
// (UCS_THREAD_MODE_SINGLE). Other threads hand it work through queues and an eventfd. The thread keeps
// progressing the worker even with nothing of its own in flight: without RMA hardware UCX emulates put/get
// with active messages, so the *target's* worker must run to serve peers. It busy-polls while there is work
// and otherwise sleeps in poll() on the worker's event fd (ucp_worker_arm) and its eventfd.
//
// What UCX 1.13.1 does on this kind of host (no RDMA devices; checked with ucp_ep_print_info and
// UCX_PROTO_ENABLE=y UCX_PROTO_INFO=y):
//  - tls "tcp": resources tcp/lo and tcp/eth0 (loopback is usable by default, NET_DEVICES need not change);
//    an endpoint gets one tcp/lo lane (am, keepalive, wireup) and put/get run as "software emulation" over
//    active messages.
//  - tls "posix,sysv,cma,self": posix and sysv cannot detect peer failure in 1.13, so ucp_ep_create with
//    UCP_ERR_HANDLING_MODE_PEER fails with "Destination is unreachable" ("no peer failure handler"); such
//    peers are reached with UCP_ERR_HANDLING_MODE_NONE instead (remembered per host). The endpoint then has a
//    sysv/memory am lane and a posix/memory lane, and put/get are again software emulation over the shared
//    memory FIFOs. cma (zero-copy only) is never chosen for ucp_put/get by 1.13.
//
// Failure handling:
//  - ucp_request_cancel only cancels tag receives in 1.13: an RMA operation cannot be cancelled alone. What
//    does make UCX let go of operations is ucp_ep_close_nbx(UCP_EP_CLOSE_FLAG_FORCE): it completes every
//    operation of the endpoint with UCS_ERR_CANCELED before it returns. So when a request's deadline passes
//    on a PEER-mode endpoint, ucp_request_cancel is tried, then the endpoint is force-closed: the expired
//    operations fail (kDeadlineExceeded) and its other operations are re-posted on a new endpoint
//    (slices_retried).
//  - FORCE is refused (UCS_ERR_INVALID_PARAM) on NONE-mode endpoints and nothing else aborts an operation.
//    There UCX works on a bounce buffer owned by the operation, so it can be failed at its deadline while UCX
//    still holds it: a late reply lands in the bounce buffer, never in memory the caller may have freed.
//    An operation a forced close cancels because *another* operation of its endpoint expired is re-posted
//    on a new endpoint at most FailureOptions::retry_budget times; beyond that it fails, naming the reason.
//  - Should a forced close ever return with operations still in flight (not seen in 1.13: it purges every
//    request of the endpoint before it returns), those are reported only when UCX completes them (their
//    callback, at the latest when ucp_worker_destroy cancels them at shutdown): a PEER-mode operation works
//    on the caller's buffer, so reporting it earlier would let the caller free memory UCX still writes to.
//  - A failed peer is seen through the endpoint's error callback or a failed operation (PEER mode) and, for
//    peers in another process on this host, through a pidfd of the owner (both modes; in NONE mode the only
//    prompt signal). Its operations fail and its endpoint is dropped. For FailureOptions::path_cooldown
//    after that the remote worker is not connected to again: requests to it (and open_segment of its
//    segments) fail at once with "cooling down after <failure>", naming the engine and segment; the first
//    request after the cool-down connects afresh. A peer restarted meanwhile has a new worker address, so it
//    is reachable at once through a re-opened segment. A request deadline passing is not a peer failure (a
//    hung peer may recover) and starts no cool-down.
//  - FailureOptions::connect_timeout is not used: ucp_ep_create does not wait for the peer and UCX 1.13
//    exposes no per-connection timer or "connected" state; a connection that never comes up fails through
//    the endpoint's error callback (UCX's own timeouts) or, at the latest, at the request deadline.
//  - Stale rkeys are NOT rejected: UCX's software RMA target (ucp_put_handler and the get handler in
//    rma_sw.c) copies to/from the raw address carried in the message without checking it against any
//    registration, and ucp_mem_unmap does not revoke rkeys already handed out. A peer that keeps using a
//    handle after withdraw_segment still reads and writes that memory while it stays mapped, and makes this
//    process die of SIGSEGV once it is unmapped (free_memory). Only RDMA transports, where the NIC checks
//    the rkey, turn that into an error at the initiator. The core withdraws the descriptor first, so new
//    open_segment calls fail; peers must drop their handles when a segment goes away.
#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "transfer/transport.h"

namespace crescent::transfer::internal {
namespace {

// Requests are cut into UCX operations of at most this many bytes, so the parts of a large request proceed
// and are counted independently, and NONE-mode bounce buffers stay bounded.
constexpr uint64_t kOpBytes = 4 << 20;
// After the last sign of activity the thread keeps polling the worker this long before it sleeps: waking up
// through the event fd costs tens of microseconds per round trip.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(200);
// Longest sleep while operations are in flight; a safety net, as events normally wake the thread first.
constexpr int kBusySleepMs = 1;
// While ucp_worker_arm keeps saying BUSY, the thread polls until this long after the last progress, then
// naps kBusySleepMs at a time.
constexpr auto kBusySpin = std::chrono::milliseconds(5);
// Longest sleep when idle; also bounds how late an unexpected lack of wake-up could stall a peer's request.
constexpr int kIdleSleepMs = 100;
// shutdown() waits at most this long for endpoint closes still in progress.
constexpr auto kCloseBudget = std::chrono::seconds(2);
// Before destroying the worker, shutdown() progresses it until it has been quiet this long (see teardown),
// for at most kGraceBudget.
constexpr auto kQuietBeforeDestroy = std::chrono::milliseconds(20);
constexpr auto kGraceBudget = std::chrono::milliseconds(200);

std::string to_hex(const void* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* bytes = static_cast<const uint8_t*>(data);
  std::string hex(size * 2, '0');
  for (size_t i = 0; i < size; ++i) {
    hex[2 * i] = kDigits[bytes[i] >> 4];
    hex[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return hex;
}

std::optional<std::vector<uint8_t>> from_hex(std::string_view hex) {
  if (hex.empty() || hex.size() % 2 != 0) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::vector<uint8_t> bytes(hex.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int high = nibble(hex[2 * i]);
    const int low = nibble(hex[2 * i + 1]);
    if (high < 0 || low < 0) return std::nullopt;
    bytes[i] = static_cast<uint8_t>(high << 4 | low);
  }
  return bytes;
}

// What open() learned about a remote segment; shared by its RemoteSegment and the operations on it.
struct RemoteInfo {
  std::string segment;
  std::string engine;
  std::string host_id;
  std::string peer_key;  // the hex worker address: one endpoint per remote worker
  std::vector<uint8_t> worker_address;
  std::vector<uint8_t> rkey;
  uint64_t base = 0;
  uint64_t segment_id = 0;
  pid_t pid = 0;  // the owner's pid when it is another process on this host, else 0
};

// Why an operation fails, when that is not just UCX's completion status.
struct Failure {
  StatusCode code = StatusCode::kUnavailable;
  std::string reason;
};

class UcxTransport;
struct UcxPeer;

// One UCX operation: one part of a request.
struct Op {
  UcxTransport* owner = nullptr;
  TransferOp op = TransferOp::kRead;
  std::byte* local = nullptr;
  uint64_t offset_bytes = 0;  // in the segment
  uint64_t length_bytes = 0;
  Clock::time_point deadline;
  RequestState* state = nullptr;
  std::shared_ptr<const RemoteInfo> remote;

  // Owned by the progress thread from here on.
  UcxPeer* peer = nullptr;     // set while a UCX request is outstanding
  void* request = nullptr;  // the get, or the flush that follows the put
  ucs_status_t ucx_status = UCS_INPROGRESS;
  std::unique_ptr<std::byte[]> bounce;  // NONE-mode endpoints: UCX reads/writes this copy (see the top)
  std::multimap<Clock::time_point, Op*>::iterator deadline_entry;
  bool has_deadline_entry = false;
  bool counted_busy = false;
  std::optional<Failure> failure;  // overrides UCX's status: deadline, peer gone, shutdown, connect error
  bool retry = false;              // re-post if UCX cancels it (its endpoint was force-closed for another op)
  std::string retry_reason;        // why its endpoint was force-closed under it (for the retry-budget error)
  int reposts = 0;                 // times re-posted after such a close; at most FailureOptions::retry_budget
  bool reported = false;           // part_done was called; UCX may still hold it (NONE mode) until it ends
  bool pinned = false;             // inside ucp_request_cancel: its completion must not free it yet
};

// An endpoint to one remote worker and the rkeys unpacked on it.
struct UcxPeer {
  std::string key;
  uint64_t serial = 0;  // distinguishes successive endpoints to one remote worker
  std::string engine;
  ucp_ep_h ep = nullptr;
  bool peer_mode = false;  // UCP_ERR_HANDLING_MODE_PEER: failures are reported and FORCE close works
  pid_t pid = 0;
  int pidfd = -1;
  std::unordered_map<uint64_t, ucp_rkey_h> rkeys;  // by remote segment id
  std::unordered_set<Op*> in_flight;               // includes reported ones UCX still holds (NONE mode)
  std::list<UcxPeer*>::iterator lru;
};

std::string describe(const Op& op) {
  return fmt::format("{} of {} bytes at offset {} of segment '{}' on engine '{}'",
                     op.op == TransferOp::kRead ? "read" : "write", op.length_bytes, op.offset_bytes,
                     op.remote->segment, op.remote->engine);
}

// The status a finished operation reports. `ucx` is UCX's completion status, or none when the operation
// never reached UCX.
Status outcome(const Op& op, std::optional<ucs_status_t> ucx) {
  const std::string ucx_text =
      ucx ? fmt::format("UCX: {}", ucs_status_string(*ucx)) : std::string("not posted to UCX");
  if (op.failure) {
    return Status(op.failure->code, fmt::format("{}: {} ({})", op.failure->reason, describe(op), ucx_text));
  }
  if (ucx && *ucx == UCS_OK) return Status();
  return Status::unavailable(fmt::format("ucx: {} failed ({})", describe(op), ucx_text));
}

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(const TransportContext& context) : context_(context) {}
  ~UcxTransport() override {
    shutdown();
    // Closed only here, not in teardown: a thread racing with shutdown may still write to it.
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  Status start();

  TransportKind kind() const override { return TransportKind::kUcx; }
  Status expose(const LocalSegment& segment, nlohmann::json& entry) override;
  void withdraw(const LocalSegment& segment) override;
  Result<std::shared_ptr<RemoteSegment>> open(const SegmentDescriptor& descriptor) override;
  void shutdown() override;

  // RemoteSegment::submit: cuts `request` into operations and queues them for the progress thread.
  void submit(const std::shared_ptr<const RemoteInfo>& remote, const TransportRequest& request);

 private:
  struct Task {
    std::string what;
    std::function<Status()> fn;
    std::promise<Status> done;
  };

  // ---- Any thread.
  // Runs `fn` on the progress thread and returns its status; kUnavailable once shutting down, with `what`
  // (the work refused, naming the segment and engine it was for) in the message.
  Status call(std::string what, std::function<Status()> fn);
  void wake();
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void on_request_done(void* request, ucs_status_t status, void* user_data);

  // ---- Progress thread.
  void run();
  bool run_tasks();
  bool post_submitted();
  bool post_retries();
  void post(Op* op);
  Result<UcxPeer*> connect(const RemoteInfo& remote);
  Result<ucp_rkey_h> rkey_for(UcxPeer& peer, const RemoteInfo& remote);
  void touch(UcxPeer& peer);
  void ucx_done(Op* op, ucs_status_t status);
  void finish(Op* op, ucs_status_t status);
  void report(Op* op, std::optional<ucs_status_t> ucx);
  void expire(Clock::time_point now);
  bool handle_ep_errors();
  void peer_failed(UcxPeer* peer, const Failure& failure);
  // Closes `peer`'s endpoint and forgets it (FORCE completes its operations with UCS_ERR_CANCELED first).
  void close_peer(UcxPeer* peer, bool force);
  // Keeps `peer` (and the operations UCX still holds) until the worker is destroyed; forgets it otherwise.
  void bury(UcxPeer* peer);
  std::unique_ptr<UcxPeer> detach(UcxPeer* peer);
  void make_room(size_t limit);
  void reap_closing();
  void poll_fds(int timeout_ms);
  void teardown();
  void release_ucx();

  const TransportContext context_;
  std::string address_hex_;  // this worker's address
  ucp_context_h ucp_context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_fd_ = -1;  // from ucp_worker_get_efd; -1: sleep in short slices instead
  int wake_fd_ = -1;    // eventfd other threads write to wake the progress thread
  std::thread thread_;

  // Shared with other threads.
  std::mutex mu_;
  bool stopping_ = false;
  std::atomic<bool> stop_requested_{false};
  std::deque<std::unique_ptr<Task>> tasks_;
  std::vector<Op*> submitted_;
  std::vector<std::pair<ucp_ep_h, ucs_status_t>> ep_errors_;

  // Progress thread only.
  std::unordered_map<uint64_t, ucp_mem_h> exposed_;  // by local segment id
  std::unordered_map<std::string, std::unique_ptr<UcxPeer>> peers_;
  std::list<UcxPeer*> lru_;  // most recently used first
  std::unordered_map<ucp_ep_h, UcxPeer*> by_ep_;
  std::vector<std::unique_ptr<UcxPeer>> graveyard_;
  std::unordered_set<std::string> hosts_without_peer_mode_;
  struct Cooldown {
    Clock::time_point until;
    // What failed, e.g. "endpoint to engine 'x' failed (Connection reset by remote peer)".
    std::string failure;
  };
  std::unordered_map<std::string, Cooldown> cooling_;  // failed remote workers (by peer key), see the top
  std::multimap<Clock::time_point, Op*> deadlines_;
  std::vector<Op*> retries_;
  std::vector<std::pair<std::string, uint64_t>> broken_peers_;  // PEER-mode endpoints an operation failed on
  uint64_t next_serial_ = 0;
  std::vector<void*> closing_;  // ucp_ep_close_nbx requests in progress
  size_t busy_ops_ = 0;         // posted and not yet reported
};

class UcxRemoteSegment final : public RemoteSegment {
 public:
  UcxRemoteSegment(UcxTransport* transport, std::shared_ptr<const RemoteInfo> remote)
      : transport_(transport), remote_(std::move(remote)) {}

  void submit(const TransportRequest& request) override { transport_->submit(remote_, request); }

 private:
  UcxTransport* transport_;  // outlives every submit (the core shuts transports down only at the end)
  std::shared_ptr<const RemoteInfo> remote_;
};

// ---------------------------------------------------------------------------------------------------------
// Any thread.

Status UcxTransport::start() {
  const std::string& name = context_.engine_name;
  const std::string& tls = context_.options->ucx.tls;
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) {
    return Status::unavailable(
        fmt::format("ucx: engine '{}': ucp_config_read: {}", name, ucs_status_string(status)));
  }
  if (!tls.empty()) status = ucp_config_modify(config, "TLS", tls.c_str());
  if (status != UCS_OK) {
    ucp_config_release(config);
    return Status::unavailable(
        fmt::format("ucx: engine '{}': TLS '{}' rejected: {}", name, tls, ucs_status_string(status)));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  params.name = name.c_str();
  status = ucp_init(&params, config, &ucp_context_);
  ucp_config_release(config);
  if (status != UCS_OK) {
    ucp_context_ = nullptr;
    return Status::unavailable(fmt::format("ucx: engine '{}': ucp_init with TLS '{}': {}", name,
                                           tls.empty() ? "(UCX default)" : tls, ucs_status_string(status)));
  }
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches it
  status = ucp_worker_create(ucp_context_, &worker_params, &worker_);
  if (status != UCS_OK) {
    worker_ = nullptr;
    release_ucx();
    return Status::unavailable(
        fmt::format("ucx: engine '{}': ucp_worker_create: {}", name, ucs_status_string(status)));
  }
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  status = ucp_worker_get_address(worker_, &address, &address_length);
  if (status != UCS_OK) {
    release_ucx();
    return Status::unavailable(
        fmt::format("ucx: engine '{}': ucp_worker_get_address: {}", name, ucs_status_string(status)));
  }
  address_hex_ = to_hex(address, address_length);
  ucp_worker_release_address(worker_, address);
  if (ucp_worker_get_efd(worker_, &worker_fd_) != UCS_OK) worker_fd_ = -1;
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    const int err = errno;
    release_ucx();
    return Status::unavailable(fmt::format("ucx: engine '{}': eventfd: {}", name, std::strerror(err)));
  }
  thread_ = std::thread([this] { run(); });
  return Status();
}

Status UcxTransport::call(std::string what, std::function<Status()> fn) {
  auto task = std::make_unique<Task>();
  task->fn = std::move(fn);
  std::future<Status> done = task->done.get_future();
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      return Status::unavailable(
          fmt::format("ucx: engine '{}' shutting down: cannot {}", context_.engine_name, what));
    }
    task->what = std::move(what);
    tasks_.push_back(std::move(task));
  }
  wake();
  return done.get();
}

void UcxTransport::wake() {
  const uint64_t one = 1;
  // A full counter (EAGAIN) already means "wake up".
  [[maybe_unused]] ssize_t written = ::write(wake_fd_, &one, sizeof(one));
}

void UcxTransport::on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  // May run outside the progress thread's own code paths (UCX decides); only record it.
  auto* self = static_cast<UcxTransport*>(arg);
  {
    std::lock_guard lock(self->mu_);
    self->ep_errors_.emplace_back(ep, status);
  }
  self->wake();
}

void UcxTransport::on_request_done(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  ucp_request_free(request);
  op->request = nullptr;
  op->owner->ucx_done(op, status);
}

Status UcxTransport::expose(const LocalSegment& segment, nlohmann::json& entry) {
  std::string rkey_hex;
  Status mapped = call(fmt::format("expose segment '{}'", segment.name), [&]() -> Status {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = segment.base;
    params.length = segment.length_bytes;
    ucp_mem_h memh = nullptr;
    ucs_status_t status = ucp_mem_map(ucp_context_, &params, &memh);
    if (status != UCS_OK) {
      return Status::unavailable(
          fmt::format("ucx: expose segment '{}' of engine '{}': ucp_mem_map of {} bytes: {}", segment.name,
                      context_.engine_name, segment.length_bytes, ucs_status_string(status)));
    }
    void* packed = nullptr;
    size_t packed_size = 0;
    status = ucp_rkey_pack(ucp_context_, memh, &packed, &packed_size);
    if (status != UCS_OK) {
      ucp_mem_unmap(ucp_context_, memh);
      return Status::unavailable(fmt::format("ucx: expose segment '{}' of engine '{}': ucp_rkey_pack: {}",
                                             segment.name, context_.engine_name, ucs_status_string(status)));
    }
    rkey_hex = to_hex(packed, packed_size);
    ucp_rkey_buffer_release(packed);
    exposed_[segment.id] = memh;
    return Status();
  });
  if (!mapped.ok()) return mapped;
  entry = {{"worker_address", address_hex_},
           {"rkey", rkey_hex},
           {"base", static_cast<uint64_t>(reinterpret_cast<uintptr_t>(segment.base))},
           {"segment_id", segment.id},
           {"pid", ::getpid()}};
  return Status();
}

void UcxTransport::withdraw(const LocalSegment& segment) {
  // After shutdown the call is refused, and teardown has unmapped everything already.
  (void)call(fmt::format("withdraw segment '{}'", segment.name), [&]() -> Status {
    auto it = exposed_.find(segment.id);
    if (it != exposed_.end()) {
      ucp_mem_unmap(ucp_context_, it->second);
      exposed_.erase(it);
    }
    return Status();
  });
}

Result<std::shared_ptr<RemoteSegment>> UcxTransport::open(const SegmentDescriptor& descriptor) {
  auto found = descriptor.transports.find("ucx");
  auto malformed = [&](std::string_view what) {
    return Status::invalid_argument(
        fmt::format("ucx: segment '{}' of engine '{}': malformed ucx entry ({}): {}", descriptor.name,
                    descriptor.engine, what, found == descriptor.transports.end() ? "" : found->dump()));
  };
  if (found == descriptor.transports.end() || !found->is_object()) return malformed("not an object");
  const nlohmann::json& entry = *found;
  auto info = std::make_shared<RemoteInfo>();
  info->segment = descriptor.name;
  info->engine = descriptor.engine;
  info->host_id = descriptor.host_id;
  if (!entry.contains("worker_address") || !entry["worker_address"].is_string())
    return malformed("worker_address");
  if (!entry.contains("rkey") || !entry["rkey"].is_string()) return malformed("rkey");
  if (!entry.contains("base") || !entry["base"].is_number_unsigned()) return malformed("base");
  if (!entry.contains("segment_id") || !entry["segment_id"].is_number_unsigned())
    return malformed("segment_id");
  info->peer_key = entry["worker_address"].get<std::string>();
  std::optional<std::vector<uint8_t>> address = from_hex(info->peer_key);
  std::optional<std::vector<uint8_t>> rkey = from_hex(entry["rkey"].get<std::string>());
  if (!address) return malformed("worker_address is not hex");
  if (!rkey) return malformed("rkey is not hex");
  info->worker_address = std::move(*address);
  info->rkey = std::move(*rkey);
  info->base = entry["base"].get<uint64_t>();
  info->segment_id = entry["segment_id"].get<uint64_t>();
  if (descriptor.host_id == context_.host_id && entry.contains("pid") && entry["pid"].is_number_integer()) {
    const auto pid = entry["pid"].get<pid_t>();
    if (pid > 0 && pid != ::getpid()) info->pid = pid;
  }
  // Create the endpoint and unpack the rkey now, so that open_segment reports an unreachable peer; UCX
  // connects asynchronously, so this does not wait for the peer.
  Status opened =
      call(fmt::format("open segment '{}' of engine '{}'", info->segment, info->engine), [&]() -> Status {
        Result<UcxPeer*> peer = connect(*info);
        if (!peer.ok()) return peer.status();
        return rkey_for(**peer, *info).status();
      });
  if (!opened.ok()) return opened;
  return std::shared_ptr<RemoteSegment>(std::make_shared<UcxRemoteSegment>(this, std::move(info)));
}

void UcxTransport::submit(const std::shared_ptr<const RemoteInfo>& remote, const TransportRequest& request) {
  const uint64_t parts = (request.length_bytes + kOpBytes - 1) / kOpBytes;
  request.state->expect_parts(static_cast<uint32_t>(parts));
  std::vector<Op*> ops;
  ops.reserve(parts);
  for (uint64_t done = 0; done < request.length_bytes; done += kOpBytes) {
    auto* op = new Op;
    op->owner = this;
    op->op = request.op;
    op->local = request.local + done;
    op->offset_bytes = request.offset_bytes + done;
    op->length_bytes = std::min(kOpBytes, request.length_bytes - done);
    op->deadline = request.deadline;
    op->state = request.state;
    op->remote = remote;
    ops.push_back(op);
  }
  bool signal = false;
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      // The thread takes the whole queue at once, so only a push onto an empty queue needs to wake it.
      signal = submitted_.empty();
      submitted_.insert(submitted_.end(), ops.begin(), ops.end());
      ops.clear();
    }
  }
  if (signal) wake();
  for (Op* op : ops) {
    op->failure = Failure{StatusCode::kUnavailable, "engine shutting down"};
    op->state->part_done(outcome(*op, std::nullopt), 0);
    delete op;
  }
}

void UcxTransport::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  stop_requested_.store(true, std::memory_order_release);
  if (thread_.joinable()) {
    wake();
    thread_.join();  // teardown() runs on the thread; every wait in it is bounded
  } else {
    release_ucx();
  }
}

// ---------------------------------------------------------------------------------------------------------
// Progress thread.

void UcxTransport::run() {
  auto last_activity = Clock::now();
  auto last_fd_check = last_activity;
  for (;;) {
    bool worked = run_tasks();
    worked |= post_submitted();
    if (stop_requested_.load(std::memory_order_acquire)) break;
    for (int i = 0; i < 64; ++i) {
      if (ucp_worker_progress(worker_) == 0) break;
      worked = true;
    }
    worked |= handle_ep_errors();
    reap_closing();
    worked |= post_retries();
    auto now = Clock::now();
    expire(now);
    if (peers_.size() > static_cast<size_t>(context_.options->failure.max_endpoints)) {
      make_room(static_cast<size_t>(context_.options->failure.max_endpoints));
    }
    if (worked) last_activity = now;
    if (worked || now - last_activity < kSpinBeforeSleep) {
      // Pidfds are otherwise only looked at while sleeping.
      if (now - last_fd_check >= std::chrono::milliseconds(1)) {
        poll_fds(0);
        last_fd_check = now;
      }
      if (!worked) sched_yield();  // the peer may share this core
      continue;
    }
    // Sleep. ucp_worker_arm says BUSY when UCX holds work the event fd will not signal, typically sends
    // queued for a full shared-memory FIFO (nothing announces free space), or events that arrived since the
    // last progress. Keep polling while that work still moves; nap once it has not for a while (a stopped
    // peer), so that a stuck FIFO does not burn a core.
    if (worker_fd_ >= 0 && ucp_worker_arm(worker_) == UCS_ERR_BUSY) {
      if (now - last_activity < kBusySpin) {
        sched_yield();
        continue;
      }
      poll_fds(kBusySleepMs);
      last_fd_check = Clock::now();
      continue;
    }
    int timeout_ms = busy_ops_ > 0 || !closing_.empty() || worker_fd_ < 0 ? kBusySleepMs : kIdleSleepMs;
    if (!deadlines_.empty()) {
      const auto until =
          std::chrono::ceil<std::chrono::milliseconds>(deadlines_.begin()->first - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(until, 0, timeout_ms));
    }
    poll_fds(timeout_ms);
    last_fd_check = Clock::now();
  }
  teardown();
}

bool UcxTransport::run_tasks() {
  std::deque<std::unique_ptr<Task>> tasks;
  {
    std::lock_guard lock(mu_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) task->done.set_value(task->fn());
  return !tasks.empty();
}

bool UcxTransport::post_submitted() {
  std::vector<Op*> ops;
  {
    std::lock_guard lock(mu_);
    ops.swap(submitted_);
  }
  for (Op* op : ops) post(op);
  return !ops.empty();
}

bool UcxTransport::post_retries() {
  if (retries_.empty()) return false;
  std::vector<Op*> ops;
  ops.swap(retries_);
  for (Op* op : ops) {
    context_.counters->slices_retried.fetch_add(1, std::memory_order_relaxed);
    post(op);
  }
  return true;
}

void UcxTransport::post(Op* op) {
  if (Clock::now() >= op->deadline) {
    op->failure = Failure{StatusCode::kDeadlineExceeded,
                          fmt::format("ucx: request timed out after {} ms before it was posted",
                                      context_.options->failure.request_timeout.count())};
    report(op, std::nullopt);
    delete op;
    return;
  }
  Result<UcxPeer*> connected = connect(*op->remote);
  Result<ucp_rkey_h> rkey = connected.ok() ? rkey_for(**connected, *op->remote) : connected.status();
  if (!rkey.ok()) {
    op->failure = Failure{rkey.status().code(), rkey.status().message()};
    report(op, std::nullopt);
    delete op;
    return;
  }
  UcxPeer& peer = **connected;
  void* buffer = op->local;
  if (!peer.peer_mode) {
    if (!op->bounce) {
      op->bounce.reset(new std::byte[op->length_bytes]);
      if (op->op == TransferOp::kWrite) std::memcpy(op->bounce.get(), op->local, op->length_bytes);
    }
    buffer = op->bounce.get();
  }
  const uint64_t remote_address = op->remote->base + op->offset_bytes;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxTransport::on_request_done;
  param.user_data = op;
  ucs_status_ptr_t request;
  if (op->op == TransferOp::kRead) {
    request = ucp_get_nbx(peer.ep, buffer, op->length_bytes, remote_address, *rkey, &param);
  } else {
    // A put completes once its source buffer may be reused; a finished write must mean the bytes are in the
    // target's memory, which the flush that follows it says (remote completion). The put's own request is
    // released at once: errors surface through the flush, and a forced close cancels both.
    ucp_request_param_t put_param{};
    ucs_status_ptr_t put = ucp_put_nbx(peer.ep, buffer, op->length_bytes, remote_address, *rkey, &put_param);
    if (UCS_PTR_IS_ERR(put)) {
      request = put;
    } else {
      if (put != nullptr) ucp_request_free(put);
      request = ucp_ep_flush_nbx(peer.ep, &param);
    }
  }
  touch(peer);
  if (UCS_PTR_IS_ERR(request) && peer.peer_mode) broken_peers_.emplace_back(peer.key, peer.serial);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) {
    finish(op, UCS_PTR_STATUS(request));
    return;
  }
  op->request = request;
  op->peer = &peer;
  peer.in_flight.insert(op);
  op->deadline_entry = deadlines_.emplace(op->deadline, op);
  op->has_deadline_entry = true;
  op->counted_busy = true;
  ++busy_ops_;
}

Result<UcxPeer*> UcxTransport::connect(const RemoteInfo& remote) {
  auto found = peers_.find(remote.peer_key);
  if (found != peers_.end()) {
    touch(*found->second);
    return found->second.get();
  }
  if (auto cooling = cooling_.find(remote.peer_key); cooling != cooling_.end()) {
    const auto now = Clock::now();
    if (now < cooling->second.until) {
      return Status::unavailable(fmt::format(
          "ucx: engine '{}' (segment '{}') is cooling down after {} ({} ms of the {} ms path_cooldown left)",
          remote.engine, remote.segment, cooling->second.failure,
          std::chrono::ceil<std::chrono::milliseconds>(cooling->second.until - now).count(),
          context_.options->failure.path_cooldown.count()));
    }
    cooling_.erase(cooling);
  }
  int pidfd = -1;
  if (remote.pid > 0) {
    pidfd = static_cast<int>(::syscall(SYS_pidfd_open, remote.pid, 0));
    if (pidfd < 0 && errno == ESRCH) {
      return Status::unavailable(fmt::format("ucx: engine '{}' (pid {}) owning segment '{}' has exited",
                                             remote.engine, remote.pid, remote.segment));
    }
    // Without a pidfd (old kernel) failures are still seen through UCX and the deadlines.
  }
  const auto max_endpoints = static_cast<size_t>(context_.options->failure.max_endpoints);
  if (peers_.size() >= max_endpoints) make_room(max_endpoints - 1);

  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(remote.worker_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxTransport::on_ep_error;
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  bool peer_mode = !hosts_without_peer_mode_.contains(remote.host_id);
  ucs_status_t status = UCS_ERR_UNREACHABLE;
  if (peer_mode) status = ucp_ep_create(worker_, &params, &ep);
  if (status == UCS_ERR_UNREACHABLE) {
    // The transports that reach this peer cannot detect peer failure (posix and sysv in UCX 1.13); without
    // error handling they are usable, with deadlines, pidfds and bounce buffers covering failures.
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    status = ucp_ep_create(worker_, &params, &ep);
    if (status == UCS_OK && peer_mode) hosts_without_peer_mode_.insert(remote.host_id);
    peer_mode = false;
  }
  if (status != UCS_OK) {
    if (pidfd >= 0) ::close(pidfd);
    return Status::unavailable(
        fmt::format("ucx: cannot reach engine '{}' for segment '{}': ucp_ep_create: {}", remote.engine,
                    remote.segment, ucs_status_string(status)));
  }
  auto peer = std::make_unique<UcxPeer>();
  peer->key = remote.peer_key;
  peer->serial = ++next_serial_;
  peer->engine = remote.engine;
  peer->ep = ep;
  peer->peer_mode = peer_mode;
  peer->pid = remote.pid;
  peer->pidfd = pidfd;
  lru_.push_front(peer.get());
  peer->lru = lru_.begin();
  by_ep_[ep] = peer.get();
  UcxPeer* raw = peer.get();
  peers_.emplace(remote.peer_key, std::move(peer));
  return raw;
}

Result<ucp_rkey_h> UcxTransport::rkey_for(UcxPeer& peer, const RemoteInfo& remote) {
  auto found = peer.rkeys.find(remote.segment_id);
  if (found != peer.rkeys.end()) return found->second;
  ucp_rkey_h rkey = nullptr;
  const ucs_status_t status = ucp_ep_rkey_unpack(peer.ep, remote.rkey.data(), &rkey);
  if (status != UCS_OK) {
    return Status::unavailable(
        fmt::format("ucx: cannot unpack the remote key of segment '{}' on engine '{}': {}", remote.segment,
                    remote.engine, ucs_status_string(status)));
  }
  peer.rkeys.emplace(remote.segment_id, rkey);
  return rkey;
}

void UcxTransport::touch(UcxPeer& peer) {
  if (peer.lru != lru_.begin()) lru_.splice(lru_.begin(), lru_, peer.lru);
}

void UcxTransport::ucx_done(Op* op, ucs_status_t status) {
  if (op->peer != nullptr) {
    // Software RMA has no per-operation errors: a failure other than our own cancel means the endpoint broke,
    // whether or not its error callback reached us.
    if (status != UCS_OK && status != UCS_ERR_CANCELED && op->peer->peer_mode) {
      broken_peers_.emplace_back(op->peer->key, op->peer->serial);
    }
    op->peer->in_flight.erase(op);
    op->peer = nullptr;
  }
  if (op->has_deadline_entry) {
    deadlines_.erase(op->deadline_entry);
    op->has_deadline_entry = false;
  }
  op->ucx_status = status;
  if (!op->pinned) finish(op, status);
}

void UcxTransport::finish(Op* op, ucs_status_t status) {
  if (op->reported) {  // failed earlier; UCX is done with its bounce buffer only now
    delete op;
    return;
  }
  if (op->retry && status != UCS_OK && !op->failure) {
    op->retry = false;
    if (op->reposts >= context_.options->failure.retry_budget) {
      op->failure = Failure{StatusCode::kUnavailable,
                            fmt::format("ucx: retry budget of {} re-posts exhausted: {}",
                                        context_.options->failure.retry_budget, op->retry_reason)};
    } else {
      ++op->reposts;
      if (op->counted_busy) {
        op->counted_busy = false;
        --busy_ops_;
      }
      retries_.push_back(op);
      return;
    }
  }
  if (status == UCS_OK && !op->failure && op->op == TransferOp::kRead && op->bounce) {
    std::memcpy(op->local, op->bounce.get(), op->length_bytes);
  }
  report(op, status);
  delete op;
}

void UcxTransport::report(Op* op, std::optional<ucs_status_t> ucx) {
  if (op->counted_busy) {
    op->counted_busy = false;
    --busy_ops_;
  }
  op->reported = true;
  const Status status = outcome(*op, ucx);
  const bool ok = status.ok();
  op->state->part_done(status, ok ? op->length_bytes : 0);  // the request may be gone after this
}

void UcxTransport::expire(Clock::time_point now) {
  if (deadlines_.empty() || deadlines_.begin()->first > now) return;
  std::vector<Op*> expired;
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    Op* op = deadlines_.begin()->second;
    deadlines_.erase(deadlines_.begin());
    op->has_deadline_entry = false;
    expired.push_back(op);
  }
  const Failure timed_out{
      StatusCode::kDeadlineExceeded,
      fmt::format("ucx: request timed out after {} ms", context_.options->failure.request_timeout.count())};
  std::vector<UcxPeer*> to_close;
  for (Op* op : expired) {
    op->failure = timed_out;
    op->pinned = true;
    ucp_request_cancel(worker_, op->request);  // a no-op for RMA in UCX 1.13 (see the top); cheap to try
    op->pinned = false;
    if (op->request == nullptr) {
      finish(op, op->ucx_status);
    } else if (op->peer->peer_mode) {
      if (std::find(to_close.begin(), to_close.end(), op->peer) == to_close.end())
        to_close.push_back(op->peer);
    } else {
      report(op, UCS_INPROGRESS);  // UCX keeps its bounce buffer until the peer answers or the worker goes
    }
  }
  for (UcxPeer* peer : to_close) {
    const std::string reason = fmt::format(
        "endpoint to engine '{}' force-closed because another operation on it timed out after {} ms",
        peer->engine, context_.options->failure.request_timeout.count());
    for (Op* other : peer->in_flight) {
      if (!other->failure) {
        other->retry = true;
        other->retry_reason = reason;
      }
    }
    close_peer(peer, /*force=*/true);
  }
}

bool UcxTransport::handle_ep_errors() {
  std::vector<std::pair<ucp_ep_h, ucs_status_t>> errors;
  {
    std::lock_guard lock(mu_);
    errors.swap(ep_errors_);
  }
  for (const auto& [ep, status] : errors) {
    auto found = by_ep_.find(ep);
    if (found == by_ep_.end()) continue;  // already closed
    UcxPeer* peer = found->second;
    peer_failed(peer,
                Failure{StatusCode::kUnavailable, fmt::format("ucx: endpoint to engine '{}' failed ({})",
                                                              peer->engine, ucs_status_string(status))});
  }
  std::vector<std::pair<std::string, uint64_t>> broken;
  broken.swap(broken_peers_);
  for (const auto& [key, serial] : broken) {
    auto found = peers_.find(key);
    if (found == peers_.end() || found->second->serial != serial) continue;  // already closed
    peer_failed(found->second.get(), Failure{StatusCode::kUnavailable,
                                             fmt::format("ucx: endpoint to engine '{}' failed an operation",
                                                         found->second->engine)});
  }
  return !errors.empty() || !broken.empty();
}

void UcxTransport::peer_failed(UcxPeer* peer, const Failure& failure) {
  const auto cooldown = context_.options->failure.path_cooldown;
  if (cooldown.count() > 0) {
    const auto now = Clock::now();
    std::erase_if(cooling_, [&](const auto& entry) { return entry.second.until <= now; });  // stays small
    std::string_view what = failure.reason;
    if (what.starts_with("ucx: ")) what.remove_prefix(5);
    cooling_[peer->key] = Cooldown{now + cooldown, std::string(what)};
  }
  for (Op* op : peer->in_flight) {
    if (!op->failure) op->failure = failure;
  }
  if (peer->peer_mode) {
    close_peer(peer, /*force=*/true);
    return;
  }
  // NONE mode: the operations cannot be taken back from UCX; fail them now (they work on bounce buffers)
  // and keep the endpoint until the worker is destroyed.
  std::vector<Op*> ops(peer->in_flight.begin(), peer->in_flight.end());
  for (Op* op : ops) {
    if (op->has_deadline_entry) {
      deadlines_.erase(op->deadline_entry);
      op->has_deadline_entry = false;
    }
    if (!op->reported) report(op, UCS_INPROGRESS);
  }
  bury(peer);
}

std::unique_ptr<UcxPeer> UcxTransport::detach(UcxPeer* peer) {
  auto found = peers_.find(peer->key);
  std::unique_ptr<UcxPeer> owned = std::move(found->second);
  peers_.erase(found);
  lru_.erase(peer->lru);
  by_ep_.erase(peer->ep);
  if (peer->pidfd >= 0) {
    ::close(peer->pidfd);
    peer->pidfd = -1;
  }
  return owned;
}

void UcxTransport::close_peer(UcxPeer* peer, bool force) {
  std::unique_ptr<UcxPeer> owned = detach(peer);
  // rkeys go after the endpoint's operations and before the endpoint: a graceful close is only used on
  // idle endpoints, and a forced one completes every operation before it returns.
  if (!force) {
    for (auto& [id, rkey] : peer->rkeys) ucp_rkey_destroy(rkey);
    peer->rkeys.clear();
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  const ucs_status_ptr_t closing = ucp_ep_close_nbx(peer->ep, &param);
  if (UCS_PTR_IS_PTR(closing)) closing_.push_back(closing);
  for (auto& [id, rkey] : peer->rkeys) ucp_rkey_destroy(rkey);
  peer->rkeys.clear();
  {
    // An error reported for this endpoint before the close must not hit a new endpoint at the same address.
    std::lock_guard lock(mu_);
    std::erase_if(ep_errors_, [&](const auto& error) { return error.first == peer->ep; });
  }
  if (!peer->in_flight.empty()) {
    // Not expected (a forced close completes everything, see the top). UCX still holds these operations
    // and, in PEER mode, works on the caller's memory (no bounce buffer): reporting them now would let the
    // caller free that memory under UCX. They are reported when UCX completes them (on_request_done ->
    // finish), at the latest when ucp_worker_destroy cancels them at shutdown; a bounce buffer cannot be
    // swapped in after posting. Their deadlines are dropped: nothing further can be done to them (the
    // endpoint is gone), and expire() must not look at a buried endpoint. NONE-mode operations (bounce
    // buffer) that failed earlier are already reported; they are only freed on completion too.
    for (Op* op : peer->in_flight) {
      if (op->has_deadline_entry) {
        deadlines_.erase(op->deadline_entry);
        op->has_deadline_entry = false;
      }
      if (!op->reported && !op->peer->peer_mode) report(op, UCS_INPROGRESS);
    }
    graveyard_.push_back(std::move(owned));
  }
}

void UcxTransport::bury(UcxPeer* peer) {
  graveyard_.push_back(detach(peer));
}

void UcxTransport::make_room(size_t limit) {
  if (peers_.size() <= limit) return;
  const size_t excess = peers_.size() - limit;
  std::vector<UcxPeer*> idle;
  for (auto it = lru_.rbegin(); it != lru_.rend() && idle.size() < excess; ++it) {
    if ((*it)->in_flight.empty()) idle.push_back(*it);
  }
  // Endpoints with requests in flight are never closed here: the cap is exceeded until they go idle.
  for (UcxPeer* peer : idle) {
    close_peer(peer, /*force=*/false);
    context_.counters->endpoints_evicted.fetch_add(1, std::memory_order_relaxed);
  }
}

void UcxTransport::reap_closing() {
  std::erase_if(closing_, [](void* request) {
    if (ucp_request_check_status(request) == UCS_INPROGRESS) return false;
    ucp_request_free(request);
    return true;
  });
}

void UcxTransport::poll_fds(int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<UcxPeer*> watched;
  fds.push_back(pollfd{.fd = wake_fd_, .events = POLLIN, .revents = 0});
  if (worker_fd_ >= 0) fds.push_back(pollfd{.fd = worker_fd_, .events = POLLIN, .revents = 0});
  const size_t first_pidfd = fds.size();
  for (UcxPeer* peer : lru_) {
    if (peer->pidfd < 0) continue;
    fds.push_back(pollfd{.fd = peer->pidfd, .events = POLLIN, .revents = 0});
    watched.push_back(peer);
  }
  if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
  if (fds[0].revents != 0) {
    uint64_t count = 0;
    [[maybe_unused]] ssize_t read = ::read(wake_fd_, &count, sizeof(count));
  }
  std::vector<std::string> exited;
  for (size_t i = first_pidfd; i < fds.size(); ++i) {
    if (fds[i].revents != 0) exited.push_back(watched[i - first_pidfd]->key);
  }
  for (const std::string& key : exited) {
    auto found = peers_.find(key);
    if (found == peers_.end()) continue;
    UcxPeer* peer = found->second.get();
    peer_failed(peer, Failure{StatusCode::kUnavailable,
                              fmt::format("ucx: engine '{}' (pid {}) exited", peer->engine, peer->pid)});
  }
}

void UcxTransport::teardown() {
  std::deque<std::unique_ptr<Task>> tasks;
  std::vector<Op*> queued;
  {
    std::lock_guard lock(mu_);
    tasks.swap(tasks_);
    queued.swap(submitted_);
  }
  for (auto& task : tasks) {
    task->done.set_value(Status::unavailable(
        fmt::format("ucx: engine '{}' shutting down: cannot {}", context_.engine_name, task->what)));
  }
  const Failure shutting_down{StatusCode::kUnavailable, "engine shutting down"};
  queued.insert(queued.end(), retries_.begin(), retries_.end());
  retries_.clear();
  for (Op* op : queued) {
    op->failure = shutting_down;
    report(op, std::nullopt);
    delete op;
  }
  // PEER-mode endpoints: a forced close completes their operations (UCS_ERR_CANCELED). NONE-mode ones are
  // left to ucp_worker_destroy, which cancels their operations as well.
  std::vector<UcxPeer*> peers(lru_.begin(), lru_.end());
  for (UcxPeer* peer : peers) {
    for (Op* op : peer->in_flight) {
      op->retry = false;
      if (!op->failure) op->failure = shutting_down;
    }
    if (peer->peer_mode) {
      close_peer(peer, /*force=*/true);
    } else {
      bury(peer);
    }
  }
  const auto give_up = Clock::now() + kCloseBudget;
  while (!closing_.empty() && Clock::now() < give_up) {
    ucp_worker_progress(worker_);
    reap_closing();
  }
  for (void* request : closing_) ucp_request_free(request);  // released by UCX when (if) it completes
  closing_.clear();
  // Let connection set-up still running settle before the worker goes. UCX 1.13.1 aborts in
  // ucp_worker_destroy (assertion in ucp_request_send_state_ff: "got REP message") when a wireup reply is
  // still queued on a tcp endpoint, which happens when an engine is destroyed right after open_segment.
  const auto grace_start = Clock::now();
  for (auto now = grace_start, last = grace_start;
       now - last < kQuietBeforeDestroy && now - grace_start < kGraceBudget; now = Clock::now()) {
    if (ucp_worker_progress(worker_) != 0) {
      last = now;
    } else {
      sched_yield();
    }
  }
  for (auto& [id, memh] : exposed_) ucp_mem_unmap(ucp_context_, memh);
  exposed_.clear();
  for (auto& peer : graveyard_) {
    // rkeys live in the worker's memory pool: they must go before it.
    for (auto& [id, rkey] : peer->rkeys) ucp_rkey_destroy(rkey);
    peer->rkeys.clear();
    for (Op* op : peer->in_flight) {
      op->retry = false;
      if (!op->failure) op->failure = shutting_down;
    }
  }
  release_ucx();  // completes what UCX still holds (UCS_ERR_CANCELED) through on_request_done
  for (auto& peer : graveyard_) {
    std::vector<Op*> left(peer->in_flight.begin(), peer->in_flight.end());
    for (Op* op : left) {
      if (!op->reported) report(op, std::nullopt);
      delete op;
    }
  }
  graveyard_.clear();
  for (Op* op : retries_) {  // cancelled by the forced closes above while flagged for a retry: none expected
    op->failure = shutting_down;
    report(op, std::nullopt);
    delete op;
  }
  retries_.clear();
}

void UcxTransport::release_ucx() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  worker_ = nullptr;
  if (ucp_context_ != nullptr) ucp_cleanup(ucp_context_);
  ucp_context_ = nullptr;
  worker_fd_ = -1;
}

}  // namespace

Result<std::unique_ptr<Transport>> make_ucx_transport(const TransportContext& context) {
  auto transport = std::make_unique<UcxTransport>(context);
  CRESCENT_RETURN_IF_ERROR(transport->start());
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace crescent::transfer::internal
