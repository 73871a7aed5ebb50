// TCP transport (paper §3.2.3): persistent connections ("lanes") to each peer engine, requests cut into
// slices that the lanes of that peer pull from one shared queue, bytes moved straight between registered
// memory and the socket (sendmsg of header + payload, recv into the destination), failures retried on
// other lanes.
//
// Threads. Initiator side: `lanes_per_peer` lane threads per peer (peer = remote engine, keyed by
// host:port), started on the first request to that peer; each owns one connection, opened lazily by the
// lane itself (so neither open() nor submit() touches the network), and carries one slice at a time.
// Target side: one listener thread, and one thread per accepted connection serving its requests in order.
// Every blocking call waits in poll() with a timeout and also on a shutdown eventfd, so a hung peer is
// noticed at the request's deadline and shutdown() never waits on the network.
//
// Wire format (all integers little-endian).
//   request  (40 bytes): u32 magic "CRTP" | u16 version | u16 op (1 read, 2 write) | u64 tag |
//                        u64 segment id | u64 offset | u64 length      [write: + length payload bytes]
//   response (24 bytes): u32 magic | u16 version | u16 status (0 ok, else a StatusCode) | u64 tag |
//                        u32 error length | u32 zero   [+ error text] [read, ok: + length payload bytes]
// A request the target cannot parse (magic, version, op, length above 64 MiB) closes that connection; a
// well-formed request for bytes the target does not serve (unknown segment id, range outside it, zero
// length) gets an error response, a written payload is drained, and the connection stays usable.
//
// Failures. A lane whose connection fails mid-slice (error, EOF, garbage response) closes it, is not used
// again for failure.path_cooldown, and puts the slice back at the head of the queue for another lane (at
// most failure.retry_budget times per slice). A stall longer than the request's remaining time fails the
// slice at its deadline. When a connect fails and no lane of the peer is connected, the peer is down: its
// queued requests fail at once and new ones fail on submit until the cool-down ends.
//
// Endpoints. At most failure.max_endpoints peers keep connections open. A peer connecting beyond that
// closes the connections of the least recently used idle peer (nothing queued or in flight); when no peer
// is idle the cap is exceeded rather than stalling a transfer.
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/member_handshake.h"
#include "common/socket_io.h"
#include "transfer/transport.h"

namespace crescent::transfer::internal {
namespace {

using net::describe;
using net::endpoint_key;
using net::get_le;
using net::Io;
using net::kNoDeadline;
using net::put_le;
using net::recv_all;
using net::recv_frame_start;
using net::send_all;
using net::send_bytes;
using net::wait_fd;

constexpr uint32_t kMagic = 0x50545243;  // bytes "CRTP" on the wire
constexpr uint16_t kVersion = 1;
constexpr uint16_t kOpRead = 1;
constexpr uint16_t kOpWrite = 2;
constexpr size_t kRequestHeaderBytes = 40;
constexpr size_t kResponseHeaderBytes = 24;
// Largest payload of one frame: the largest slice_bytes the engine accepts. Bounds what a garbage length
// can make the target drain.
constexpr uint64_t kMaxFrameBytes = 64ull << 20;
constexpr uint32_t kMaxErrorBytes = 4096;
constexpr size_t kDrainBytes = 64 << 10;
// Socket buffers: big enough that one 1 MiB slice fits the pipe, so a sender's sendmsg seldom waits.
constexpr int kSocketBufferBytes = 4 << 20;

struct RequestHeader {
  uint16_t op = 0;
  uint64_t tag = 0;
  uint64_t segment_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;

  void encode(std::byte* out) const {
    put_le<uint32_t>(out, kMagic);
    put_le<uint16_t>(out + 4, kVersion);
    put_le<uint16_t>(out + 6, op);
    put_le<uint64_t>(out + 8, tag);
    put_le<uint64_t>(out + 16, segment_id);
    put_le<uint64_t>(out + 24, offset);
    put_le<uint64_t>(out + 32, length);
  }
  // False when the frame is not one of ours (magic, version, op, length): the stream cannot be trusted.
  bool decode(const std::byte* in) {
    if (get_le<uint32_t>(in) != kMagic || get_le<uint16_t>(in + 4) != kVersion) return false;
    op = get_le<uint16_t>(in + 6);
    tag = get_le<uint64_t>(in + 8);
    segment_id = get_le<uint64_t>(in + 16);
    offset = get_le<uint64_t>(in + 24);
    length = get_le<uint64_t>(in + 32);
    return (op == kOpRead || op == kOpWrite) && length <= kMaxFrameBytes;
  }
};

struct ResponseHeader {
  uint16_t status = 0;
  uint64_t tag = 0;
  uint32_t error_length = 0;

  void encode(std::byte* out) const {
    put_le<uint32_t>(out, kMagic);
    put_le<uint16_t>(out + 4, kVersion);
    put_le<uint16_t>(out + 6, status);
    put_le<uint64_t>(out + 8, tag);
    put_le<uint32_t>(out + 16, error_length);
    put_le<uint32_t>(out + 20, 0);
  }
  bool decode(const std::byte* in) {
    if (get_le<uint32_t>(in) != kMagic || get_le<uint16_t>(in + 4) != kVersion) return false;
    status = get_le<uint16_t>(in + 6);
    tag = get_le<uint64_t>(in + 8);
    error_length = get_le<uint32_t>(in + 16);
    return error_length <= kMaxErrorBytes;
  }
};

// ---- Socket I/O with deadlines ----------------------------------------------------------------------

// Segment memory belongs to the application and its peers: the order of remote accesses to it is theirs to
// arrange, not the transport's (a retried write slice may even land twice, with the same bytes, while the
// broken connection's server thread still copies what its socket had buffered). ThreadSanitizer is not
// told about the server's payload I/O on it; it would also miss that a message through a socket orders the
// accesses of its sender and its receiver.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
struct UntrackedSegmentAccess {
  UntrackedSegmentAccess() { __tsan_ignore_thread_begin(); }
  ~UntrackedSegmentAccess() { __tsan_ignore_thread_end(); }
};
#else
struct UntrackedSegmentAccess {
  UntrackedSegmentAccess() {}  // user-provided: a guard variable, not an unused one
};
#endif

void configure_socket(int fd) {
  net::set_nodelay(fd);  // headers must not wait for Nagle
  const int buffer = kSocketBufferBytes;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
}

// ---- Initiator side ---------------------------------------------------------------------------------

class TcpTransport;

// One slice of a request: the unit a lane sends.
struct Slice {
  TransferOp op = TransferOp::kRead;
  std::byte* local = nullptr;
  uint64_t segment_id = 0;
  const std::string* segment_name = nullptr;  // owned by the TcpRemoteSegment, which outlives its requests
  uint64_t offset = 0;                        // in the remote segment
  uint64_t length = 0;
  Clock::time_point deadline;
  RequestState* state = nullptr;
  int retries = 0;
};

// A submitted request not yet fully handed to lanes: slices are cut off its front as lanes take them, so a
// 64 MiB request costs one queue entry, not 64.
struct PendingRequest {
  Slice whole;
  uint64_t next = 0;  // bytes already handed out
};

// How one slice's transfer ended.
struct Outcome {
  enum Code { kOk, kRefused, kLaneFailed, kStopped };
  Code code = kOk;
  Io::Code io = Io::kOk;  // for kLaneFailed
  Status refusal;         // for kRefused: the target's status
  std::string what;       // for kLaneFailed

  static Outcome lane_failed(Io::Code io, std::string what) {
    Outcome o;
    o.code = kLaneFailed;
    o.io = io;
    o.what = std::move(what);
    return o;
  }
  static Outcome refused(Status status) {
    Outcome o;
    o.code = kRefused;
    o.refusal = std::move(status);
    return o;
  }
  static Outcome stopped() {
    Outcome o;
    o.code = kStopped;
    return o;
  }
};

class Peer {
 public:
  Peer(TcpTransport* transport, std::string key, std::string name, net::SocketAddress address, int lanes,
       uint64_t slice_bytes)
      : transport_(transport),
        key_(std::move(key)),
        name_(std::move(name)),
        address_(address),
        slice_bytes_(slice_bytes),
        lanes_(static_cast<size_t>(lanes)) {}

  ~Peer() { stop(); }

  void enqueue(const TransportRequest& request, uint64_t segment_id, const std::string* segment_name);
  Status break_lane(int lane);
  // Stops the lane threads and fails what is queued. Idempotent.
  void stop();

  // Endpoint bookkeeping, guarded by TcpTransport::endpoints_mu_.
  bool is_endpoint = false;
  int open_connections = 0;
  // Bumped when the peer is evicted; a lane whose connection was admitted under an older epoch closes it.
  // Written under endpoints_mu_ and mu_.
  std::atomic<uint64_t> endpoint_epoch{0};
  std::atomic<int64_t> last_used_ns{0};

  // True when nothing is queued or in flight; then evicts (bumps the epoch so lanes close). Called by
  // TcpTransport with endpoints_mu_ held.
  bool evict_if_idle();

 private:
  struct Lane {
    int fd = -1;  // written under mu_ by the lane's thread (break_lane reads it under mu_)
    uint64_t epoch = 0;
    Clock::time_point cooldown_until{};
    std::thread thread;
  };

  void run_lane(int index);
  bool has_work_locked() const { return !retry_.empty() || !pending_.empty(); }
  Clock::time_point earliest_deadline_locked() const;
  Slice take_slice_locked();
  // Removes queued slices whose deadline passed into `out`; true when there were any.
  bool take_expired_locked(Clock::time_point now, std::vector<std::pair<Slice, uint32_t>>& out);
  // Removes every queued slice into `out` (slice, parts it stands for).
  void take_all_locked(std::vector<std::pair<Slice, uint32_t>>& out);
  void connect_lane(std::unique_lock<std::mutex>& lock, int index);
  void close_lane(std::unique_lock<std::mutex>& lock, int index);
  Outcome transfer(int fd, const Slice& slice);
  void notify_locked() {
    if (waiting_ > 0) cv_.notify_all();
  }
  std::string prefix() const { return fmt::format("tcp: peer {} {}", name_, key_); }
  std::string slice_text(const Slice& s) const {
    return fmt::format("{} of segment '{}' [{}, +{})", s.op == TransferOp::kRead ? "read" : "write",
                       *s.segment_name, s.offset, s.length);
  }

  TcpTransport* const transport_;  // valid while lane threads run (they are joined by its shutdown)
  const std::string key_;
  const std::string name_;
  const net::SocketAddress address_;
  const uint64_t slice_bytes_;
  std::atomic<uint64_t> next_tag_{1};

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Lane> lanes_;
  bool started_ = false;
  bool stopping_ = false;
  int waiting_ = 0;          // lane threads blocked on cv_
  std::deque<Slice> retry_;  // slices of failed lanes, served first
  std::deque<PendingRequest> pending_;
  int in_flight_ = 0;
  int connected_lanes_ = 0;
  Clock::time_point down_until_{};  // a failed connect with no lane connected: fail fast until then
  std::string down_error_;
  std::string last_error_;  // most recent lane failure, for timeout messages
};

class TcpRemoteSegment final : public RemoteSegment {
 public:
  TcpRemoteSegment(std::shared_ptr<Peer> peer, uint64_t segment_id, std::string segment_name)
      : peer_(std::move(peer)), segment_id_(segment_id), segment_name_(std::move(segment_name)) {}

  void submit(const TransportRequest& request) override {
    peer_->enqueue(request, segment_id_, &segment_name_);
  }
  Status break_lane_for_testing(int lane) override { return peer_->break_lane(lane); }

 private:
  std::shared_ptr<Peer> peer_;
  const uint64_t segment_id_;
  const std::string segment_name_;
};

// ---- The transport -----------------------------------------------------------------------------------

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TransportContext& context)
      : context_(context), options_(*context.options), failure_(context.options->failure) {
    if (options_.secret) member_key_ = options_.secret->derive("transfer-tcp");
  }
  ~TcpTransport() override { shutdown(); }

  Status start();

  TransportKind kind() const override { return TransportKind::kTcp; }

  Status expose(const LocalSegment& segment, nlohmann::json& entry) override {
    entry = {{"host", options_.tcp.listen_host}, {"port", port_}, {"segment_id", segment.id}};
    return Status();
  }

  // Nothing to do: the servers check every access against the segment table, which the core updates.
  void withdraw(const LocalSegment&) override {}

  Result<std::shared_ptr<RemoteSegment>> open(const SegmentDescriptor& descriptor) override;
  void shutdown() override;

  // For the lanes.
  int stop_fd() const { return stop_fd_; }
  // The key peers prove on connecting (nullopt: no handshake).
  const std::optional<net::MemberKey>& member_key() const { return member_key_; }
  const FailureOptions& failure() const { return failure_; }
  Counters& counters() { return *context_.counters; }
  // Counts a connection of `peer` against max_endpoints, evicting an idle peer when `peer` is a new
  // endpoint beyond the cap. Returns the epoch to tag the connection with.
  uint64_t admit(Peer* peer);
  // Uncounts a connection admitted under `epoch` (no-op when the peer was evicted since).
  void release(Peer* peer, uint64_t epoch);

 private:
  void serve(int fd);
  Status refuse(int fd, uint64_t tag, const Status& why, Clock::time_point deadline);

  const TransportContext context_;
  const EngineOptions& options_;
  const FailureOptions failure_;
  std::optional<net::MemberKey> member_key_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd: readable once shutdown starts
  int port_ = 0;
  net::ConnectionServer server_;  // accepts peers' connections, a thread each
  std::atomic<bool> stopped_{false};

  std::mutex peers_mu_;
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;

  std::mutex endpoints_mu_;  // order: endpoints_mu_ before any Peer::mu_
  std::vector<Peer*> endpoints_;
};

// ---- Peer --------------------------------------------------------------------------------------------

void Peer::enqueue(const TransportRequest& request, uint64_t segment_id, const std::string* segment_name) {
  const uint64_t parts64 = (request.length_bytes + slice_bytes_ - 1) / slice_bytes_;
  const auto parts = static_cast<uint32_t>(parts64);
  request.state->expect_parts(parts);
  Slice whole{.op = request.op,
              .local = request.local,
              .segment_id = segment_id,
              .segment_name = segment_name,
              .offset = request.offset_bytes,
              .length = request.length_bytes,
              .deadline = request.deadline,
              .state = request.state,
              .retries = 0};
  Status refused;
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      refused = Status::unavailable(fmt::format("{}: {}: engine shutting down", prefix(), slice_text(whole)));
    } else if (Clock::now() < down_until_) {
      refused = Status::unavailable(fmt::format("{}: {}: peer unreachable ({}) after 0 retries", prefix(),
                                                slice_text(whole), down_error_));
    } else {
      pending_.push_back({.whole = whole, .next = 0});
      if (!started_) {
        started_ = true;
        for (size_t i = 0; i < lanes_.size(); ++i) {
          lanes_[i].thread = std::thread([this, i] { run_lane(static_cast<int>(i)); });
        }
      }
      notify_locked();
      return;
    }
  }
  for (uint32_t i = 0; i < parts; ++i) request.state->part_done(refused, 0);
}

Status Peer::break_lane(int lane) {
  std::lock_guard lock(mu_);
  if (lane < 0 || static_cast<size_t>(lane) >= lanes_.size()) {
    return Status::not_found(
        fmt::format("{}: no lane {} (the peer has {} lanes)", prefix(), lane, lanes_.size()));
  }
  const int fd = lanes_[static_cast<size_t>(lane)].fd;
  if (fd < 0) return Status::not_found(fmt::format("{}: lane {} is not connected", prefix(), lane));
  // The fd stays open (only its lane closes it, under mu_); the lane's next I/O on it fails.
  ::shutdown(fd, SHUT_RDWR);
  return Status();
}

void Peer::stop() {
  std::vector<std::pair<Slice, uint32_t>> left;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    cv_.notify_all();
  }
  for (Lane& lane : lanes_) {
    if (lane.thread.joinable()) lane.thread.join();
  }
  {
    std::lock_guard lock(mu_);
    take_all_locked(left);
  }
  for (auto& [slice, parts] : left) {
    const Status stopping =
        Status::unavailable(fmt::format("{}: {}: engine shutting down", prefix(), slice_text(slice)));
    for (uint32_t i = 0; i < parts; ++i) slice.state->part_done(stopping, 0);
  }
}

bool Peer::evict_if_idle() {
  std::lock_guard lock(mu_);
  if (has_work_locked() || in_flight_ > 0) return false;
  endpoint_epoch.fetch_add(1);
  cv_.notify_all();  // idle lanes wake and close their now stale connections
  return true;
}

Clock::time_point Peer::earliest_deadline_locked() const {
  Clock::time_point earliest = kNoDeadline;
  for (const Slice& s : retry_) earliest = std::min(earliest, s.deadline);
  // Pending requests are in submission order and share the engine's timeout, so the front is earliest.
  if (!pending_.empty()) earliest = std::min(earliest, pending_.front().whole.deadline);
  return earliest;
}

Slice Peer::take_slice_locked() {
  if (!retry_.empty()) {
    Slice slice = retry_.front();
    retry_.pop_front();
    return slice;
  }
  PendingRequest& front = pending_.front();
  Slice slice = front.whole;
  slice.local += front.next;
  slice.offset += front.next;
  slice.length = std::min(slice_bytes_, front.whole.length - front.next);
  front.next += slice.length;
  if (front.next == front.whole.length) pending_.pop_front();
  return slice;
}

bool Peer::take_expired_locked(Clock::time_point now, std::vector<std::pair<Slice, uint32_t>>& out) {
  const size_t before = out.size();
  for (auto it = retry_.begin(); it != retry_.end();) {
    if (it->deadline <= now) {
      out.emplace_back(*it, 1);
      it = retry_.erase(it);
    } else {
      ++it;
    }
  }
  while (!pending_.empty() && pending_.front().whole.deadline <= now) {
    const PendingRequest& front = pending_.front();
    Slice rest = front.whole;
    rest.local += front.next;
    rest.offset += front.next;
    rest.length -= front.next;
    out.emplace_back(rest, static_cast<uint32_t>((rest.length + slice_bytes_ - 1) / slice_bytes_));
    pending_.pop_front();
  }
  return out.size() > before;
}

void Peer::take_all_locked(std::vector<std::pair<Slice, uint32_t>>& out) {
  for (const Slice& s : retry_) out.emplace_back(s, 1);
  retry_.clear();
  for (const PendingRequest& p : pending_) {
    Slice rest = p.whole;
    rest.local += p.next;
    rest.offset += p.next;
    rest.length -= p.next;
    out.emplace_back(rest, static_cast<uint32_t>((rest.length + slice_bytes_ - 1) / slice_bytes_));
  }
  pending_.clear();
}

void Peer::run_lane(int index) {
  Lane& lane = lanes_[static_cast<size_t>(index)];
  const FailureOptions& failure = transport_->failure();
  Counters& counters = transport_->counters();
  std::vector<std::pair<Slice, uint32_t>> failed;
  bool check_idle_connection = false;  // the connection sat unused: the peer may have closed it meanwhile
  std::unique_lock lock(mu_);
  while (!stopping_) {
    const auto now = Clock::now();
    if (lane.fd >= 0 && lane.epoch != endpoint_epoch.load()) {  // evicted: close; reconnect on next use
      close_lane(lock, index);
      continue;
    }
    failed.clear();
    if (take_expired_locked(now, failed)) {
      const std::string last = last_error_.empty() ? "" : fmt::format(" (last error: {})", last_error_);
      lock.unlock();
      for (auto& [slice, parts] : failed) {
        const Status timed_out = Status::deadline_exceeded(
            fmt::format("{}: {}: request deadline passed before it could be sent{} after {} retries",
                        prefix(), slice_text(slice), last, slice.retries));
        for (uint32_t i = 0; i < parts; ++i) slice.state->part_done(timed_out, 0);
      }
      lock.lock();
      continue;
    }
    if (!has_work_locked()) {
      ++waiting_;
      cv_.wait(lock);
      --waiting_;
      check_idle_connection = true;
      continue;
    }
    if (now < down_until_) {
      take_all_locked(failed);
      const std::string down = down_error_;
      lock.unlock();
      for (auto& [slice, parts] : failed) {
        const Status unreachable = Status::unavailable(
            fmt::format("{}: {}: {} after {} retries", prefix(), slice_text(slice), down, slice.retries));
        for (uint32_t i = 0; i < parts; ++i) slice.state->part_done(unreachable, 0);
      }
      lock.lock();
      continue;
    }
    if (now < lane.cooldown_until) {
      ++waiting_;
      cv_.wait_until(lock, std::min(lane.cooldown_until, earliest_deadline_locked()));
      --waiting_;
      continue;
    }
    if (lane.fd < 0) {
      connect_lane(lock, index);
      check_idle_connection = false;
      continue;
    }
    if (check_idle_connection) {
      check_idle_connection = false;
      // Readable or hung up while no response is due: the peer closed it (restart, idle timeout) or it was
      // broken. Reconnect without a cool-down: this is a stale connection, not a failing path.
      pollfd p{.fd = lane.fd, .events = POLLIN | POLLRDHUP, .revents = 0};
      if (::poll(&p, 1, 0) != 0) {
        close_lane(lock, index);
        continue;
      }
    }
    Slice slice = take_slice_locked();
    ++in_flight_;
    last_used_ns.store(now.time_since_epoch().count(), std::memory_order_relaxed);
    const int fd = lane.fd;
    lock.unlock();

    Outcome outcome = transfer(fd, slice);

    if (outcome.code == Outcome::kOk || outcome.code == Outcome::kRefused ||
        outcome.code == Outcome::kStopped) {
      lock.lock();
      --in_flight_;  // before part_done: a batch seen complete has no slice of this peer in flight
      lock.unlock();
      if (outcome.code == Outcome::kOk) {
        slice.state->part_done(Status(), slice.length);
      } else if (outcome.code == Outcome::kRefused) {
        slice.state->part_done(
            Status(outcome.refusal.code(), fmt::format("{}: {} refused by the target: {}", prefix(),
                                                       slice_text(slice), outcome.refusal.message())),
            0);
      } else {
        slice.state->part_done(
            Status::unavailable(fmt::format("{}: {}: engine shutting down", prefix(), slice_text(slice))), 0);
      }
      lock.lock();
      continue;
    }

    // The lane failed: its stream is out of sync or dead. Close it, cool it down, retry the slice elsewhere.
    lock.lock();
    --in_flight_;
    const auto failed_at = Clock::now();
    const std::string what = fmt::format("lane {}: {}", index, outcome.what);
    last_error_ = what;
    lane.cooldown_until = failed_at + failure.path_cooldown;
    close_lane(lock, index);
    Status verdict;
    if (outcome.io == Io::kTimeout || failed_at >= slice.deadline) {
      verdict = Status::deadline_exceeded(
          fmt::format("{}: {}: {} after {} retries", prefix(), slice_text(slice), what, slice.retries));
    } else if (slice.retries >= failure.retry_budget) {
      verdict = Status::unavailable(
          fmt::format("{}: {}: {} after {} retries", prefix(), slice_text(slice), what, slice.retries));
    } else {
      ++slice.retries;
      counters.slices_retried.fetch_add(1, std::memory_order_relaxed);
      retry_.push_front(slice);
      notify_locked();
      continue;
    }
    lock.unlock();
    slice.state->part_done(verdict, 0);
    lock.lock();
  }
  if (lane.fd >= 0) close_lane(lock, index);
}

void Peer::connect_lane(std::unique_lock<std::mutex>& lock, int index) {
  Lane& lane = lanes_[static_cast<size_t>(index)];
  const FailureOptions& failure = transport_->failure();
  const auto now = Clock::now();
  // A connect never outlives the most urgent queued request: expired ones are failed by the lane loop.
  const auto earliest = earliest_deadline_locked();
  const bool cut_short = earliest < now + failure.connect_timeout;
  const auto deadline = std::min(now + failure.connect_timeout, earliest);
  lock.unlock();

  const uint64_t epoch = transport_->admit(this);
  // configure before connect: the window scale is negotiated in the handshake
  net::Connected connected = net::connect_tcp(address_, deadline, transport_->stop_fd(), configure_socket);
  if (connected.fd >= 0 && transport_->member_key()) {
    // Bytes go only to a peer that proves it is a member (and it serves us only once we have).
    const Status member = net::member_handshake(connected.fd, net::HandshakeSide::kClient,
                                                *transport_->member_key(), deadline, transport_->stop_fd());
    if (!member.ok()) {
      ::close(connected.fd);
      connected.fd = -1;
      connected.io.code = member.code() == StatusCode::kPermissionDenied ? Io::kError : Io::kTimeout;
      connected.error = member.message();
    }
  }
  const int fd = connected.fd;
  std::string error = std::move(connected.error);
  const bool timed_out = connected.io.code == Io::kTimeout;
  const bool stopped = connected.io.code == Io::kStopped;
  if (stopped) error = "engine shutting down";
  if (fd < 0) transport_->release(this, epoch);

  lock.lock();
  if (fd >= 0) {
    lane.fd = fd;
    lane.epoch = epoch;
    ++connected_lanes_;
    return;
  }
  if (stopped) return;
  last_error_ = error;
  if (timed_out && cut_short) return;  // the deadline, not the peer, ended the attempt: no verdict on it
  const auto failed_at = Clock::now();
  lane.cooldown_until = failed_at + failure.path_cooldown;
  if (connected_lanes_ > 0) return;  // other lanes reach the peer: they carry on
  // Nothing reaches the peer: fail what is queued now rather than after the retry loop, and what arrives
  // during the cool-down at submit.
  down_until_ = failed_at + failure.path_cooldown;
  down_error_ = error;
  std::vector<std::pair<Slice, uint32_t>> failed;
  take_all_locked(failed);
  lock.unlock();
  for (auto& [slice, parts] : failed) {
    const Status unreachable = Status::unavailable(
        fmt::format("{}: {}: {} after {} retries", prefix(), slice_text(slice), error, slice.retries));
    for (uint32_t i = 0; i < parts; ++i) slice.state->part_done(unreachable, 0);
  }
  lock.lock();
}

void Peer::close_lane(std::unique_lock<std::mutex>& lock, int index) {
  Lane& lane = lanes_[static_cast<size_t>(index)];
  const int fd = lane.fd;
  const uint64_t epoch = lane.epoch;
  lane.fd = -1;
  --connected_lanes_;
  lock.unlock();
  ::close(fd);
  transport_->release(this, epoch);
  lock.lock();
}

Outcome Peer::transfer(int fd, const Slice& slice) {
  const int stop_fd = transport_->stop_fd();
  const auto stall = transport_->failure().request_timeout;
  const uint64_t tag = next_tag_.fetch_add(1, std::memory_order_relaxed);
  std::byte header[kRequestHeaderBytes];
  RequestHeader{.op = slice.op == TransferOp::kRead ? kOpRead : kOpWrite,
                .tag = tag,
                .segment_id = slice.segment_id,
                .offset = slice.offset,
                .length = slice.length}
      .encode(header);
  auto lane_failed = [&](const Io& io, std::string_view during) {
    return io.code == Io::kStopped ? Outcome::stopped()
                                   : Outcome::lane_failed(io.code, describe(io, during, stall));
  };

  // One sendmsg carries header and payload, straight from the caller's registered memory.
  iovec iov[2] = {{.iov_base = header, .iov_len = sizeof(header)},
                  {.iov_base = slice.local, .iov_len = slice.length}};
  Io io = send_all(fd, iov, slice.op == TransferOp::kWrite ? 2 : 1, slice.deadline, stop_fd);
  if (!io.ok()) return lane_failed(io, "send");

  std::byte response_bytes[kResponseHeaderBytes];
  io = recv_all(fd, response_bytes, sizeof(response_bytes), slice.deadline, stop_fd);
  if (!io.ok()) return lane_failed(io, "receive of the response");
  ResponseHeader response;
  if (!response.decode(response_bytes)) {
    return Outcome::lane_failed(Io::kError, "garbage response (bad magic or version)");
  }
  if (response.tag != tag) {
    return Outcome::lane_failed(Io::kError,
                                fmt::format("response for tag {} while expecting {}", response.tag, tag));
  }
  if (response.status != 0) {
    std::string text(response.error_length, '\0');
    io = recv_all(fd, text.data(), text.size(), slice.deadline, stop_fd);
    if (!io.ok()) return lane_failed(io, "receive of an error response");
    const auto code = response.status <= static_cast<uint16_t>(StatusCode::kDeadlineExceeded)
                          ? static_cast<StatusCode>(response.status)
                          : StatusCode::kInternal;
    return Outcome::refused(Status(code, std::move(text)));
  }
  if (response.error_length != 0) {
    return Outcome::lane_failed(Io::kError, "garbage response (ok with error text)");
  }
  if (slice.op == TransferOp::kRead) {
    io = recv_all(fd, slice.local, slice.length, slice.deadline, stop_fd);
    if (!io.ok()) return lane_failed(io, "receive of the payload");
  }
  return Outcome{};
}

// ---- TcpTransport ------------------------------------------------------------------------------------

Status TcpTransport::start() {
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) return Status::unavailable(fmt::format("tcp: eventfd: {}", std::strerror(errno)));
  // configure_socket on the listener: accepted sockets inherit the buffer sizes
  Result<net::Listener> listener =
      net::listen_tcp(options_.tcp.listen_host, options_.tcp.listen_port, configure_socket);
  if (!listener.ok()) return Status::unavailable("tcp: " + listener.status().message());
  listen_fd_ = listener->fd;
  port_ = listener->port;
  server_.start(listen_fd_, stop_fd_, [this](int fd) { serve(fd); });
  return Status();
}

Result<std::shared_ptr<RemoteSegment>> TcpTransport::open(const SegmentDescriptor& descriptor) {
  // Messages here need no "tcp:" prefix: open_segment names the transport.
  const nlohmann::json& entry = descriptor.transports["tcp"];
  if (!entry.is_object() || !entry.value("host", nlohmann::json()).is_string() ||
      !entry.value("port", nlohmann::json()).is_number_integer() ||
      !entry.value("segment_id", nlohmann::json()).is_number_integer() ||
      entry["segment_id"].get<int64_t>() < 0) {
    return Status::invalid_argument(fmt::format("segment '{}' of engine {}: malformed tcp entry {}",
                                                descriptor.name, descriptor.engine, entry.dump()));
  }
  const auto host = entry["host"].get<std::string>();
  const auto port = entry["port"].get<int64_t>();
  if (port < 1 || port > 65535) {
    return Status::invalid_argument(fmt::format("segment '{}' of engine {}: port {} out of range",
                                                descriptor.name, descriptor.engine, port));
  }
  const std::string key = endpoint_key(host, static_cast<int>(port));
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard lock(peers_mu_);
    if (stopped_.load()) return Status::unavailable("engine shutting down");
    auto it = peers_.find(key);
    if (it != peers_.end()) peer = it->second;
  }
  if (!peer) {
    // Resolved once here (numeric hosts need no DNS): the lanes then connect without lookups.
    Result<net::SocketAddress> address = net::resolve_tcp(host, static_cast<int>(port));
    if (!address.ok()) {
      return Status::unavailable(fmt::format("peer {} {}: segment '{}': {}", descriptor.engine, key,
                                             descriptor.name, address.status().message()));
    }
    std::lock_guard lock(peers_mu_);
    if (stopped_.load()) return Status::unavailable("engine shutting down");
    auto& slot = peers_[key];
    if (!slot) {
      slot = std::make_shared<Peer>(this, key, descriptor.engine, *address, options_.tcp.lanes_per_peer,
                                    options_.tcp.slice_bytes);
    }
    peer = slot;
  }
  return std::shared_ptr<RemoteSegment>(std::make_shared<TcpRemoteSegment>(
      std::move(peer), entry["segment_id"].get<uint64_t>(), descriptor.name));
}

uint64_t TcpTransport::admit(Peer* peer) {
  std::lock_guard lock(endpoints_mu_);
  if (!peer->is_endpoint) {
    if (endpoints_.size() >= static_cast<size_t>(failure_.max_endpoints)) {
      // Least recently used first; a busy peer is never evicted (its transfers would fail or stall).
      std::vector<Peer*> candidates = endpoints_;
      std::sort(candidates.begin(), candidates.end(), [](const Peer* a, const Peer* b) {
        return a->last_used_ns.load(std::memory_order_relaxed) <
               b->last_used_ns.load(std::memory_order_relaxed);
      });
      for (Peer* victim : candidates) {
        if (!victim->evict_if_idle()) continue;
        victim->is_endpoint = false;
        victim->open_connections = 0;
        std::erase(endpoints_, victim);
        context_.counters->endpoints_evicted.fetch_add(1, std::memory_order_relaxed);
        break;
      }
    }
    peer->is_endpoint = true;
    endpoints_.push_back(peer);
  }
  ++peer->open_connections;
  return peer->endpoint_epoch.load();
}

void TcpTransport::release(Peer* peer, uint64_t epoch) {
  std::lock_guard lock(endpoints_mu_);
  if (!peer->is_endpoint || peer->endpoint_epoch.load() != epoch) return;
  if (--peer->open_connections == 0) {
    peer->is_endpoint = false;
    std::erase(endpoints_, peer);
  }
}

void TcpTransport::shutdown() {
  if (stopped_.exchange(true)) return;
  if (stop_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof(one));  // wakes every poll of every thread, for good
  }
  std::vector<std::shared_ptr<Peer>> peers;
  {
    std::lock_guard lock(peers_mu_);
    for (auto& [key, peer] : peers_) peers.push_back(peer);
  }
  for (auto& peer : peers) peer->stop();
  server_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  if (stop_fd_ >= 0) ::close(stop_fd_);
  stop_fd_ = -1;
}

// ---- Target side -------------------------------------------------------------------------------------

Status TcpTransport::refuse(int fd, uint64_t tag, const Status& why, Clock::time_point deadline) {
  context_.counters->remote_accesses_refused.fetch_add(1, std::memory_order_relaxed);
  const std::string text = why.message().substr(0, kMaxErrorBytes);
  std::byte header[kResponseHeaderBytes];
  ResponseHeader{.status = static_cast<uint16_t>(why.code()),
                 .tag = tag,
                 .error_length = static_cast<uint32_t>(text.size())}
      .encode(header);
  iovec iov[2] = {{.iov_base = header, .iov_len = sizeof(header)},
                  {.iov_base = const_cast<char*>(text.data()), .iov_len = text.size()}};
  const Io io = send_all(fd, iov, 2, deadline, stop_fd_);
  return io.ok() ? Status() : Status::unavailable("send failed");
}

void TcpTransport::serve(int fd) {
  // A peer that stops mid-frame holds this thread (and, mid-payload, the segment) at most this long.
  const auto stall = failure_.request_timeout;
  if (member_key_ && !net::member_handshake(fd, net::HandshakeSide::kServer, *member_key_,
                                            Clock::now() + failure_.connect_timeout, stop_fd_)
                          .ok()) {
    context_.counters->peers_refused.fetch_add(1, std::memory_order_relaxed);
    return;  // closed unserved: no segment is named to a stranger
  }
  std::unique_ptr<std::byte[]> drain;  // for payloads of refused writes; allocated on first use
  std::byte header_bytes[kRequestHeaderBytes];
  std::byte response_bytes[kResponseHeaderBytes];
  for (;;) {
    // An idle connection waits for its next request without a deadline; a started frame must complete.
    Io io = recv_frame_start(fd, header_bytes, sizeof(header_bytes), stall, stop_fd_);
    if (!io.ok()) break;
    RequestHeader request;
    if (!request.decode(header_bytes)) break;  // not our protocol: the stream cannot be trusted
    const auto deadline = Clock::now() + stall;
    Result<SegmentTable::Access> checked =
        context_.segments->access(request.segment_id, request.offset, request.length);
    if (!checked.ok()) {
      if (request.op == kOpWrite) {  // keep the stream in sync: the payload follows regardless
        if (!drain) drain = std::make_unique<std::byte[]>(kDrainBytes);
        for (uint64_t left = request.length; left > 0 && io.ok();) {
          const size_t chunk = static_cast<size_t>(std::min<uint64_t>(left, kDrainBytes));
          io = recv_all(fd, drain.get(), chunk, deadline, stop_fd_);
          left -= chunk;
        }
        if (!io.ok()) break;
      }
      if (!refuse(fd, request.tag, checked.status(), deadline).ok()) break;
      continue;
    }
    // Held (a shared lock on the segment table) only while the payload moves: withdraw waits for it.
    std::optional<SegmentTable::Access> access(std::move(checked).value());
    ResponseHeader{.status = 0, .tag = request.tag, .error_length = 0}.encode(response_bytes);
    if (request.op == kOpRead) {
      // Header and payload in one sendmsg, straight from the segment's memory.
      iovec iov[2] = {{.iov_base = response_bytes, .iov_len = sizeof(response_bytes)},
                      {.iov_base = access->data(), .iov_len = request.length}};
      UntrackedSegmentAccess untracked;
      io = send_all(fd, iov, 2, deadline, stop_fd_);
    } else {
      {
        UntrackedSegmentAccess untracked;
        io = recv_all(fd, access->data(), request.length, deadline, stop_fd_);
      }
      access.reset();  // release the segment before answering
      if (io.ok()) io = send_bytes(fd, response_bytes, sizeof(response_bytes), deadline, stop_fd_);
    }
    if (!io.ok()) break;
  }
}

}  // namespace

Result<std::unique_ptr<Transport>> make_tcp_transport(const TransportContext& context) {
  auto transport = std::make_unique<TcpTransport>(context);
  CRESCENT_RETURN_IF_ERROR(transport->start());
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace crescent::transfer::internal
