// Shared-memory transport: a peer on the same host maps the target segment's memfd (through
// /proc/PID/fd/FD, which needs the same user) and worker threads copy directly between the initiator's
// memory and that mapping: one copy, no kernel in the data path.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "transfer/transport.h"

namespace crescent::transfer::internal {
namespace {

// Requests above this are cut into slices of this size so several workers can copy one request.
constexpr uint64_t kSliceBytes = 4 << 20;

// A copy job: one slice of a request.
struct Copy {
  TransferOp op;
  std::byte* local;
  std::byte* remote;
  uint64_t length;
  Clock::time_point deadline;
  RequestState* state;
  int owner_pidfd;  // -1: the owner is this process
  pid_t owner_pid;
  const std::string* segment;  // name, for errors; lives as long as the engine's open segments
};

// True when the process behind `pidfd` has exited (pidfd becomes readable then).
bool exited(int pidfd) {
  if (pidfd < 0) return false;
  pollfd p{.fd = pidfd, .events = POLLIN, .revents = 0};
  return ::poll(&p, 1, 0) > 0;
}

class ShmTransport;

class ShmRemoteSegment final : public RemoteSegment {
 public:
  ShmRemoteSegment(ShmTransport* transport, void* mapping, size_t mapped_bytes, std::byte* base, int pidfd,
                   pid_t pid, std::string name)
      : transport_(transport),
        mapping_(mapping),
        mapped_bytes_(mapped_bytes),
        base_(base),
        pidfd_(pidfd),
        pid_(pid),
        name_(std::move(name)) {}
  ~ShmRemoteSegment() override {
    ::munmap(mapping_, mapped_bytes_);
    if (pidfd_ >= 0) ::close(pidfd_);
  }

  void submit(const TransportRequest& request) override;

 private:
  ShmTransport* transport_;
  void* mapping_;
  size_t mapped_bytes_;
  std::byte* base_;  // the segment's first byte in this process
  int pidfd_;
  pid_t pid_;
  std::string name_;
};

class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(const TransportContext& context) : context_(context) {
    const unsigned workers = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
    for (unsigned i = 0; i < workers; ++i) workers_.emplace_back([this] { run(); });
  }
  ~ShmTransport() override { shutdown(); }

  TransportKind kind() const override { return TransportKind::kShm; }

  Status expose(const LocalSegment& segment, nlohmann::json& entry) override {
    if (segment.memfd < 0) return Status();  // not shareable: leave entry null
    struct stat st {};
    if (::fstat(segment.memfd, &st) != 0) {
      return Status::io_error(
          fmt::format("shm: segment '{}': fstat of its memfd: {}", segment.name, std::strerror(errno)));
    }
    // The inode lets a peer check that /proc/PID/fd/FD is still this memfd (fd numbers are reused).
    entry = {{"pid", ::getpid()},
             {"fd", segment.memfd},
             {"inode", static_cast<uint64_t>(st.st_ino)},
             {"offset_bytes", segment.memfd_offset_bytes}};
    return Status();
  }

  void withdraw(const LocalSegment&) override {}

  Result<std::shared_ptr<RemoteSegment>> open(const SegmentDescriptor& descriptor) override {
    if (descriptor.host_id != context_.host_id) {
      return Status::unavailable(
          fmt::format("segment '{}' is on another host ({})", descriptor.name, descriptor.host_id));
    }
    const nlohmann::json& entry = descriptor.transports["shm"];
    if (!entry.is_object() || !entry.value("pid", nlohmann::json()).is_number_integer() ||
        !entry.value("fd", nlohmann::json()).is_number_integer() ||
        !entry.value("offset_bytes", nlohmann::json()).is_number_unsigned()) {
      return Status::invalid_argument(
          fmt::format("segment '{}': malformed shm entry {}", descriptor.name, entry.dump()));
    }
    const pid_t pid = entry["pid"].get<pid_t>();
    const int fd = entry["fd"].get<int>();
    const uint64_t offset = entry["offset_bytes"].get<uint64_t>();
    const std::string path = fmt::format("/proc/{}/fd/{}", pid, fd);
    const int local_fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (local_fd < 0) {
      return Status::unavailable(
          fmt::format("segment '{}': cannot open {}: {}", descriptor.name, path, std::strerror(errno)));
    }
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t map_offset = offset / page * page;
    const size_t mapped_bytes = static_cast<size_t>(offset - map_offset + descriptor.length_bytes);
    void* mapping = ::mmap(nullptr, mapped_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, local_fd,
                           static_cast<off_t>(map_offset));
    const int map_errno = errno;
    ::close(local_fd);
    if (mapping == MAP_FAILED) {
      return Status::unavailable(fmt::format("segment '{}': cannot map {} bytes of {}: {}", descriptor.name,
                                             mapped_bytes, path, std::strerror(map_errno)));
    }
    int pidfd = -1;
    if (pid != ::getpid()) {
      pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
      if (pidfd < 0) {
        ::munmap(mapping, mapped_bytes);
        return Status::unavailable(
            fmt::format("segment '{}': owner process {} is gone", descriptor.name, pid));
      }
    }
    auto* base = static_cast<std::byte*>(mapping) + (offset - map_offset);
    return std::shared_ptr<RemoteSegment>(
        std::make_shared<ShmRemoteSegment>(this, mapping, mapped_bytes, base, pidfd, pid, descriptor.name));
  }

  void shutdown() override {
    std::deque<Copy> left;
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
      left.swap(queue_);
    }
    ready_.notify_all();
    for (auto& worker : workers_) worker.join();
    for (const Copy& copy : left) {
      copy.state->part_done(
          Status::unavailable(fmt::format("shm: segment '{}': engine shutting down", *copy.segment)), 0);
    }
  }

  void enqueue(const TransportRequest& request, std::byte* remote, int pidfd, pid_t pid,
               const std::string* segment) {
    const uint32_t parts = static_cast<uint32_t>((request.length_bytes + kSliceBytes - 1) / kSliceBytes);
    request.state->expect_parts(parts);
    {
      std::lock_guard lock(mu_);
      if (!stopping_) {
        for (uint64_t done = 0; done < request.length_bytes; done += kSliceBytes) {
          queue_.push_back({.op = request.op,
                            .local = request.local + done,
                            .remote = remote + done,
                            .length = std::min(kSliceBytes, request.length_bytes - done),
                            .deadline = request.deadline,
                            .state = request.state,
                            .owner_pidfd = pidfd,
                            .owner_pid = pid,
                            .segment = segment});
        }
        if (parts == 1) {
          ready_.notify_one();
        } else {
          ready_.notify_all();
        }
        return;
      }
    }
    for (uint32_t i = 0; i < parts; ++i)
      request.state->part_done(
          Status::unavailable(fmt::format("shm: segment '{}': engine shutting down", *segment)), 0);
  }

 private:
  void run() {
    for (;;) {
      Copy copy;
      {
        std::unique_lock lock(mu_);
        ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        copy = queue_.front();
        queue_.pop_front();
      }
      if (Clock::now() > copy.deadline) {
        copy.state->part_done(
            Status::deadline_exceeded(
                fmt::format("shm: segment '{}': request timed out before its copy started", *copy.segment)),
            0);
      } else if (exited(copy.owner_pidfd)) {
        copy.state->part_done(
            Status::unavailable(
                fmt::format("shm: segment '{}': owner process {} has exited", *copy.segment, copy.owner_pid)),
            0);
      } else {
        if (copy.op == TransferOp::kRead) {
          std::memcpy(copy.local, copy.remote, copy.length);
        } else {
          std::memcpy(copy.remote, copy.local, copy.length);
        }
        copy.state->part_done(Status(), copy.length);
      }
    }
  }

  TransportContext context_;
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<Copy> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

void ShmRemoteSegment::submit(const TransportRequest& request) {
  transport_->enqueue(request, base_ + request.offset_bytes, pidfd_, pid_, &name_);
}

}  // namespace

Result<std::unique_ptr<Transport>> make_shm_transport(const TransportContext& context) {
  return std::unique_ptr<Transport>(std::make_unique<ShmTransport>(context));
}

}  // namespace crescent::transfer::internal
