#include "common/compute_thread.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

namespace crescent {

ComputeThread::ComputeThread(std::function<void()> on_start)
    : done_fd_(::eventfd(0, EFD_CLOEXEC)),
      progress_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      on_start_(std::move(on_start)) {
  if (done_fd_ >= 0) thread_ = std::thread([this] { loop(); });
}

ComputeThread::~ComputeThread() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (done_fd_ >= 0) ::close(done_fd_);
  if (progress_fd_ >= 0) ::close(progress_fd_);
}

void ComputeThread::notify_progress() {
  if (progress_fd_ < 0) return;
  const uint64_t one = 1;
  (void)!::write(progress_fd_, &one, sizeof one);
}

void ComputeThread::run(const std::function<void()>& job, const std::function<void(int)>& wait) {
  if (done_fd_ < 0) {
    job();
    return;
  }
  {
    std::lock_guard lock(mu_);
    job_ = &job;
  }
  cv_.notify_all();
  wait(done_fd_);
  // `wait` returned when the job signalled: consume the signal (blocking until it came, should `wait` have
  // returned early) and make sure the job is no longer referenced.
  uint64_t count = 0;
  while (::read(done_fd_, &count, sizeof count) < 0) {
  }
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return job_ == nullptr; });
}

void ComputeThread::loop() {
  if (on_start_) on_start_();
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || job_ != nullptr; });
    if (job_ == nullptr) return;  // stopping, nothing left to run
    const std::function<void()>* job = job_;
    lock.unlock();
    (*job)();
    lock.lock();
    job_ = nullptr;
    cv_.notify_all();
    const uint64_t one = 1;
    (void)!::write(done_fd_, &one, sizeof one);
  }
}

}  // namespace crescent
