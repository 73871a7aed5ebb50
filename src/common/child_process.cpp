#include "common/child_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace crescent {

Result<std::unique_ptr<ChildProcess>> ChildProcess::start(const std::vector<std::string>& argv,
                                                          const std::string& log_path) {
  if (argv.empty()) return Status::invalid_argument("child process: empty argv");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (null_fd < 0 || log_fd < 0) {
    const int e = errno;
    if (null_fd >= 0) ::close(null_fd);
    if (log_fd >= 0) ::close(log_fd);
    return Status::io_error(fmt::format("child process log {}: {}", log_path, std::strerror(e)));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {  // child: async-signal-safe calls only
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    // The parent may block signals (crescent store roles sigwait); the child starts with none blocked.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(null_fd, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(null_fd);
  ::close(log_fd);
  if (pid < 0) return Status::io_error(fmt::format("fork for {}: {}", argv[0], std::strerror(fork_errno)));
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, log_path));
}

ChildProcess::~ChildProcess() {
  if (!reaped_) stop();
}

bool ChildProcess::running() {
  if (reaped_) return false;
  if (::waitpid(pid_, &wait_status_, WNOHANG) == pid_) reaped_ = true;
  return !reaped_;
}

Result<std::string> ChildProcess::wait_for_line(const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::ifstream in(log_path_);
    std::string line;
    while (std::getline(in, line)) {
      if (line.find(text) != std::string::npos) return line;
    }
    if (!running()) {
      return Status::unavailable(
          fmt::format("{} exited before printing '{}'; its log ends:\n{}", pid_, text, log_tail()));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::unavailable(fmt::format("process {} did not print '{}' within {} ms; its log ends:\n{}",
                                             pid_, text, timeout.count(), log_tail()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void ChildProcess::stop(std::chrono::milliseconds grace, int signal) {
  if (reaped_) return;
  ::kill(pid_, signal);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid_, &wait_status_, WNOHANG) == pid_) {
      reaped_ = true;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill();
}

void ChildProcess::kill() {
  if (reaped_) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, &wait_status_, 0);
  reaped_ = true;
}

std::string ChildProcess::log_tail(size_t max_bytes) const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  return s.size() > max_bytes ? s.substr(s.size() - max_bytes) : s;
}

}  // namespace crescent
