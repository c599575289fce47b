// Where the time of the unit stage goes: op compute (time inside dispatcher
// calls: golden, reference and backend runs) versus harness overhead (making
// inputs, comparing outputs, the stage loop and its database writes).
//
//   build/bin/bench_unit_overhead [--registry build/coverage.db] [--warm 3] [--min-flops 1e6]
//                                 [--golden auto|always|never] [--allocator tuned|default] [--op NAME]...
//                                 [--input-cache-mb N] [--threads N] [--verify-inputs always|trusted]
//
// Runs every case of the registry on the cpu backend through the
// ReplayExecutor twice (a cold process, then warm), then once through the
// whole unit stage (into a scratch copy of the registry), and prints the
// breakdowns side by side.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "registry/registry.h"
#include "backends/backends.h"
#include "backends/host.h"
#include "replay/replay.h"
#include "stages/unit_stage.h"

using namespace coverage;

namespace {

struct Bucket {
  std::string name;
  int64_t cases = 0;
  double total_us = 0, compute_us = 0, materialize_us = 0, compare_us = 0;
  std::vector<double> overhead_us;

  void Add(const CaseResult& r) {
    ++cases;
    total_us += r.timing.total_us;
    compute_us += r.timing.ComputeUs();
    materialize_us += r.timing.materialize_us;
    compare_us += r.timing.compare_us;
    overhead_us.push_back(r.timing.total_us - r.timing.ComputeUs());
  }
  double Median() {
    if (overhead_us.empty()) return 0;
    std::sort(overhead_us.begin(), overhead_us.end());
    return overhead_us[overhead_us.size() / 2];
  }
};

// Forwards to the replay executor and keeps every timing.
class TimingExecutor final : public replay::CaseExecutor {
 public:
  explicit TimingExecutor(replay::CaseExecutor* inner) : inner_(inner) {}
  CaseResult Run(const OpCase& c) override {
    CaseResult r = inner_->Run(c);
    executor_us += r.timing.total_us;
    compute_us += r.timing.ComputeUs();
    return r;
  }
  double executor_us = 0, compute_us = 0;

 private:
  replay::CaseExecutor* inner_;
};

}  // namespace

constexpr size_t kShowWorst = 5;

int main(int argc, char** argv) {
  std::string path = "build/coverage.db";
  int warm = 3;
  double min_flops = 1e6;
  std::string golden = "auto";
  bool tune_allocator = true;
  registry::CaseFilter filter;
  int64_t cache_mb = -1;
  int threads = 0;
  bool verify_inputs = false;
  if (argc % 2 == 0) {
    std::fprintf(stderr, "flags take one value each: --flag VALUE\n");
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--registry") path = argv[i + 1];
    else if (flag == "--warm") warm = std::stoi(argv[i + 1]);
    else if (flag == "--min-flops") min_flops = std::stod(argv[i + 1]);
    else if (flag == "--golden") golden = argv[i + 1];
    else if (flag == "--op") filter.ops.push_back(argv[i + 1]);
    else if (flag == "--input-cache-mb") cache_mb = std::stoll(argv[i + 1]);
    else if (flag == "--threads") threads = std::stoi(argv[i + 1]);
    else if (flag == "--verify-inputs") verify_inputs = std::string(argv[i + 1]) == "always";
    else if (flag == "--allocator") tune_allocator = std::string(argv[i + 1]) != "default";
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (tune_allocator) backends::KeepFreedHostMemory();
  backends::SetIntraOpThreads(threads);
  auto reg = registry::Registry::Open(path, {.read_only = true});
  if (!reg) {
    std::fprintf(stderr, "%s\n", reg.error().ToString().c_str());
    return 2;
  }
  auto cases = (*reg)->FindCases(filter);
  if (!cases) {
    std::fprintf(stderr, "%s\n", cases.error().ToString().c_str());
    return 2;
  }
  backends::BackendRegistry backends;
  backends::RegisterCpuBackend(backends);
  replay::ReplayOptions options;
  options.warm_iterations = warm;
  if (cache_mb >= 0) options.input_cache_bytes = cache_mb << 20;
  options.always_verify_inputs = verify_inputs;
  options.golden = golden == "always" ? replay::GoldenMode::kAlways
                   : golden == "never" ? replay::GoldenMode::kNever
                                       : replay::GoldenMode::kWhenNeeded;
  std::printf("registry %s: %zu cases, cpu backend, %d warm calls, golden %s, allocator %s, input cache %lld MiB, "
              "%d threads, read-only inputs verified %s\n\n",
              path.c_str(), cases->size(), warm, golden.c_str(), tune_allocator ? "tuned" : "default",
              static_cast<long long>(options.input_cache_bytes >> 20), backends::IntraOpThreads(),
              verify_inputs ? "always" : "for untrusted backends (not cpu)");
  std::printf("%-8s %-16s %6s %10s %10s %8s %12s %10s %14s %12s\n", "pass", "cases", "n", "wall s", "compute s",
              "compute", "make inputs", "compare", "overhead/case", "median/case");
  std::vector<std::pair<double, std::string>> worst;  // (overhead us, description), second pass
  // Pass 1 starts from a cold process: every new allocation faults fresh
  // pages in. Pass 2 uses a new executor (empty input cache) in the same
  // process, as every case after the first few does in a long run.
  for (const char* pass : {"cold", "warm"}) {
    replay::ReplayExecutor executor(*backends.Create("cpu"), options);
    Bucket big{fmt::format(">= {:g} FLOPs", min_flops)}, small{fmt::format("< {:g} FLOPs", min_flops)}, all{"all"};
    worst.clear();
    for (const auto& c : *cases) {
      CaseResult r = executor.Run(c.op_case);
      if (c.cost.flops >= min_flops) worst.emplace_back(r.timing.total_us - r.timing.ComputeUs(),
                         fmt::format("{:.0f} us overhead ({:.0f} make inputs, {:.0f} compare), {:.0f} us compute: {}",
                                     r.timing.total_us - r.timing.ComputeUs(), r.timing.materialize_us,
                                     r.timing.compare_us, r.timing.ComputeUs(), c.op_case.Summary()));
      (c.cost.flops >= min_flops ? big : small).Add(r);
      all.Add(r);
    }
    for (Bucket* b : {&big, &small, &all}) {
      std::printf("%-8s %-16s %6lld %10.2f %10.2f %7.1f%% %11.1f%% %9.1f%% %11.0f us %9.0f us\n", pass,
                  b->name.c_str(), static_cast<long long>(b->cases), b->total_us / 1e6, b->compute_us / 1e6,
                  b->total_us > 0 ? 100 * b->compute_us / b->total_us : 0,
                  b->total_us > 0 ? 100 * b->materialize_us / b->total_us : 0,
                  b->total_us > 0 ? 100 * b->compare_us / b->total_us : 0,
                  b->cases ? (b->total_us - b->compute_us) / b->cases : 0, b->Median());
    }
  }

  std::sort(worst.rbegin(), worst.rend());
  std::printf("\nlargest overheads among cases >= %g FLOPs (warm pass):\n", min_flops);
  for (size_t i = 0; i < worst.size() && i < kShowWorst; ++i) std::printf("  %s\n", worst[i].second.substr(0, 220).c_str());

  // 2. The whole unit stage (planning, resume bookkeeping, a committed
  //    result row per case) on a scratch copy of the registry.
  const std::string scratch = (std::filesystem::temp_directory_path() / "bench_unit_overhead.db").string();
  std::filesystem::remove(scratch);
  std::filesystem::copy_file(path, scratch);
  auto copy = registry::Registry::Open(scratch);
  if (!copy) {
    std::fprintf(stderr, "%s\n", copy.error().ToString().c_str());
    return 2;
  }
  replay::ReplayExecutor executor(*backends.Create("cpu"), options);
  TimingExecutor timing(&executor);
  stages::UnitStageOptions stage_options;
  stage_options.run_id = "bench";
  stage_options.progress = false;
  const auto t0 = std::chrono::steady_clock::now();
  stage_options.filter = filter;
  auto summary = stages::RunUnitStage(**copy, timing, stage_options);
  const double stage_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (!summary) {
    std::fprintf(stderr, "%s\n", summary.error().ToString().c_str());
    return 2;
  }
  const double n = static_cast<double>(summary->executed);
  std::printf("\nunit stage, all %lld cases: wall %.2f s, compute %.1f%%, executor %.1f%%; "
              "stage loop + database %.0f us/case, executor overhead %.0f us/case\n",
              static_cast<long long>(summary->executed), stage_us / 1e6, 100 * timing.compute_us / stage_us,
              100 * timing.executor_us / stage_us, (stage_us - timing.executor_us) / n,
              (timing.executor_us - timing.compute_us) / n);
  std::filesystem::remove(scratch);
  std::filesystem::remove(scratch + "-wal");
  std::filesystem::remove(scratch + "-shm");
  return 0;
}
