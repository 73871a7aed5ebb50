// Transparent huge pages for the heap of a batch command that simulates (simulate, plan, experiment). A
// simulation keeps hundreds of MB of hash tables (each prefill instance's block cache, the Conductor's ready
// times and block index), grows them as blocks arrive and reads them at random. glibc's malloc asks the
// kernel for huge pages on the memory it takes (madvise MADV_HUGEPAGE, where the kernel's THP mode is
// "madvise") under its tunable glibc.malloc.hugetlb=1, which it reads only when a program
// starts: so such a command executes itself again, once, with the tunable set. A 150,000-request simulation
// at 512 + 512 instances took ~20% less time, the 1M-request one ~4% (docs/benchmarks.md, "Huge pages").
// Servers do not: a page fault in a huge-page region may compact memory first, a stall a router's request
// path should not take.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace crescent {

/// What GLIBC_TUNABLES should become for a heap of huge pages, given its value now (`tunables`, nullptr:
/// unset), the kernel's THP mode (`thp_mode`: "always", "madvise", "never"; empty: unknown) and the opt-out
/// variable CRESCENT_HUGE_PAGES (`opt_out`, nullptr: unset). The tunables given are kept,
/// glibc.malloc.hugetlb=1 added. Nothing (no change) when glibc.malloc.hugetlb is set already (the user's
/// choice, or this program's own second start), when `opt_out` is "0", or when THP is not "madvise": under
/// "always" the kernel gives huge pages unasked (and glibc's tunable does nothing), under "never" not at all.
std::optional<std::string> huge_page_tunables(const char* tunables, std::string_view thp_mode,
                                              const char* opt_out);

/// The kernel's THP mode: the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled ("always",
/// "madvise" or "never"); empty when it cannot be read.
std::string transparent_huge_page_mode();

/// Executes this program again (/proc/self/exe, the same `argv`, the same environment but GLIBC_TUNABLES)
/// when huge_page_tunables says to change GLIBC_TUNABLES; then it does not return. Returns when not, or when
/// that fails (the environment is then as it was): the process runs on with the heap it has. Call it first
/// thing in main, before any thread starts.
void reexec_with_huge_page_heap(char** argv);

}  // namespace crescent
