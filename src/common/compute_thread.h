// A thread of its own for long computations, so the thread that hands them over stays responsive: each
// run() executes a job there while the caller's `wait` serves its I/O (heartbeats, control messages, KV
// shipping) until the job is done. Used by the cpu executor's forward passes (docs/serving.md, "An
// instance that stays responsive").
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace crescent {

class ComputeThread {
 public:
  /// Starts the thread; `on_start` runs on it first (e.g. to set its OpenMP thread count).
  explicit ComputeThread(std::function<void()> on_start = {});
  /// Waits for a job under way, then stops the thread.
  ~ComputeThread();
  ComputeThread(const ComputeThread&) = delete;
  ComputeThread& operator=(const ComputeThread&) = delete;

  /// Runs `job` on the thread and `wait(done_fd)` on the caller's meanwhile. `done_fd` (an eventfd) becomes
  /// readable when the job has finished; `wait` must return then, not before (it may poll other descriptors
  /// beside it, and must not read it). Returns once both returned. One caller at a time.
  void run(const std::function<void()>& job, const std::function<void(int done_fd)>& wait);

  /// The eventfd run() hands to `wait` (-1 if it could not be created: run() then runs jobs inline).
  int done_fd() const { return done_fd_; }
  /// An eventfd the job makes readable with notify_progress() (a step of its work is done), for `wait` to
  /// poll beside done_fd and read (8 bytes) when it is. -1 if it could not be created.
  int progress_fd() const { return progress_fd_; }
  /// From the job: progress_fd becomes readable.
  void notify_progress();

 private:
  void loop();

  int done_fd_ = -1;
  int progress_fd_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void()>* job_ = nullptr;  // guarded by mu_
  bool stopping_ = false;                       // guarded by mu_
  std::function<void()> on_start_;
  std::thread thread_;
};

}  // namespace crescent
