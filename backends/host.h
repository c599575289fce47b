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
// HostMemoryReturned: the opposite, for a scope (a model-level stage, whose
// tensors are few and large): blocks of 1 MiB and more are mapped on their
// own and unmapped when freed, and the heap is trimmed when the scope ends,
// which restores KeepFreedHostMemory's settings. Kept freed memory
// fragments: a model stage's resident memory grew to 1.8x what it held on
// cpu (Qwen3-32B's 2 layers: 12.5 GB for 7.0 GB of tensors), past what the
// memory estimate and the worker's ceiling can trust (Note [Memory estimate]
// in replay/program_replay.cc).
//
#pragma once

namespace coverage::backends {

void KeepFreedHostMemory();

class HostMemoryReturned {
 public:
  HostMemoryReturned();
  ~HostMemoryReturned();
  HostMemoryReturned(const HostMemoryReturned&) = delete;
  HostMemoryReturned& operator=(const HostMemoryReturned&) = delete;
};
void SetIntraOpThreads(int threads);
// The cores this process may run on (its CPU affinity); at least 1.
int AvailableCores();
int IntraOpThreads();

}  // namespace coverage::backends
