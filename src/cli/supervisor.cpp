#include "cli/supervisor.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace crescent::cli {

Supervisor::Supervisor(std::string run_dir, bool restart, RestartLimit limit,
                       std::function<void(const std::string&)> on_give_up)
    : run_dir_(std::move(run_dir)), restart_(restart), limit_(limit), on_give_up_(std::move(on_give_up)) {}

Supervisor::~Supervisor() {
  stop_all();
}

Result<std::string> Supervisor::start(const std::string& name, std::vector<std::string> argv,
                                      const std::string& ready_text, std::chrono::milliseconds timeout,
                                      bool restartable) {
  auto child = std::make_unique<Child>();
  child->name = name;
  child->argv = std::move(argv);
  child->ready_text = ready_text;
  child->restartable = restartable;
  const std::string log = fmt::format("{}/{}.log", run_dir_, name);
  std::error_code ec;
  std::filesystem::remove(log, ec);  // a reused run directory: only this run's lines count
  auto process = ChildProcess::start(child->argv, log);
  if (!process.ok()) return process.status();
  child->process = std::move(*process);
  fmt::print(stderr, "crescent serve: started {} (pid {})\n", name, child->process->pid());
  auto line = child->process->wait_for_line(ready_text, timeout);
  echo_logs(*child);
  if (!line.ok()) return Status::unavailable(fmt::format("{}: {}", name, line.status().message()));
  std::lock_guard lock(mu_);
  children_.push_back(std::move(child));
  return line;
}

void Supervisor::watch() {
  watcher_ = std::thread([this] {
    // The thread lives until every child is stopped: children it restarted die with it (PR_SET_PDEATHSIG).
    while (!stopped_) {
      {
        std::lock_guard lock(mu_);
        if (!stopping_) {
          for (auto& child : children_) {
            echo_logs(*child);
            check(*child);
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

void Supervisor::check(Child& child) {
  if (child.given_up || child.process->running()) return;
  echo_logs(child);
  const auto now = std::chrono::steady_clock::now();
  while (!child.recent.empty() && now - child.recent.front() > limit_.window) child.recent.pop_front();
  // Exit 0 is a stop that was asked for (an instance drained after an operator's SIGTERM, a rolling
  // restart): restarted, but not counted toward the limit, which is for crashes.
  const bool asked = child.process->exited_cleanly();
  const auto window_s = std::chrono::duration_cast<std::chrono::seconds>(limit_.window).count();
  if (!restart_ || !child.restartable || (!asked && std::ssize(child.recent) >= limit_.restarts)) {
    fmt::print(stderr, "crescent serve: {} exited{}\n", child.name,
               !restart_ ? ""
               : !child.restartable
                   ? "; the others were given its address, so the run stops"
                   : fmt::format(" {} times within {} s; giving up", child.recent.size() + 1, window_s));
    child.given_up = true;
    on_give_up_(child.name);
    return;
  }
  ++child.restarts;
  if (asked) {
    fmt::print(stderr, "crescent serve: {} stopped (exit 0); restarting it ({} in all)\n", child.name,
               child.restarts);
  } else {
    child.recent.push_back(now);
    fmt::print(stderr, "crescent serve: {} exited; restarting it ({} within {} s, {} at most; {} in all)\n",
               child.name, child.recent.size(), window_s, limit_.restarts, child.restarts);
  }
  // Started from the watcher thread: the new child gets SIGKILL if this thread ends without stopping it.
  auto process = ChildProcess::start(child.argv, fmt::format("{}/{}.log", run_dir_, child.name));
  if (!process.ok()) {
    fmt::print(stderr, "crescent serve: cannot restart {}: {}\n", child.name, process.status().message());
    child.given_up = true;
    on_give_up_(child.name);
    return;
  }
  child.process = std::move(*process);
  fmt::print(stderr, "crescent serve: started {} (pid {})\n", child.name, child.process->pid());
}

void Supervisor::echo_logs(Child& child) {
  std::ifstream in(fmt::format("{}/{}.log", run_dir_, child.name), std::ios::binary);
  if (!in) return;
  in.seekg(static_cast<std::streamoff>(child.log_offset));
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a partial line: wait for its end
    child.log_offset += line.size() + 1;
    fmt::print(stderr, "[{}] {}\n", child.name, line);
  }
}

void Supervisor::stop_all(const std::string& drain_first, std::chrono::milliseconds drain_grace) {
  {
    // Children restarted by the watcher die with its thread: stop them all before it ends.
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (auto& child : children_) {
      if (child->name != drain_first) continue;
      child->process->stop(drain_grace, SIGTERM);
      echo_logs(*child);
    }
    for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
      // SIGINT: at once (SIGTERM would make an instance drain first, one child after another).
      (*it)->process->stop(std::chrono::seconds(2), SIGINT);
      echo_logs(**it);
    }
    children_.clear();
  }
  stopped_ = true;
  if (watcher_.joinable()) watcher_.join();
}

pid_t Supervisor::pid(const std::string& name) const {
  std::lock_guard lock(mu_);
  for (const auto& child : children_) {
    if (child->name == name) return child->process->pid();
  }
  return 0;
}

}  // namespace crescent::cli
