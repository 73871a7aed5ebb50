#include "common/process_usage.h"

#include <sys/resource.h>

namespace crescent {
namespace {

rusage self_usage() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage;
}

double seconds(const timeval& t) {
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
}

}  // namespace

double process_cpu_seconds() {
  const rusage usage = self_usage();
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

long process_minor_page_faults() {
  return self_usage().ru_minflt;
}

double peak_rss_mib() {
  return static_cast<double>(self_usage().ru_maxrss) / 1024;  // ru_maxrss is in KiB on Linux
}

}  // namespace crescent
