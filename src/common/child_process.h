// A child process for benches and tests that start servers (redis-server, crescent store roles): stdout and
// stderr go to a log file, it dies with the thread that started it (PR_SET_PDEATHSIG), and it is stopped
// (SIGTERM, then SIGKILL) and reaped when the handle goes.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace crescent {

class ChildProcess {
 public:
  /// Starts argv[0] (a path) with `argv`, stdin from /dev/null, stdout and stderr appended to `log_path`.
  /// Start it from a thread that outlives it: the child gets SIGKILL when that thread exits. kInvalidArgument
  /// for an empty argv; kIoError when the log cannot be opened or fork fails (an exec failure shows as exit
  /// status 127).
  static Result<std::unique_ptr<ChildProcess>> start(const std::vector<std::string>& argv,
                                                     const std::string& log_path);
  /// stop(2 s) unless already reaped.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

  /// Whether the child has not exited yet (reaps it when it has).
  bool running();
  /// Whether it was reaped after exiting with status 0 (not killed by a signal).
  bool exited_cleanly() const { return reaped_ && WIFEXITED(wait_status_) && WEXITSTATUS(wait_status_) == 0; }
  /// Waits until a line of the log contains `text` and returns that line. kUnavailable when the child exits
  /// first or `timeout` passes (the message ends with the log's last lines).
  Result<std::string> wait_for_line(const std::string& text, std::chrono::milliseconds timeout);
  /// `signal` (SIGTERM), then SIGKILL after `grace`; reaps it.
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(2), int signal = SIGTERM);
  /// SIGKILL at once (a crash, for fault tests); reaps it.
  void kill();
  /// The last `max_bytes` of the log.
  std::string log_tail(size_t max_bytes = 800) const;

 private:
  ChildProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::string log_path_;
  bool reaped_ = false;
  int wait_status_ = 0;  // waitpid's, once reaped
};

/// A scope in which SIGPIPE is ignored: a write to a peer or child that died fails with EPIPE instead of
/// killing the process. Restores the previous handler when it ends.
class IgnoreSigpipe {
 public:
  IgnoreSigpipe() : previous_(::signal(SIGPIPE, SIG_IGN)) {}
  ~IgnoreSigpipe() { ::signal(SIGPIPE, previous_); }
  IgnoreSigpipe(const IgnoreSigpipe&) = delete;
  IgnoreSigpipe& operator=(const IgnoreSigpipe&) = delete;

 private:
  sighandler_t previous_;
};

}  // namespace crescent
