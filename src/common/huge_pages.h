// Transparent huge pages for the heap of a batch command that simulates (simulate, plan, experiment). A
// simulation keeps hundreds of MB of hash tables, engines and records and reads them at random: on 4 KiB
// pages nearly every such read misses the TLB, and every 4 KiB first touched is a page fault. glibc's malloc
// asks the kernel for huge pages on the memory it takes (madvise MADV_HUGEPAGE, where the kernel's THP mode
// is "madvise", Debian's default) under its tunable glibc.malloc.hugetlb=1, which it reads only when a
// program starts: so such a command executes itself again, once, with the tunable set. The 1M-request
// simulation at 512 + 512 instances ran in a median 0.9x the wall time, with ~45x fewer page faults
// (docs/benchmarks.md, "A cheaper decode choice, and huge pages by default"). Servers do not: a page fault
// in a huge-page region may compact memory first, a stall a request path should not take. Children of the
// second start (gnuplot for `plan`'s plot) inherit the tunable.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace crescent {

/// What GLIBC_TUNABLES should become for a heap of huge pages, given its value now (`tunables`, nullptr:
/// unset), the kernel's THP mode (`thp_mode`: "always", "madvise", "never"; empty: unknown) and the opt-out
/// variable CRESCENT_HUGE_PAGES (`opt_out`, nullptr: unset). The tunables given are kept, then ':' and
/// glibc.malloc.hugetlb=1. Nothing (no change) when glibc.malloc.hugetlb is set already (the user's choice,
/// or this program's own second start), when `opt_out` is "0", or when THP is not "madvise": under "always"
/// the kernel gives huge pages unasked (and glibc's tunable does nothing), under "never" not at all.
std::optional<std::string> huge_page_tunables(const char* tunables, std::string_view thp_mode,
                                              const char* opt_out);

/// The kernel's THP mode: the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled ("always",
/// "madvise" or "never"); empty when it cannot be read.
std::string transparent_huge_page_mode();

/// Executes this program again (the file /proc/self/exe names, so the process keeps its name; the same
/// `argv`, PID and environment but GLIBC_TUNABLES) when huge_page_tunables says to change GLIBC_TUNABLES;
/// then it does not return. Returns, changing nothing, when not, and also when:
///   - the process is in secure mode (setuid or setgid: glibc would drop the tunable, and the second start
///     would start a third);
///   - glibc is older than 2.35 (no such tunable);
///   - LD_PRELOAD is set (valgrind, a profiler or another malloc is in the process: a new start would leave
///     it behind, or the tunable would do nothing);
///   - the kernel did not start this program through its dynamic loader (AT_BASE is 0: it runs as
///     `ld.so crescent ...`, which a new start would not repeat).
/// When the exec fails, the environment is as it was and the process runs on with the heap it has. Call it
/// first thing in main, before crescent starts threads or writes anything. Libraries' constructors may have
/// started threads of their own (OpenBLAS's pool): the exec ends them, and their start-up runs again.
void reexec_with_huge_page_heap(char** argv);

}  // namespace crescent
