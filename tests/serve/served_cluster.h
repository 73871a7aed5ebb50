// A `crescent serve` run as a user starts it, for end-to-end tests: its own run directory, the HTTP port it
// printed, its log, its children's pids, and its /metrics.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/child_process.h"
#include "test_support/metrics.h"
#include "test_support/temp_dir.h"

namespace crescent {

// A `crescent serve` run with its own run directory; stopped (with its children) at the end.
class ServedCluster {
 public:
  /// `crescent serve --port 0 --run-dir DIR` and `extra_args`.
  explicit ServedCluster(const std::vector<std::string>& extra_args = {}) {
    std::vector<std::string> argv{CRESCENT_BINARY, "serve", "--port", "0", "--run-dir", dir_.file("run")};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    process_ = ChildProcess::start(argv, dir_.file("serve.log")).value();
    auto line = process_->wait_for_line("crescent serve: model", std::chrono::seconds(60));
    if (!line.ok()) {
      ADD_FAILURE() << line.status().message();
      return;
    }
    std::smatch m;
    if (std::regex_search(*line, m, std::regex(R"(http://127\.0\.0\.1:(\d+))"))) port_ = std::stoi(m[1]);
  }
  // SIGINT, as Ctrl-C: everything stops at once (SIGTERM would first let the Conductor finish its streams).
  ~ServedCluster() { process_->stop(std::chrono::seconds(10), SIGINT); }

  /// Stops `crescent serve` with `signal`, SIGKILL after `grace`; whether it then exited with status 0.
  bool stop(std::chrono::milliseconds grace, int signal) {
    process_->stop(grace, signal);
    return process_->exited_cleanly();
  }

  int port() const { return port_; }
  /// Its run directory (children's logs, the cluster secret).
  std::string run_dir() const { return dir_.file("run"); }
  std::string log() const {
    std::ifstream in(process_->log_path());
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  /// The pid of child `name` as last started.
  pid_t pid(const std::string& name) const {
    const std::string text = log();
    const std::regex started("started " + name + R"( \(pid (\d+)\))");
    pid_t pid = 0;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), started); it != std::sregex_iterator();
         ++it) {
      pid = std::stoi((*it)[1]);
    }
    return pid;
  }
  /// Waits until the log holds `count` lines containing `text`.
  bool wait_for_count(const std::string& text, size_t count, std::chrono::seconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string l = log();
      size_t n = 0;
      for (size_t at = l.find(text); at != std::string::npos; at = l.find(text, at + 1)) ++n;
      if (n >= count) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  /// The value of the metric line starting with `name_and_labels` in /metrics (-1 when absent).
  double metric(const std::string& name_and_labels) const {
    return test::scrape_metric(port_, name_and_labels);
  }
  /// metric(`name_and_labels`) once `ready` holds for it (polled every 10 ms), or its last value after
  /// `deadline`: for counters reported after the answer a test has already seen.
  double metric_when(const std::string& name_and_labels, const std::function<bool(double)>& ready,
                     std::chrono::milliseconds deadline = std::chrono::seconds(2)) const {
    const auto until = std::chrono::steady_clock::now() + deadline;
    double value = metric(name_and_labels);
    while (!ready(value) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      value = metric(name_and_labels);
    }
    return value;
  }

 private:
  test::TempDir dir_;
  std::unique_ptr<ChildProcess> process_;
  int port_ = 0;
};

}  // namespace crescent
