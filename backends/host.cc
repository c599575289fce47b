#include "backends/host.h"

#include <malloc.h>
#include <sched.h>

#include <climits>

#include <ATen/Parallel.h>

namespace coverage::backends {

void KeepFreedHostMemory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_MAX, 0);                // large blocks come from the heap...
  mallopt(M_TRIM_THRESHOLD, INT_MAX);    // ...and stay mapped after free
#endif
}

void SetIntraOpThreads(int threads) {
  if (threads <= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    threads = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  }
  at::set_num_threads(threads);
}

int IntraOpThreads() { return at::get_num_threads(); }

}  // namespace coverage::backends
