// TCP transport (paper §3.2.3): persistent connections ("lanes") to each peer engine, requests cut into
// slices that the lanes of that peer pull from one shared queue, small slices pipelined (a window of them
// on the wire per lane), bytes moved straight between registered memory and the socket (sendmsg of headers
// + payloads; large read payloads received straight into the destination, small ones through a buffer),
// failures retried on other lanes.
//
// Threads. Initiator side: `lanes_per_peer` lane threads per peer (peer = remote engine, keyed by
// host:port), started on the first request to that peer; each owns one connection, opened lazily by the
// lane itself (so neither open() nor submit() touches the network), and carries one window at a time: up
// to kWindowSlices slices of at most kWindowBytes in all, sent back to back while the answers are read (so
// neither side's socket buffers can fill against the other). Target side: one listener thread, and one
// thread per accepted connection serving its requests in order, answering the requests that arrived
// together in one sendmsg.
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
// Failures. A lane whose connection fails mid-window (error, EOF, garbage response) closes it, is not used
// again for failure.path_cooldown, and puts the window's unanswered slices back at the head of the queue,
// in order, for another lane (at most failure.retry_budget times per slice). A stall longer than the request's remaining time fails the
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
#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <span>
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
// A lane puts up to kWindowSlices slices of at most kWindowBytes payload on the wire before it waits for
// the first answer, so small transfers are not one round trip each. The first slice of a window is taken
// whatever its size: a full slice (512 KiB by default) travels alone.
constexpr size_t kWindowSlices = 64;
constexpr uint64_t kWindowBytes = 256 << 10;
// Answers are read through a buffer this big (a window of small reads costs a few recv calls, not two per
// slice); a read payload of at least kDirectBytes is received straight into its destination instead.
constexpr size_t kStagingBytes = 64 << 10;
constexpr uint64_t kDirectBytes = 16 << 10;
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

// How a lane's window ended for the slices not yet answered.
struct Outcome {
  enum Code { kOk, kLaneFailed, kStopped };
  Code code = kOk;
  Io::Code io = Io::kOk;  // for kLaneFailed
  std::string what;       // for kLaneFailed

  static Outcome lane_failed(Io::Code io, std::string what) {
    Outcome o;
    o.code = kLaneFailed;
    o.io = io;
    o.what = std::move(what);
    return o;
  }
  static Outcome stopped() {
    Outcome o;
    o.code = kStopped;
    return o;
  }
};

// What a lane has on the wire: the slices of one window, sent back to back and answered in order (the
// target serves a connection's requests in order), and the buffer its answers are read through.
struct Window {
  std::vector<Slice> slices;
  std::vector<std::array<std::byte, kRequestHeaderBytes>> headers;
  std::vector<iovec> iov;
  std::unique_ptr<std::byte[]> staging;  // received, not yet consumed: [begin, end)
  size_t begin = 0;
  size_t end = 0;
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
    Window window;  // the lane thread's own
  };

  void run_lane(int index);
  bool has_work_locked() const { return !retry_.empty() || !pending_.empty(); }
  Clock::time_point earliest_deadline_locked() const;
  Slice take_slice_locked();
  // Length of the slice take_slice_locked would return. REQUIRES: has_work_locked().
  uint64_t next_slice_length_locked() const;
  // Fills `window` with the next slices: at least one, then more while they fit kWindowSlices and
  // kWindowBytes.
  void take_window_locked(Window& window);
  // Removes queued slices whose deadline passed into `out`; true when there were any.
  bool take_expired_locked(Clock::time_point now, std::vector<std::pair<Slice, uint32_t>>& out);
  // Removes every queued slice into `out` (slice, parts it stands for).
  void take_all_locked(std::vector<std::pair<Slice, uint32_t>>& out);
  void connect_lane(std::unique_lock<std::mutex>& lock, int index);
  void close_lane(std::unique_lock<std::mutex>& lock, int index);
  // Sends the window's requests and reads their answers, both as the socket allows (so neither side's
  // buffers can fill up against the other), reporting each slice as its answer completes. Returns how
  // many were answered; the rest (when the lane failed or the engine stops) are the caller's.
  size_t transfer_window(int fd, Window& window, Outcome& failure);
  // Reports one answered slice.
  void complete(Slice& slice, const Status& status, uint64_t bytes);
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
  std::atomic<int> in_flight_{0};  // slices taken by lanes, not yet reported or put back
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
  if (has_work_locked() || in_flight_.load() > 0) return false;
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

uint64_t Peer::next_slice_length_locked() const {
  if (!retry_.empty()) return retry_.front().length;
  const PendingRequest& front = pending_.front();
  return std::min(slice_bytes_, front.whole.length - front.next);
}

void Peer::take_window_locked(Window& window) {
  window.slices.clear();
  uint64_t bytes = 0;
  while (has_work_locked() && window.slices.size() < kWindowSlices) {
    const uint64_t length = next_slice_length_locked();
    if (!window.slices.empty() && bytes + length > kWindowBytes) break;
    window.slices.push_back(take_slice_locked());
    bytes += length;
  }
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
    Window& window = lane.window;
    take_window_locked(window);
    in_flight_.fetch_add(static_cast<int>(window.slices.size()));
    last_used_ns.store(now.time_since_epoch().count(), std::memory_order_relaxed);
    const int fd = lane.fd;
    lock.unlock();

    Outcome outcome;
    const size_t answered = transfer_window(fd, window, outcome);
    std::span<Slice> rest(window.slices.begin() + static_cast<ptrdiff_t>(answered), window.slices.end());

    if (outcome.code == Outcome::kStopped) {
      for (Slice& slice : rest) {
        complete(
            slice,
            Status::unavailable(fmt::format("{}: {}: engine shutting down", prefix(), slice_text(slice))), 0);
      }
      lock.lock();
      continue;
    }
    if (outcome.code == Outcome::kOk) {
      lock.lock();
      continue;
    }

    // The lane failed: its stream is out of sync or dead. Close it, cool it down, retry the unanswered
    // slices on other lanes (in their order, ahead of everything queued).
    lock.lock();
    const auto failed_at = Clock::now();
    const std::string what = fmt::format("lane {}: {}", index, outcome.what);
    last_error_ = what;
    lane.cooldown_until = failed_at + failure.path_cooldown;
    close_lane(lock, index);
    std::vector<std::pair<Slice, Status>> verdicts;
    for (auto it = rest.rbegin(); it != rest.rend(); ++it) {
      Slice& slice = *it;
      in_flight_.fetch_sub(1);
      if (outcome.io == Io::kTimeout || failed_at >= slice.deadline) {
        verdicts.emplace_back(slice,
                              Status::deadline_exceeded(fmt::format("{}: {}: {} after {} retries", prefix(),
                                                                    slice_text(slice), what, slice.retries)));
      } else if (slice.retries >= failure.retry_budget) {
        verdicts.emplace_back(
            slice, Status::unavailable(fmt::format("{}: {}: {} after {} retries", prefix(), slice_text(slice),
                                                   what, slice.retries)));
      } else {
        ++slice.retries;
        counters.slices_retried.fetch_add(1, std::memory_order_relaxed);
        retry_.push_front(slice);
      }
    }
    if (verdicts.size() < rest.size()) notify_locked();
    if (verdicts.empty()) continue;
    lock.unlock();
    for (auto it = verdicts.rbegin(); it != verdicts.rend(); ++it) it->first.state->part_done(it->second, 0);
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

void Peer::complete(Slice& slice, const Status& status, uint64_t bytes) {
  in_flight_.fetch_sub(1);  // before part_done: a batch seen complete has no slice of this peer in flight
  slice.state->part_done(status, bytes);
}

size_t Peer::transfer_window(int fd, Window& w, Outcome& failure) {
  const int stop_fd = transport_->stop_fd();
  const auto stall = transport_->failure().request_timeout;
  const size_t count = w.slices.size();
  const uint64_t first_tag = next_tag_.fetch_add(count, std::memory_order_relaxed);
  w.headers.resize(count);
  w.iov.clear();
  for (size_t i = 0; i < count; ++i) {
    const Slice& slice = w.slices[i];
    RequestHeader{.op = slice.op == TransferOp::kRead ? kOpRead : kOpWrite,
                  .tag = first_tag + i,
                  .segment_id = slice.segment_id,
                  .offset = slice.offset,
                  .length = slice.length}
        .encode(w.headers[i].data());
    w.iov.push_back({.iov_base = w.headers[i].data(), .iov_len = kRequestHeaderBytes});
    // Written payloads go straight from the caller's registered memory.
    if (slice.op == TransferOp::kWrite) w.iov.push_back({.iov_base = slice.local, .iov_len = slice.length});
  }
  iovec* unsent = w.iov.data();
  int unsent_count = static_cast<int>(w.iov.size());
  if (!w.staging) w.staging = std::make_unique<std::byte[]>(kStagingBytes);
  std::byte* const staging = w.staging.get();
  w.begin = w.end = 0;

  // The answer being read is that of slice `answered`: its header, then its error text or read payload.
  enum class Part { kHeader, kErrorText, kPayload };
  Part part = Part::kHeader;
  ResponseHeader response;
  uint64_t payload_done = 0;
  size_t answered = 0;
  auto lane_failed = [&](const Io& io, std::string_view during) {
    failure = io.code == Io::kStopped ? Outcome::stopped()
                                      : Outcome::lane_failed(io.code, describe(io, during, stall));
    return answered;
  };
  auto garbage = [&](std::string what) {
    failure = Outcome::lane_failed(Io::kError, std::move(what));
    return answered;
  };

  for (;;) {
    // Consume what is buffered.
    while (answered < count) {
      Slice& slice = w.slices[answered];
      const size_t available = w.end - w.begin;
      if (part == Part::kHeader) {
        if (available < kResponseHeaderBytes) break;
        if (!response.decode(staging + w.begin)) return garbage("garbage response (bad magic or version)");
        const uint64_t tag = first_tag + answered;
        if (response.tag != tag) {
          return garbage(fmt::format("response for tag {} while expecting {}", response.tag, tag));
        }
        w.begin += kResponseHeaderBytes;
        if (response.status != 0) {
          part = Part::kErrorText;
        } else if (response.error_length != 0) {
          return garbage("garbage response (ok with error text)");
        } else if (slice.op == TransferOp::kRead) {
          part = Part::kPayload;
          payload_done = 0;
        } else {
          complete(slice, Status(), slice.length);
          ++answered;
        }
        continue;
      }
      if (part == Part::kErrorText) {
        if (available < response.error_length) break;
        const std::string_view text(reinterpret_cast<const char*>(staging + w.begin), response.error_length);
        w.begin += response.error_length;
        const auto code = response.status <= static_cast<uint16_t>(StatusCode::kDeadlineExceeded)
                              ? static_cast<StatusCode>(response.status)
                              : StatusCode::kInternal;
        complete(
            slice,
            Status(code, fmt::format("{}: {} refused by the target: {}", prefix(), slice_text(slice), text)),
            0);
        ++answered;
        part = Part::kHeader;
        continue;
      }
      const size_t take = static_cast<size_t>(std::min<uint64_t>(available, slice.length - payload_done));
      std::memcpy(slice.local + payload_done, staging + w.begin, take);
      w.begin += take;
      payload_done += take;
      if (payload_done < slice.length) break;
      complete(slice, Status(), slice.length);
      ++answered;
      part = Part::kHeader;
    }
    if (answered == count) {
      // Nothing may follow the last answer: the target answers only what was asked.
      if (w.begin != w.end) return garbage("bytes after the last response of a window");
      return answered;
    }
    if (w.begin == w.end) w.begin = w.end = 0;

    bool progressed = false;
    if (unsent_count > 0) {
      msghdr message{};
      message.msg_iov = unsent;
      message.msg_iovlen = static_cast<size_t>(unsent_count);
      const ssize_t n = ::sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        net::advance_iov(unsent, unsent_count, static_cast<size_t>(n));
        progressed = true;
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return lane_failed(Io{Io::kError, errno}, "send");
      }
    }

    const Slice& slice = w.slices[answered];
    std::byte* into = nullptr;
    size_t room = 0;
    const bool direct =
        part == Part::kPayload && w.begin == w.end && slice.length - payload_done >= kDirectBytes;
    if (direct) {
      into = slice.local + payload_done;  // a large payload goes straight to its destination
      room = static_cast<size_t>(slice.length - payload_done);
    } else {
      if (kStagingBytes - w.end < kResponseHeaderBytes + kMaxErrorBytes) {
        std::memmove(staging, staging + w.begin, w.end - w.begin);
        w.end -= w.begin;
        w.begin = 0;
      }
      into = staging + w.end;
      room = kStagingBytes - w.end;
      // A large read's header alone, so that its payload can then go straight to its destination.
      if (part == Part::kHeader && w.begin == w.end && slice.op == TransferOp::kRead &&
          slice.length >= kDirectBytes) {
        room = kResponseHeaderBytes;
      }
    }
    const ssize_t n = ::recv(fd, into, room, MSG_DONTWAIT);
    if (n > 0) {
      if (direct) {
        payload_done += static_cast<uint64_t>(n);
      } else {
        w.end += static_cast<size_t>(n);
      }
      continue;
    }
    if (n == 0) return lane_failed(Io{Io::kClosed}, "receive of a response");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return lane_failed(Io{Io::kError, errno}, "receive of a response");
    }
    if (progressed) continue;
    Clock::time_point deadline = kNoDeadline;
    for (size_t i = answered; i < count; ++i) deadline = std::min(deadline, w.slices[i].deadline);
    const short events = static_cast<short>(POLLIN | (unsent_count > 0 ? POLLOUT : 0));
    if (Io waited = wait_fd(fd, events, deadline, stop_fd); !waited.ok()) {
      return lane_failed(waited, unsent_count > 0 ? "send" : "receive of a response");
    }
  }
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

// One accepted connection. Requests are parsed out of a receive buffer, so a pipelined window of small
// requests costs one recv, not one per request; the answers to the requests that arrived together go out
// in one sendmsg, read payloads straight from the segments' memory, under one shared lock of the segment
// table (released before waiting for more requests, so withdrawing a segment never waits on a client).
class ServerConnection {
 public:
  ServerConnection(int fd, const SegmentTable& segments, Counters& counters, int stop_fd,
                   std::chrono::milliseconds stall)
      : fd_(fd), segments_(segments), counters_(counters), stop_fd_(stop_fd), stall_(stall) {
    headers_.reserve(kMaxAnswerIov);
    iov_.reserve(kMaxAnswerIov);
  }

  // Serves requests until the peer closes, breaks the protocol or stalls mid-frame, or shutdown.
  void run() {
    for (;;) {
      if (end_ - begin_ < kRequestHeaderBytes) {
        // Everything asked so far is answered before waiting for more: the client may wait for it.
        if (!flush().ok()) return;
        std::memmove(in_.get(), in_.get() + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
        // An idle connection waits for its next request without a deadline; a started frame must complete.
        if (!fill(end_ == 0 ? kNoDeadline : Clock::now() + stall_).ok()) return;
        continue;
      }
      RequestHeader request;
      if (!request.decode(in_.get() + begin_)) return;  // not our protocol: the stream cannot be trusted
      begin_ += kRequestHeaderBytes;
      if (!serve(request).ok()) return;
      if (iov_.size() + 2 > kMaxAnswerIov || answer_bytes_ >= kMaxAnswerBytes) {
        if (!flush().ok()) return;
      }
    }
  }

 private:
  // Up to this many iovecs (IOV_MAX is 1024) and this many payload bytes are answered per sendmsg.
  static constexpr size_t kMaxAnswerIov = 512;
  static constexpr uint64_t kMaxAnswerBytes = 1 << 20;
  static constexpr size_t kReceiveBytes = 64 << 10;

  Io serve(const RequestHeader& request) {
    // A peer that stops mid-frame holds this thread (and, mid-payload, the segment) at most this long.
    const auto deadline = Clock::now() + stall_;
    if (!view_.held()) view_ = segments_.view();
    Result<std::byte*> range = view_.range(request.segment_id, request.offset, request.length);
    if (!range.ok()) {
      counters_.remote_accesses_refused.fetch_add(1, std::memory_order_relaxed);
      if (request.op == kOpWrite) {  // keep the stream in sync: the payload follows regardless
        if (Io io = receive(nullptr, request.length, deadline); !io.ok()) return io;
      }
      std::string& text = errors_.emplace_back(range.status().message().substr(0, kMaxErrorBytes));
      add_header(request.tag, static_cast<uint16_t>(range.status().code()), text.size());
      iov_.push_back({.iov_base = text.data(), .iov_len = text.size()});
      return Io{};
    }
    if (request.op == kOpWrite) {
      UntrackedSegmentAccess untracked;
      if (Io io = receive(*range, request.length, deadline); !io.ok()) return io;
      add_header(request.tag, 0, 0);
      return Io{};
    }
    add_header(request.tag, 0, 0);
    iov_.push_back({.iov_base = *range, .iov_len = request.length});
    answer_bytes_ += request.length;
    return Io{};
  }

  void add_header(uint64_t tag, uint16_t status, size_t error_length) {
    auto& header = headers_.emplace_back();
    ResponseHeader{.status = status, .tag = tag, .error_length = static_cast<uint32_t>(error_length)}.encode(
        header.data());
    iov_.push_back({.iov_base = header.data(), .iov_len = header.size()});
  }

  // Moves the `length` bytes that follow into `out` (nullptr: drops them), the buffered ones first.
  Io receive(std::byte* out, uint64_t length, Clock::time_point deadline) {
    const auto buffered = static_cast<size_t>(std::min<uint64_t>(length, end_ - begin_));
    if (out != nullptr) std::memcpy(out, in_.get() + begin_, buffered);
    begin_ += buffered;
    length -= buffered;
    if (out != nullptr) return recv_all(fd_, out + buffered, length, deadline, stop_fd_);
    while (length > 0) {
      const auto chunk = static_cast<size_t>(std::min<uint64_t>(length, kReceiveBytes));
      if (Io io = recv_all(fd_, in_.get() + end_, chunk, deadline, stop_fd_); !io.ok()) return io;
      length -= chunk;
    }
    return Io{};
  }

  // Reads what has arrived (at least one byte) after the buffered bytes.
  Io fill(Clock::time_point deadline) {
    for (;;) {
      const ssize_t n = ::recv(fd_, in_.get() + end_, kReceiveBytes - end_, MSG_DONTWAIT);
      if (n > 0) {
        end_ += static_cast<size_t>(n);
        return Io{};
      }
      if (n == 0) return Io{Io::kClosed};
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Io{Io::kError, errno};
      if (Io waited = wait_fd(fd_, POLLIN, deadline, stop_fd_); !waited.ok()) return waited;
    }
  }

  // Sends the queued answers and releases the segments.
  Io flush() {
    Io io;
    if (!iov_.empty()) {
      UntrackedSegmentAccess untracked;
      io = send_all(fd_, iov_.data(), static_cast<int>(iov_.size()), Clock::now() + stall_, stop_fd_);
    }
    iov_.clear();
    headers_.clear();
    errors_.clear();
    answer_bytes_ = 0;
    view_.release();
    return io;
  }

  const int fd_;
  const SegmentTable& segments_;
  Counters& counters_;
  const int stop_fd_;
  const std::chrono::milliseconds stall_;
  // Received request bytes not yet consumed: [begin_, end_). Room for a drained payload chunk past end_.
  std::unique_ptr<std::byte[]> in_ = std::make_unique<std::byte[]>(2 * kReceiveBytes);
  size_t begin_ = 0;
  size_t end_ = 0;
  // Queued answers: headers (reserved, so the iovecs' pointers stay valid), refusals' texts (a deque keeps
  // them in place), the iovecs, and the lock keeping their segments alive.
  std::vector<std::array<std::byte, kResponseHeaderBytes>> headers_;
  std::deque<std::string> errors_;
  std::vector<iovec> iov_;
  uint64_t answer_bytes_ = 0;
  SegmentTable::View view_;
};

void TcpTransport::serve(int fd) {
  if (member_key_ && !net::member_handshake(fd, net::HandshakeSide::kServer, *member_key_,
                                            Clock::now() + failure_.connect_timeout, stop_fd_)
                          .ok()) {
    context_.counters->peers_refused.fetch_add(1, std::memory_order_relaxed);
    return;  // closed unserved: no segment is named to a stranger
  }
  ServerConnection(fd, *context_.segments, *context_.counters, stop_fd_, failure_.request_timeout).run();
}

}  // namespace

Result<std::unique_ptr<Transport>> make_tcp_transport(const TransportContext& context) {
  auto transport = std::make_unique<TcpTransport>(context);
  CRESCENT_RETURN_IF_ERROR(transport->start());
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace crescent::transfer::internal
