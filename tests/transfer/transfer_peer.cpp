// A transfer engine in its own process for the two-process tests: serves one segment (from
// allocate_memory) filled with fill_pattern(seed) and answers "checksum OFFSET LENGTH" lines on stdin with
// the XXH3 of those segment bytes, so the test checks what actually landed in this process.
#include <sys/prctl.h>

#include <csignal>
#include <iostream>
#include <string>

#include "test_util.h"

using namespace crescent::transfer;

int main(int argc, char** argv) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
  std::string metadata_dir, engine_name, segment, transport = "tcp", ucx_tls;
  uint64_t bytes = 0, seed = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--metadata-dir")
      metadata_dir = value;
    else if (flag == "--engine")
      engine_name = value;
    else if (flag == "--segment")
      segment = value;
    else if (flag == "--bytes")
      bytes = std::stoull(value);
    else if (flag == "--seed")
      seed = std::stoull(value);
    else if (flag == "--transport")
      transport = value;
    else if (flag == "--ucx-tls")
      ucx_tls = value;
  }
  auto fail = [](const crescent::Status& s) {
    std::cout << "error: " << s.to_string() << std::endl;
    return 1;
  };
  auto metadata = make_directory_metadata(metadata_dir);
  if (!metadata.ok()) return fail(metadata.status());
  auto kind = parse_transport(transport);
  if (!kind.ok()) return fail(kind.status());
  EngineOptions options{.name = engine_name, .metadata = *metadata, .transports = {*kind}};
  options.ucx.tls = ucx_tls;
  auto engine = TransferEngine::create(options);
  if (!engine.ok()) return fail(engine.status());
  auto memory = (*engine)->allocate_memory(bytes);
  if (!memory.ok()) return fail(memory.status());
  auto* data = static_cast<std::byte*>(*memory);
  test::fill_pattern(data, bytes, seed);
  if (auto s = (*engine)->expose_segment(segment, data, bytes); !s.ok()) return fail(s);
  std::cout << "ready" << std::endl;
  std::string command;
  while (std::cin >> command) {
    if (command == "checksum") {
      uint64_t offset = 0, length = 0;
      std::cin >> offset >> length;
      if (offset > bytes || length > bytes - offset) {
        std::cout << "0" << std::endl;
        continue;
      }
      std::cout << std::hex << test::checksum(data + offset, length) << std::dec << std::endl;
    } else if (command == "quit") {
      break;
    }
  }
  return 0;
}
