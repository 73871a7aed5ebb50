// Shared by the transfer tests: deterministic byte patterns, checksums, transport parameter sets, and a
// peer engine in another process (tests/transfer/transfer_peer.cpp) driven over pipes.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "test_support/temp_dir.h"
#include "transfer/transfer_engine.h"

namespace crescent::transfer::test {

/// Fills `length` bytes at `data` with the pattern of `seed`: byte i of the pattern depends on (seed, i),
/// so any sub-range can be checked independently.
inline void fill_pattern(std::byte* data, size_t length, uint64_t seed, uint64_t first_index = 0) {
  auto word = [seed](uint64_t w) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + w;
    x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
    return x ^ (x >> 29);
  };
  size_t i = 0;
  for (; i < length && (first_index + i) % 8 != 0; ++i) {  // up to the first whole word
    data[i] = static_cast<std::byte>(word((first_index + i) / 8) >> (8 * ((first_index + i) % 8)));
  }
  for (; i + 8 <= length; i += 8) {  // whole words (little-endian byte order, as the loop above)
    const uint64_t x = word((first_index + i) / 8);
    std::memcpy(data + i, &x, 8);
  }
  for (; i < length; ++i) {
    data[i] = static_cast<std::byte>(word((first_index + i) / 8) >> (8 * ((first_index + i) % 8)));
  }
}

/// XXH3-64 of [data, data + length).
inline uint64_t checksum(const void* data, size_t length) {
  return XXH3_64bits(data, length);
}

/// One transport configuration the correctness tests run over.
struct TransportCase {
  std::string label;  // gtest-friendly name
  TransportKind kind;
  std::string ucx_tls;  // for kUcx
};

inline std::vector<TransportCase> all_transport_cases() {
  return {{"tcp", TransportKind::kTcp, ""},
          {"shm", TransportKind::kShm, ""},
          {"ucx_tcp", TransportKind::kUcx, "tcp"},
          {"ucx_shm", TransportKind::kUcx, "posix,sysv,cma,self"}};
}

/// A transfer_peer process: an engine serving one segment filled with fill_pattern(seed), controlled by
/// line commands on its stdin ("checksum OFFSET LENGTH" -> hex XXH3 line; "quit").
class PeerProcess {
 public:
  PeerProcess() = default;
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  ~PeerProcess() { kill_now(); }

  /// Starts the peer and waits for its "ready" line. Returns false (with `error`) on failure.
  bool start(const std::string& metadata_dir, const std::string& engine, const std::string& segment,
             uint64_t segment_bytes, uint64_t seed, const TransportCase& transport, std::string* error) {
    int to_child[2];
    int from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
      *error = "pipe failed";
      return false;
    }
    const std::vector<std::string> args = {TRANSFER_PEER_BINARY,
                                           "--metadata-dir",
                                           metadata_dir,
                                           "--engine",
                                           engine,
                                           "--segment",
                                           segment,
                                           "--bytes",
                                           std::to_string(segment_bytes),
                                           "--seed",
                                           std::to_string(seed),
                                           "--transport",
                                           std::string(transport_name(transport.kind)),
                                           "--ucx-tls",
                                           transport.ucx_tls};
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(to_child[0], 0);
      ::dup2(from_child[1], 1);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    in_ = ::fdopen(to_child[1], "w");
    out_ = ::fdopen(from_child[0], "r");
    const std::string line = read_line();
    if (line != "ready") {
      *error = "peer did not start: '" + line + "'";
      return false;
    }
    return true;
  }

  /// XXH3 of the peer's segment bytes [offset, offset + length).
  uint64_t remote_checksum(uint64_t offset, uint64_t length) {
    std::fprintf(in_, "checksum %llu %llu\n", static_cast<unsigned long long>(offset),
                 static_cast<unsigned long long>(length));
    std::fflush(in_);
    return std::stoull(read_line(), nullptr, 16);
  }

  pid_t pid() const { return pid_; }

  /// SIGKILLs the peer and reaps it.
  void kill_now() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (in_) std::fclose(in_);
    if (out_) std::fclose(out_);
    in_ = out_ = nullptr;
  }

 private:
  std::string read_line() {
    char buffer[256];
    if (out_ == nullptr || std::fgets(buffer, sizeof(buffer), out_) == nullptr) return "<eof>";
    std::string line(buffer);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    return line;
  }

  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

/// A fresh directory for a test, removed when destroyed.
using crescent::test::TempDir;  // tests/test_support/temp_dir.h

}  // namespace crescent::transfer::test
