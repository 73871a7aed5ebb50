// What this process has used so far, for benchmarks and end-of-run reports (getrusage).
#pragma once

namespace crescent {

/// CPU seconds (user + system) this process has used, all its threads together.
double process_cpu_seconds();

/// Minor page faults this process has taken so far (pages the kernel mapped in without I/O: fresh memory
/// touched for the first time, mostly), all its threads together.
long process_minor_page_faults();

/// This process's peak resident memory so far, in MiB.
double peak_rss_mib();

}  // namespace crescent
