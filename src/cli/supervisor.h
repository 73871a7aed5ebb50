// The children `crescent serve` runs (store master and node, prefill and decode instances): each is this
// binary in another role, logging to RUN_DIR/NAME.log; their lines are echoed to stderr as "[NAME] line",
// and one that dies is reported and restarted (or, without restarts, the run is stopped).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/child_process.h"
#include "common/status.h"

namespace crescent::cli {

/// How often one child may be restarted: at most `restarts` times within any `window` (a child that dies
/// now and then over a long run is restarted every time; one that keeps dying is given up).
struct RestartLimit {
  int restarts = 5;
  std::chrono::steady_clock::duration window = std::chrono::minutes(1);
};

class Supervisor {
 public:
  /// Logs go to `run_dir` (which must exist). `restart`: restart a child that dies, within `limit`;
  /// otherwise, and when a child dies past its limit, `on_give_up(name)` is called.
  Supervisor(std::string run_dir, bool restart, RestartLimit limit,
             std::function<void(const std::string&)> on_give_up);
  /// stop_all().
  ~Supervisor();

  /// Starts child `name` with `argv` (its log started afresh) and waits until the log has a line containing
  /// `ready_text` (up to `timeout`); returns that line. kUnavailable with the log's tail when it exits or
  /// times out first. `restartable` false: its death stops the run even when restarts are on (a child whose
  /// address the others were given, like the store master).
  Result<std::string> start(const std::string& name, std::vector<std::string> argv,
                            const std::string& ready_text, std::chrono::milliseconds timeout,
                            bool restartable = true);
  /// Starts watching: echoing logs and restarting children that die.
  void watch();
  /// Stops watching, then stops the children in reverse start order (SIGINT, which every role takes as
  /// "stop now" where SIGTERM drains an instance; SIGKILL after 2 s). `drain_first`: that child is sent
  /// SIGTERM before any other stops and given `drain_grace` to exit (a Conductor draining its front end,
  /// whose streams need the instances still up); SIGKILL after that.
  void stop_all(const std::string& drain_first = "", std::chrono::milliseconds drain_grace = {});
  /// The pid of child `name` (0 when unknown), for fault tests and operators.
  pid_t pid(const std::string& name) const;

 private:
  struct Child {
    std::string name;
    std::vector<std::string> argv;
    std::unique_ptr<ChildProcess> process;
    std::string ready_text;
    uint64_t log_offset = 0;
    int restarts = 0;                                          // in all
    std::deque<std::chrono::steady_clock::time_point> recent;  // restarts within the limit's window
    bool restartable = true;
    bool given_up = false;
  };
  void echo_logs(Child& child);
  void check(Child& child);

  const std::string run_dir_;
  const bool restart_;
  const RestartLimit limit_;
  const std::function<void(const std::string&)> on_give_up_;
  mutable std::mutex mu_;  // children_
  std::vector<std::unique_ptr<Child>> children_;
  std::atomic<bool> stopping_{false};  // no more restarts
  std::atomic<bool> stopped_{false};   // every child stopped: the watcher may end (children die with it)
  std::thread watcher_;
};

}  // namespace crescent::cli
