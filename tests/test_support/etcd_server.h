// A real etcd for the tests that need one (Debian package etcd-server): a single-member cluster started from
// /usr/bin/etcd on free loopback ports, plus the two socket helpers it is built on. Shared by the etcd
// client and etcd metadata tests.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_support/temp_dir.h"

namespace crescent::test {

/// `count` distinct ports on 127.0.0.1 that are free right now: bound to port 0 together, then released for
/// the caller to use. Adds a test failure when a port cannot be bound.
inline std::vector<int> free_ports(int count) {
  std::vector<int> fds;
  std::vector<int> ports;
  for (int i = 0; i < count; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot bind a port on 127.0.0.1: " << std::strerror(errno);
    }
    fds.push_back(fd);
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) close(fd);
  return ports;
}

/// One HTTP/1.0 request to 127.0.0.1:`port` with a JSON `body` (2 s send and receive timeouts): the
/// response body, or "" when the server cannot be reached. Independent of any HTTP code under test.
inline std::string http_request(int port, const std::string& method, const std::string& path,
                                const std::string& body) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval timeout{.tv_sec = 2, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    std::string request = method + " " + path +
                          " HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) response.append(buffer, n);
    }
  }
  close(fd);
  size_t body_start = response.find("\r\n\r\n");
  return body_start == std::string::npos ? "" : response.substr(body_start + 4);
}

/// A single-member etcd cluster listening on free ports of 127.0.0.1, its data and log in a private temporary
/// directory; the destructor kills its process group and removes the directory. Takes ~0.3 s to start: make
/// one per test suite (SetUpTestSuite) and give each test its own key prefix.
///
/// Its election timings (heartbeat 25 ms, election timeout 250 ms) also lower etcd's minimum lease TTL from
/// 2 s to 1 s.
class EtcdServer {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";

  /// Starts etcd and waits up to 10 s for its /health, up to 3 times (another process may take a port
  /// between free_ports and etcd's bind; etcd then exits). Check skip_reason() and error() before use.
  EtcdServer() : dir_("crescent-etcd-test") {
    if (access(kBinary, X_OK) != 0) {
      skip_reason_ = std::string(kBinary) + " is not installed (Debian package etcd-server)";
      return;
    }
    if (dir_.path().empty()) {
      error_ = "cannot create a temporary directory for etcd";
      return;
    }
    for (int attempt = 0; attempt < 3 && pid_ < 0; ++attempt) start();
    if (pid_ < 0) {
      std::ifstream log(dir_.file("etcd.log"));
      std::stringstream text;
      text << log.rdbuf();
      error_ = "etcd did not come up within 10 s; its log:\n" + text.str();
    }
  }

  ~EtcdServer() {
    if (pid_ > 0) {
      kill(-pid_, SIGKILL);  // its process group: etcd and anything it started
      waitpid(pid_, nullptr, 0);
    }
  }

  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  /// Non-empty when etcd is not installed: the tests should GTEST_SKIP with it.
  const std::string& skip_reason() const { return skip_reason_; }
  /// Non-empty when etcd did not come up: says so, with etcd's log.
  const std::string& error() const { return error_; }
  /// etcd's client port on 127.0.0.1 (meaningless unless both strings above are empty).
  int client_port() const { return client_port_; }
  /// etcd's client URL, "http://127.0.0.1:PORT".
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(client_port_); }

 private:
  void start() {
    std::vector<int> ports = free_ports(2);
    client_port_ = ports[0];
    const std::string client_url = "http://127.0.0.1:" + std::to_string(ports[0]);
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(ports[1]);
    const std::string data_dir = dir_.file("data");
    const std::string log_path = dir_.file("etcd.log");
    std::filesystem::remove_all(data_dir);
    // Built before fork: the child only calls async-signal-safe functions.
    // A single-member cluster elects itself in ~0.3 s with these timings instead of ~0.7 s with the
    // defaults; they also lower etcd's minimum lease TTL from 2 s to 1 s.
    std::vector<std::string> args = {
        kBinary,
        "--name=test",
        "--data-dir=" + data_dir,
        "--listen-client-urls=" + client_url,
        "--advertise-client-urls=" + client_url,
        "--listen-peer-urls=" + peer_url,
        "--initial-advertise-peer-urls=" + peer_url,
        "--initial-cluster=test=" + peer_url,
        "--heartbeat-interval=25",
        "--election-timeout=250",
        "--logger=zap",
        "--log-level=warn",
    };
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphaned etcd if the test binary crashes
      int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
      execv(kBinary, argv.data());
      _exit(127);
    }
    if (pid < 0) return;
    setpgid(pid, pid);  // also here: kill(-pid) must work even if the child has not run yet
    bool up = false;
    for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
         std::chrono::steady_clock::now() < deadline;
         std::this_thread::sleep_for(std::chrono::milliseconds(50))) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) break;  // exited: port taken?
      if (http_request(client_port_, "GET", "/health", "").find("\"true\"") != std::string::npos) {
        up = true;
        break;
      }
    }
    if (up && waitpid(pid, nullptr, WNOHANG) == 0) {
      pid_ = pid;
      return;
    }
    kill(-pid, SIGKILL);
    waitpid(pid, nullptr, 0);  // also reaps a child that exited on its own (then ECHILD, harmless)
  }

  TempDir dir_;  // declared first: removed after etcd is killed
  std::string skip_reason_;
  std::string error_;
  pid_t pid_ = -1;
  int client_port_ = 0;
};

}  // namespace crescent::test
