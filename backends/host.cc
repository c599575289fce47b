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

HostMemoryReturned::HostMemoryReturned() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_MMAP_MAX, 1 << 16);  // glibc's default
  mallopt(M_TRIM_THRESHOLD, 128 * 1024);
#endif
}

HostMemoryReturned::~HostMemoryReturned() {
#if defined(__GLIBC__)
  malloc_trim(0);
  KeepFreedHostMemory();
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
