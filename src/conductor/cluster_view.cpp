#include "conductor/cluster_view.h"

#include <atomic>

namespace crescent::conductor {

uint64_t PrefillChangeLog::next_source() {
  static std::atomic<uint64_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
}

}  // namespace crescent::conductor
