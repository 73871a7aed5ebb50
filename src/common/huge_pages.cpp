#include "common/huge_pages.h"

#include <gnu/libc-version.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace crescent {
namespace {

bool glibc_has_hugetlb_tunable() {
  int major = 0, minor = 0;
  if (std::sscanf(gnu_get_libc_version(), "%d.%d", &major, &minor) != 2) return false;
  return major > 2 || (major == 2 && minor >= 35);
}

// Whether the kernel started this program through its program interpreter (AT_BASE is where it loaded the
// dynamic loader). Under `ld.so crescent ...` the kernel started the loader itself as the program, and
// AT_BASE is 0 (as it is for a static program, which this is not).
bool kernel_started_this_program() { return getauxval(AT_BASE) != 0; }

}  // namespace

std::optional<std::string> huge_page_tunables(const char* tunables, std::string_view thp_mode,
                                              const char* opt_out) {
  if (opt_out != nullptr && std::string_view(opt_out) == "0") return std::nullopt;
  if (thp_mode != "madvise") return std::nullopt;
  const std::string_view given = tunables != nullptr ? tunables : "";
  // Tunables are name=value pairs separated by ':'.
  for (size_t start = 0; start <= given.size();) {
    const size_t end = std::min(given.find(':', start), given.size());
    if (given.substr(start, end - start).starts_with("glibc.malloc.hugetlb=")) return std::nullopt;
    start = end + 1;
  }
  std::string out(given);
  if (!out.empty()) out += ':';
  out += "glibc.malloc.hugetlb=1";
  return out;
}

std::string transparent_huge_page_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return "";
  const size_t open = line.find('[');
  const size_t close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return line.substr(open + 1, close - open - 1);
}

void reexec_with_huge_page_heap(char** argv) {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  const std::optional<std::string> wanted =
      huge_page_tunables(tunables, transparent_huge_page_mode(), std::getenv("CRESCENT_HUGE_PAGES"));
  if (!wanted || getauxval(AT_SECURE) != 0 || !glibc_has_hugetlb_tunable()) return;
  if (const char* preload = std::getenv("LD_PRELOAD"); preload != nullptr && *preload != '\0') return;
  if (!kernel_started_this_program()) return;
  std::error_code error;
  const std::filesystem::path program = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error || !program.is_absolute()) return;
  const std::optional<std::string> before =
      tunables != nullptr ? std::optional<std::string>(tunables) : std::nullopt;
  if (setenv("GLIBC_TUNABLES", wanted->c_str(), 1) != 0) return;
  execv(program.c_str(), argv);
  // Not executed (the file is gone, say): run on as we are, with the environment we were given.
  if (before) {
    setenv("GLIBC_TUNABLES", before->c_str(), 1);
  } else {
    unsetenv("GLIBC_TUNABLES");
  }
}

}  // namespace crescent
