// What worker isolation costs, and what it survives: the unit stage over
// N synthetic op cases on the simulated device with F injected faults, run
//   A  in process (--isolation=none), faults that leave the process alive
//      (wrong values, NaN, unsupported, error);
//   B  in worker processes, the same faults: the overhead of isolation, B/A;
//   C  in worker processes, the full mix at the same cases (crash, abort and
//      hang too): what surviving them costs, and whether every fault is
//      attributed to its case;
// all without reruns (reruns are measured separately, on a sample: R).
//
//   build/bin/bench_isolation_overhead [--cases 10000] [--faults 1000] [--timeout 1]
//       [--coverage build/bin/coverage] [--home .] [--rerun-sample 50] [--keep DIR]
//
// The cases are small elementwise ops and matmuls (most of their time is
// harness, none is compute), so the ratio is an upper bound of what
// isolation adds to a real run.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "registry/registry.h"
#include "backends/backends.h"
#include "isolation/isolation.h"
#include "backends/plugin_backend.h"
#include "replay/replay.h"
#include "stages/unit_stage.h"
#include "tests/support/case_builder.h"

using namespace coverage;
using coverage::testing::MakeCase;
using coverage::testing::TensorArg;

namespace {

struct Planted {
  std::string key;
  std::string kind;  // fault kind in run C
};

// Case i: one of a few ops on a shape no other case of that op has.
OpCase SyntheticCase(int i) {
  static const char* kUnary[] = {"neg", "relu", "sin", "exp", "tanh", "sigmoid", "abs"};
  const int64_t rows = 1 + i % 61, cols = 1 + (i / 61) % 97 + 97 * (i / (61 * 97));
  const int which = (i / 7) % 10;
  if (which < 7) return MakeCase("aten::" + std::string(kUnary[which]), "", {TensorArg("self", DType::kFloat32, {rows, cols})});
  if (which == 7) return testing::MulCase({rows, cols});
  if (which == 8) return testing::AddCase({rows, cols});
  return testing::MmCase(rows, 8, cols);
}

// Expected outcome of a fault kind.
std::string Expected(const std::string& kind) {
  if (kind == "wrong_values") return "mismatch";
  if (kind == "nan") return "nonfinite_mismatch";
  if (kind == "unsupported") return "unsupported";
  if (kind == "error") return "error";
  if (kind == "hang") return "timeout";
  return "crash";
}

struct RunStats {
  double seconds = 0;
  std::map<std::string, int64_t> outcomes;
  int64_t attributed = 0, misattributed = 0;
  isolation::IsolationStats isolation;
};

std::string Arg(int argc, char** argv, const char* name, std::string fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (name == std::string(argv[i])) return argv[i + 1];
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int n_cases = std::stoi(Arg(argc, argv, "--cases", "10000"));
  const int n_faults = std::stoi(Arg(argc, argv, "--faults", "1000"));
  const double timeout = std::stod(Arg(argc, argv, "--timeout", "1"));
  const int rerun_sample = std::stoi(Arg(argc, argv, "--rerun-sample", "50"));
  const std::string home = std::filesystem::absolute(Arg(argc, argv, "--home", ".")).string();
  const std::string coverage_bin =
      std::filesystem::absolute(Arg(argc, argv, "--coverage", "build/bin/coverage")).string();
  std::string dir = Arg(argc, argv, "--keep", "");
  if (dir.empty()) dir = (std::filesystem::temp_directory_path() / fmt::format("bench_isolation_{}", getpid())).string();
  std::filesystem::create_directories(dir);

  // The registry and the planted faults.
  const std::string db = dir + "/registry.db";
  std::filesystem::remove(db);
  auto reg = registry::Registry::Open(db);
  if (!reg) return std::fprintf(stderr, "%s\n", reg.error().ToString().c_str()), 2;
  std::vector<OpCase> cases;
  (void)(*reg)->Begin();
  for (int i = 0; i < n_cases; ++i) {
    cases.push_back(SyntheticCase(i));
    (void)(*reg)->UpsertCase(cases.back(), {});
  }
  (void)(*reg)->Commit();
  // 1000 faults: 30% wrong values, 20% NaN, 20% unsupported, 15% error,
  // 10% crash, 3% abort, 2% hang, at every (N/F)-th case.
  const std::vector<std::pair<std::string, int>> mix = {{"wrong_values", 30}, {"nan", 20}, {"unsupported", 20},
                                                        {"error", 15},        {"crash", 10}, {"abort", 3},
                                                        {"hang", 2}};
  std::vector<Planted> planted;
  nlohmann::json survivable = nlohmann::json::array(), full = nlohmann::json::array();
  const int stride = std::max(1, n_cases / std::max(1, n_faults));
  for (int f = 0; f < n_faults && f * stride < n_cases; ++f) {
    const OpCase& c = cases[f * stride];
    int slot = f % 100;
    std::string kind;
    for (const auto& [k, share] : mix) {
      if (slot < share) {
        kind = k;
        break;
      }
      slot -= share;
    }
    const std::vector<int64_t>& shape = c.args[0].tensor.shape;
    nlohmann::json rule = {{"op", c.QualifiedName()}, {"shape", shape}, {"fault", kind}};
    full.push_back(rule);
    const bool kills = kind == "crash" || kind == "abort" || kind == "hang";
    rule["fault"] = kills ? "error" : kind;
    survivable.push_back(rule);
    planted.push_back({c.Key(), kind});
  }
  const std::string exact = dir + "/exact.json";
  {
    FILE* f = std::fopen(exact.c_str(), "w");
    std::fputs("{\"numerics\": \"exact\"}\n", f);
    std::fclose(f);
  }
  setenv("COVERAGE_SIM_CONFIG", exact.c_str(), 1);
  const std::string tolerances_path = home + "/configs/tolerances.json";
  std::string tolerances;
  {
    FILE* f = std::fopen(tolerances_path.c_str(), "r");
    if (!f) return std::fprintf(stderr, "cannot read %s (pass --home)\n", tolerances_path.c_str()), 2;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) tolerances.append(buf, n);
    std::fclose(f);
  }
  isolation::WorkerSetup setup;
  setup.backend = "sim";
  setup.tolerances_json = tolerances;
  setup.tolerances_source = tolerances_path;
  auto comparison = replay::ComparisonOptions::FromJson(tolerances, tolerances_path);
  if (!comparison) return std::fprintf(stderr, "%s\n", comparison.error().ToString().c_str()), 2;
  setup.checks.comparison = std::move(*comparison);

  auto run = [&](registry::Registry& target, const std::string& id, const nlohmann::json& faults, bool isolated,
                 int reruns) -> RunStats {
    setenv("COVERAGE_SIM_FAULTS", faults.dump().c_str(), 1);
    RunStats stats;
    std::unique_ptr<replay::CaseExecutor> executor;
    isolation::IsolatedCaseExecutor* iso = nullptr;
    if (isolated) {
      isolation::IsolationOptions o;
      o.spawn.executable = coverage_bin;
      o.spawn.args = {"--home", home, "--quiet", "worker"};
      o.setup = setup;
      o.policy.unit_timeout_s = timeout;
      o.policy.reruns = reruns;
      auto e = std::make_unique<isolation::IsolatedCaseExecutor>(o);
      if (Status s = e->Start(); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        std::exit(2);
      }
      iso = e.get();
      executor = std::move(e);
    } else {
      backends::BackendRegistry backends;
      backends::RegisterPluginBackends(backends, {});
      auto backend = backends.Create("sim");
      if (!backend) {
        std::fprintf(stderr, "%s\n", backend.error().ToString().c_str());
        std::exit(2);
      }
      executor = std::make_unique<replay::ReplayExecutor>(*backend, setup.Replay());
    }
    stages::UnitStageOptions options;
    options.run_id = id;
    options.backend = "sim";
    options.progress = false;
    const auto start = std::chrono::steady_clock::now();
    auto summary = stages::RunUnitStage(target, *executor, options);
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!summary) {
      std::fprintf(stderr, "%s\n", summary.error().ToString().c_str());
      std::exit(2);
    }
    for (const auto& [o, n] : summary->totals.counts) stats.outcomes[std::string(OutcomeName(o))] += n;
    if (iso) stats.isolation = iso->stats();
    return stats;
  };
  auto attribute = [&](const std::string& id, RunStats& stats, bool survivable_only) {
    std::map<std::string, std::string> outcome_of;
    auto rows = (*reg)->Query(
        "SELECT c.key, r.outcome FROM results r JOIN op_cases c ON c.case_id = r.case_id WHERE r.run_id = ?1", {id});
    for (const auto& row : rows->rows) outcome_of[row[0]] = row[1];
    std::map<std::string, bool> is_planted;
    for (const auto& p : planted) {
      is_planted[p.key] = true;
      const bool kills = p.kind == "crash" || p.kind == "abort" || p.kind == "hang";
      const std::string want = Expected(survivable_only && kills ? "error" : p.kind);
      (outcome_of[p.key] == want ? stats.attributed : stats.misattributed)++;
    }
    for (const auto& [key, outcome] : outcome_of) {
      if (!is_planted.count(key) && outcome != "pass") ++stats.misattributed;
    }
  };

  std::printf("%d cases, %zu faults (%s); timeout %.3g s; registry %s\n", n_cases, planted.size(),
              "30% wrong values, 20% NaN, 20% unsupported, 15% error, 10% crash, 3% abort, 2% hang", timeout,
              db.c_str());
  RunStats a = run(**reg, "A", survivable, false, 0);
  attribute("A", a, true);
  RunStats b = run(**reg, "B", survivable, true, 0);
  attribute("B", b, true);
  RunStats c = run(**reg, "C", full, true, 0);
  attribute("C", c, false);

  auto line = [&](const char* name, const RunStats& s) {
    std::string outcomes;
    for (const auto& [o, n] : s.outcomes) outcomes += fmt::format(" {}={}", o, n);
    std::printf("%-34s %8.1f s  %7.0f cases/s  attributed %lld, wrong %lld;%s\n", name, s.seconds,
                n_cases / s.seconds, static_cast<long long>(s.attributed), static_cast<long long>(s.misattributed),
                outcomes.c_str());
    if (s.isolation.workers_started) {
      std::printf("%-34s workers started %lld, crashes %lld, timeouts %lld\n", "", static_cast<long long>(s.isolation.workers_started),
                  static_cast<long long>(s.isolation.crashes), static_cast<long long>(s.isolation.timeouts));
    }
  };
  line("A in process, survivable faults", a);
  line("B workers, survivable faults", b);
  line("C workers, crash/abort/hang too", c);
  std::printf("\nisolation overhead B/A: %.2fx (%.0f us per case)\n", b.seconds / a.seconds,
              1e6 * (b.seconds - a.seconds) / n_cases);
  const int64_t killers = c.isolation.crashes + c.isolation.timeouts;
  std::printf("surviving %lld crashes and hangs C-B: %.1f s (%.2f s each; hangs wait the %.3g s timeout)\n",
              static_cast<long long>(killers), c.seconds - b.seconds,
              killers ? (c.seconds - b.seconds) / killers : 0.0, timeout);

  // Reruns (3, each in a fresh worker) on a sample: a registry of the first
  // planted cases only.
  if (rerun_sample > 0) {
    const std::string rdb = dir + "/reruns.db";
    std::filesystem::remove(rdb);
    auto small = registry::Registry::Open(rdb);
    std::map<std::string, int> kinds;
    // Every 37th planted fault (mod their count) spreads the sample over the kinds.
    for (int i = 0; i < static_cast<int>(planted.size()) && i < rerun_sample; ++i) {
      const int f = static_cast<int>((int64_t{i} * 37) % static_cast<int64_t>(planted.size()));
      (void)(*small)->UpsertCase(cases[f * stride], {});
      ++kinds[planted[f].kind];
    }
    RunStats r = run(**small, "R", full, true, 3);
    std::string mix_text;
    for (const auto& [k, n] : kinds) mix_text += fmt::format(" {}={}", k, n);
    std::printf("\nreruns: %d faulted cases (%s) with 3 reruns each in fresh workers: %.1f s, %lld reruns, %lld "
                "workers started (%.2f s per rerun)\n",
                rerun_sample, mix_text.c_str() + 1, r.seconds, static_cast<long long>(r.isolation.reruns),
                static_cast<long long>(r.isolation.workers_started),
                r.isolation.reruns ? r.seconds / r.isolation.reruns : 0.0);
  }
  const bool ok = a.misattributed == 0 && b.misattributed == 0 && c.misattributed == 0;
  std::printf("%s\n", ok ? "every fault attributed to its case; every other case passed"
                         : "MISATTRIBUTED results (see above)");
  return ok ? 0 : 1;
}
