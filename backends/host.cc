#include "backends/host.h"

#include <malloc.h>
#include <sched.h>

#include <algorithm>
#include <climits>

#include <ATen/Parallel.h>

namespace coverage::backends {

void KeepFreedHostMemory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_MAX, 0);                // large blocks come from the heap...
  mallopt(M_TRIM_THRESHOLD, INT_MAX);    // ...and stay mapped after free
#endif
}

int AvailableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
}

void SetIntraOpThreads(int threads) { at::set_num_threads(threads <= 0 ? AvailableCores() : threads); }

int IntraOpThreads() { return at::get_num_threads(); }

}  // namespace coverage::backends
