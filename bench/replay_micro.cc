// Fixed per-case cost of replay, with Google Benchmark: one tiny op case
// (aten::add.Tensor on f32[16]) through the ReplayExecutor (reference +
// backend first call + warm calls + comparison, golden only on mismatch),
// next to the bare dispatcher calls the executor makes for it.
//
//   build/bin/bench_replay_micro [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>

#include "backends/backends.h"
#include "backends/host.h"
#include "replay/replay.h"

namespace {

using namespace coverage;

OpCase TinyAdd() {
  OpCase c;
  c.op = "aten::add";
  c.overload = "Tensor";
  for (const char* name : {"self", "other"}) {
    Argument a;
    a.name = name;
    a.kind = Argument::Kind::kTensor;
    a.tensor.dtype = DType::kFloat32;
    a.tensor.shape = {16};
    a.tensor.strides = {1};
    c.args.push_back(a);
  }
  Argument alpha;
  alpha.name = "alpha";
  alpha.kind = Argument::Kind::kInt;
  alpha.i = 1;
  c.args.push_back(alpha);
  return c;
}

// The harness: everything a unit-stage case does except the database write.
void BM_ReplayTinyCase(benchmark::State& state) {
  backends::BackendRegistry backends;
  backends::RegisterCpuBackend(backends);
  replay::ReplayOptions options;
  options.warm_iterations = static_cast<int>(state.range(0));
  replay::ReplayExecutor executor(*backends.Create("cpu"), options);
  const OpCase c = TinyAdd();
  for (auto _ : state) benchmark::DoNotOptimize(executor.Run(c));
}
BENCHMARK(BM_ReplayTinyCase)->Arg(0)->Arg(3)->Unit(benchmark::kMicrosecond);

// The op calls alone: reference + first + warm backend calls through the
// dispatcher on the same inputs (what "compute" counts for this case).
void BM_DispatcherCallsAlone(benchmark::State& state) {
  c10::InferenceMode guard;
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor");
  at::Tensor a = at::rand({16}), b = at::rand({16});
  const int calls = 2 + static_cast<int>(state.range(0));
  for (auto _ : state) {
    for (int i = 0; i < calls; ++i) {
      torch::jit::Stack stack{a, b, 1};
      op.callBoxed(&stack);
      benchmark::DoNotOptimize(stack);
    }
  }
}
BENCHMARK(BM_DispatcherCallsAlone)->Arg(0)->Arg(3)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  coverage::backends::KeepFreedHostMemory();
  coverage::backends::SetIntraOpThreads(0);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
