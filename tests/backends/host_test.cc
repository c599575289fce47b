// --threads: ATen's intra-op pool and the project's own parallel loops are
// one OpenMP runtime (Note [One OpenMP runtime] in CMakeLists.txt), so the
// count SetIntraOpThreads sets is the count both run with.
#include <omp.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "backends/host.h"

namespace coverage::backends {
namespace {

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * 4096;
}

// Resident memory after a 256 MiB tensor (every page touched) is freed.
int64_t ResidentAfterFreeing() {
  {
    at::Tensor t = at::ones({64, 1024, 1024});
    EXPECT_GT(ResidentBytes(), int64_t{256} << 20);
  }
  return ResidentBytes();
}

// A model stage's scope gives freed memory back; the rest of the process
// keeps it for reuse (backends/host.h).
TEST(HostMemory, AModelStagesScopeGivesFreedMemoryBack) {
#if defined(__SANITIZE_ADDRESS__)
  // ASan's allocator, not glibc's, holds freed blocks (its quarantine): what
  // this test measures is the plain build's (Note [Sanitizers] in CMakeLists.txt).
  GTEST_SKIP() << "glibc's malloc settings do not apply under AddressSanitizer";
#endif
  KeepFreedHostMemory();
  const int64_t before = ResidentBytes();
  {
    const HostMemoryReturned returned;
    EXPECT_LT(ResidentAfterFreeing() - before, int64_t{64} << 20);
  }
  // Outside it, the freed block stays mapped (the unit stage's speed).
  EXPECT_GT(ResidentAfterFreeing() - before, int64_t{200} << 20);
}

// Distinct OS threads that ran a body of at::parallel_for in this file's
// code (compiled here with -fopenmp, so the region is this binary's).
size_t ThreadsUsedByParallelFor() {
  std::mutex mu;
  std::set<std::thread::id> ids;
  at::parallel_for(0, 64, 1, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // every thread gets a chunk
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  return ids.size();
}

TEST(Threads, OneOpenMpRuntimeIsLoadedTheOneLibtorchShipsWith) {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> gomp;
  std::string torch_dir;
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.find("libgomp") != std::string::npos) gomp.insert(path);
    if (path.find("libtorch_cpu.so") != std::string::npos) torch_dir = std::filesystem::path(path).parent_path();
  }
  ASSERT_EQ(gomp.size(), 1u) << "more than one libgomp mapped: two OpenMP thread pools";
  ASSERT_FALSE(torch_dir.empty());
  // A libtorch that ships its runtime (the wheel's torch/lib/libgomp.so.1)
  // must be the one that serves the whole process.
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(torch_dir, ec)) {
    if (entry.path().filename().string().rfind("libgomp", 0) == 0) {
      EXPECT_EQ(std::filesystem::path(*gomp.begin()).parent_path(), std::filesystem::path(torch_dir))
          << *gomp.begin() << " serves OpenMP, not the runtime beside libtorch in " << torch_dir;
    }
  }
}

TEST(Threads, SetIntraOpThreadsControlsAtenAndOurParallelLoops) {
  SetIntraOpThreads(1);
  EXPECT_EQ(IntraOpThreads(), 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_EQ(omp_get_max_threads(), 1) << "our OpenMP runtime is not ATen's";
  EXPECT_EQ(ThreadsUsedByParallelFor(), 1u);

  SetIntraOpThreads(2);
  EXPECT_EQ(at::get_num_threads(), 2);
  EXPECT_EQ(omp_get_max_threads(), 2) << "our OpenMP runtime is not ATen's";
  EXPECT_EQ(ThreadsUsedByParallelFor(), 2u);

  SetIntraOpThreads(0);  // one per available core
  EXPECT_GE(at::get_num_threads(), 1);
}

}  // namespace
}  // namespace coverage::backends
