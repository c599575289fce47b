// Host set-up for replay: threads and the allocator. Call once at start-up,
// before other threads start; the app and the benchmarks do, libraries never.
//
// SetIntraOpThreads: ATen's intra-op thread count (0 = one per core the
// process may run on), which is also the count of the project's own
// at::parallel_for loops: both use the OpenMP runtime libtorch ships with
// (Note [One OpenMP runtime] in CMakeLists.txt).
//
// KeepFreedHostMemory: allocator tuning for replay. Replaying a case allocates large tensors
// (inputs, goldens, outputs) again and again. glibc serves blocks over its
// mmap threshold (at most 32 MiB) with fresh mmaps and unmaps them on free,
// so every large allocation page-faults and zeroes its memory anew: on the
// bundled registry that was about half the wall time (bench/README.md).
// KeepFreedHostMemory() makes glibc serve them from the heap and keep up to
// 2 GiB of freed memory mapped for reuse.
//
#pragma once

namespace coverage::backends {

void KeepFreedHostMemory();
void SetIntraOpThreads(int threads);
// The cores this process may run on (its CPU affinity); at least 1.
int AvailableCores();
int IntraOpThreads();

}  // namespace coverage::backends
