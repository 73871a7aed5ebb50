// Independent jobs spread over the machine's cores: `simulate --compare` runs one simulation per policy at
// once (docs/benchmarks.md "Simulator speed").
#pragma once

#include <cstddef>
#include <functional>

namespace crescent {

/// The threads parallel_for uses when asked for 0: the cores this process may run on (at least 1).
unsigned default_parallelism();

/// Calls body(i) once for each i in [0, count), on up to `threads` threads at once (0: default_parallelism();
/// the calling thread is one of them), each thread taking the next index as it becomes free; returns once
/// every call has returned. Calls must not depend on one another's order. An exception thrown by a call is
/// rethrown here after the others have finished (the first one, if several threw); indices not yet taken
/// are then not run. Fewer threads run when the system gives no more (at least the calling one).
void parallel_for(size_t count, unsigned threads, const std::function<void(size_t)>& body);

}  // namespace crescent
