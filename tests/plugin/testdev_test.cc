// A third-party PrivateUse1 plugin that renames its device and keeps its
// kernels in a dependent library (tests/support/plugin/testdev.cc), loaded
// the way `--backend privateuse1:<path>` loads any plugin. Its own process:
// one PrivateUse1 backend per process.
#include <stdlib.h>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <gtest/gtest.h>

#include "backends/backend.h"
#include "backends/plugin_backend.h"
#include "replay/replay.h"
#include "tests/support/case_builder.h"

namespace coverage::backends {
using namespace coverage::replay;  // replay/'s names, unqualified in these tests
namespace {

const char* const kPlugin = COVERAGE_TESTDEV_PLUGIN;

// Configured as the project ships sim (configs/sim.json: bf16 matmul numerics).
std::shared_ptr<Backend> Testdev() {
  setenv("COVERAGE_SIM_CONFIG", COVERAGE_SOURCE_DIR "/configs/sim.json", 1);
  const std::string path = kPlugin;
  auto backend = LoadPluginBackend("privateuse1:" + path, path);
  if (!backend.has_value()) {
    ADD_FAILURE() << backend.error().message();
    return nullptr;
  }
  return *backend;
}

TEST(ThirdPartyPlugin, RenamesItsDeviceAndTheHarnessUsesThatName) {
  auto backend = Testdev();
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(c10::get_privateuse1_backend(), "testdev");
  EXPECT_EQ(backend->device().str(), "testdev:0");
  EXPECT_EQ(c10::Device("testdev:0"), backend->device());
  EXPECT_TRUE(at::isPrivateUse1HooksRegistered());
  EXPECT_EQ(at::getAccelerator(), c10::DeviceType::PrivateUse1);
  at::Tensor t = at::ones({2, 3}).to(backend->device());
  EXPECT_EQ(t.device().str(), "testdev:0");
}

TEST(ThirdPartyPlugin, ItsOwnVersionAndTheKernelLibrarysHooksAreFound) {
  auto backend = Testdev();
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->Version(), "testdev 0.1 (kernels in libcoverage_testdev_kernels.so)");
  EXPECT_TRUE(backend->Counters().count("allocations")) << "counters come from the dependent library";
}

TEST(ThirdPartyPlugin, RunsOpCasesAgainstTheCpuReference) {
  auto backend = Testdev();
  ASSERT_NE(backend, nullptr);
  ReplayExecutor executor(backend, ReplayOptions{});
  // Its numerics round fp32 matmul operands to bf16: elementwise work is exact, a 512-deep fp32 mm misses fp32 tolerance.
  CaseResult add = executor.Run(testing::AddCase({64, 32}));
  EXPECT_EQ(add.outcome, Outcome::kPass) << add.error;
  CaseResult bf16 = executor.Run(testing::MmCase(16, 512, 8, DType::kBFloat16));
  EXPECT_EQ(bf16.outcome, Outcome::kPass) << bf16.error;
  CaseResult fp32 = executor.Run(testing::MmCase(16, 512, 8));
  EXPECT_EQ(fp32.outcome, Outcome::kMismatch) << fp32.error;
}

}  // namespace
}  // namespace coverage::backends
