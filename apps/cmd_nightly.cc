// `coverage nightly`: the stages in order, then the report and the diff
// against the baseline; exit 1 when something regressed.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/app.h"
#include "apps/flags.h"
#include "apps/test_stages.h"
#include "core/text_safety.h"
#include "core/utc_time.h"
#include "registry/registry.h"
#include "reports/report.h"

extern char** environ;

namespace coverage::apps {
namespace {

struct NightlyConfig {
  std::string backend = "sim";
  std::vector<std::string> stages;  // default: every stage of every family
  std::string run_prefix = "nightly";
  std::map<std::string, std::vector<std::string>> family_args;  // a family's nightly_args() key -> extra `run` args
  std::string report_dir;
  std::string expectations;
  std::string baseline = "auto";  // "auto", "none", or a run id prefix (its -unit / -models runs)
  // Changes that make the nightly fail (exit 1).
  std::vector<std::string> fail_on = {"new_failure", "drift", "perf_regression"};
};

Result<NightlyConfig> ParseConfig(const std::string& text, const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return Status::InvalidArgument(path + ": not a JSON object");
  NightlyConfig c;
  for (const auto* family : TestStageFamilies()) {
    c.stages.insert(c.stages.end(), family->stages().begin(), family->stages().end());
  }
  std::vector<std::string> known = {"comment", "backend", "stages", "run_prefix", "report_dir", "expectations",
                                    "baseline", "fail_on"};
  for (const auto* family : TestStageFamilies()) known.emplace_back(family->nightly_args());
  for (const auto& [k, v] : j.items()) {
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      return Status::InvalidArgument(path + ": unknown key '" + k + "'");
    }
  }
  auto str = [&](const char* k, std::string& out) -> Status {
    if (!j.contains(k)) return Status::Ok();
    if (!j[k].is_string()) return Status::InvalidArgument(path + ": '" + k + "' must be a string");
    out = j[k].get<std::string>();
    return Status::Ok();
  };
  auto list = [&](const char* k, std::vector<std::string>& out) -> Status {
    if (!j.contains(k)) return Status::Ok();
    if (!j[k].is_array()) return Status::InvalidArgument(path + ": '" + k + "' must be an array of strings");
    out.clear();
    for (const auto& e : j[k]) {
      if (!e.is_string()) return Status::InvalidArgument(path + ": '" + k + "' must be an array of strings");
      out.push_back(e.get<std::string>());
    }
    return Status::Ok();
  };
  COV_RETURN_IF_ERROR(str("backend", c.backend));
  COV_RETURN_IF_ERROR(list("stages", c.stages));
  COV_RETURN_IF_ERROR(str("run_prefix", c.run_prefix));
  COV_RETURN_IF_ERROR(CheckRunId(c.run_prefix, path + ": 'run_prefix'"));
  for (const auto* family : TestStageFamilies()) {
    const std::string key(family->nightly_args());
    COV_RETURN_IF_ERROR(list(key.c_str(), c.family_args[key]));
  }
  COV_RETURN_IF_ERROR(str("report_dir", c.report_dir));
  COV_RETURN_IF_ERROR(str("expectations", c.expectations));
  COV_RETURN_IF_ERROR(str("baseline", c.baseline));
  COV_RETURN_IF_ERROR(list("fail_on", c.fail_on));
  static const char* kFailable[] = {"new_failure", "drift", "perf_regression", "compile_change", "still_failing",
                                    "new_case", "removed"};
  for (const auto& f : c.fail_on) {
    if (std::find(std::begin(kFailable), std::end(kFailable), f) == std::end(kFailable)) {
      return Status::InvalidArgument(path + ": 'fail_on' holds '" + f +
                                     "' (new_failure, drift, perf_regression, compile_change, still_failing, new_case, "
                                     "removed)");
    }
  }
  for (const auto& s : c.stages) {
    if (auto known_stage = ParseStageList(s, path + ": 'stages'"); !known_stage) return known_stage.error();
  }
  if (c.stages.empty()) return Status::InvalidArgument(path + ": 'stages' is empty");
  if (c.backend.empty()) return Status::InvalidArgument(path + ": 'backend' is empty");
  return c;
}

// The stage running now, for SIGTERM (a CI cancel, `timeout`): passed on,
// so it stops after its current case and the nightly can be resumed.
volatile pid_t g_child = 0;
void ForwardTerm(int) {
  if (g_child > 0) kill(g_child, SIGTERM);
}

// Runs `coverage <args>` (this binary) and returns its exit code. A terminal's
// Ctrl-C reaches the child too (same process group); the parent waits for it
// to stop cleanly instead of dying first.
int RunSelf(const std::vector<std::string>& args) {
  std::vector<std::string> storage = {"coverage"};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::string line;
  for (size_t i = 1; i < storage.size(); ++i) line += " " + ShellQuote(storage[i]);
  std::printf("\n$ coverage%s\n", line.c_str());
  std::fflush(stdout);
  struct sigaction ignore {}, forward {}, old_int {}, old_term {};
  ignore.sa_handler = SIG_IGN;
  forward.sa_handler = ForwardTerm;
  sigemptyset(&forward.sa_mask);
  sigaction(SIGINT, &ignore, &old_int);
  sigaction(SIGTERM, &forward, &old_term);
  // The child starts with default dispositions, whatever the parent ignores.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
  pid_t pid;
  const int spawned = posix_spawn(&pid, "/proc/self/exe", nullptr, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  if (spawned != 0) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    return kExitUsage;
  }
  g_child = pid;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_child = 0;
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : kExitUsage;
}

// Note [Re-measured performance]
// One run's spread (a few warm calls) does not see the noise between runs:
// another process taking a core for a moment makes a parallel kernel wait a
// scheduler time slice (about 8 ms here), on a shared machine at random.
// Before a nightly fails on a performance regression it runs the suspected
// cases again, alone, with more warm calls (run <id>-perfcheck; its filter
// keeps it from ever being a baseline), and counts only those whose fastest
// call is still slower than the baseline's by the report's rule
// (reports::PerfChange, Note [Fastest calls] in reports/build.cc): the
// fastest of 10 calls is very likely undisturbed. The report keeps every
// suspect.
Result<int64_t> ConfirmPerfRegressions(const GlobalOptions& global, const std::vector<std::string>& common,
                                       const NightlyConfig& config, const std::string& run_id,
                                       const std::vector<WrittenReports::PerfSuspect>& suspects,
                                       registry::Registry& reg) {
  constexpr size_t kMaxRechecked = 500;
  const std::string check_id = run_id + "-perfcheck";
  std::vector<std::string> args = common;
  // Perf suspects are op cases: the cases family measures them again.
  args.insert(args.end(), {"run", "--stage=" + CasesFamily().stages().front(), "--backend", config.backend, "--run",
                           check_id, "--warm", "10",
                           "--reruns", "0", "--show-failures", "0"});
  for (size_t i = 0; i < suspects.size() && i < kMaxRechecked; ++i) args.insert(args.end(), {"--case", suspects[i].key});
  std::printf("\n%zu op cases look slower than the baseline; measuring them again:", suspects.size());
  const int rc = RunSelf(args);
  if (rc != kExitOk && rc != kExitFailures) {
    return Status::Aborted(fmt::format("re-measuring the suspected performance regressions (run {}) ended with exit "
                                       "code {}; resume with --run-id {}", check_id, rc, ShellQuote(run_id)));
  }
  COV_ASSIGN_OR_RETURN(auto rows, reg.CaseResultsForRun(check_id));
  std::map<std::string, reports::WarmTiming> again;
  for (const auto& row : rows) {
    const auto& r = row.result;
    if (auto t = reports::WarmTimingOf(r.warm_us, r.warm_min_us, r.warm_spread_us)) again[row.key] = *t;
  }
  const reports::ReportOptions rule;  // the report's thresholds
  int64_t confirmed = 0;
  for (size_t i = 0; i < suspects.size(); ++i) {
    const auto& s = suspects[i];
    auto it = again.find(s.key);
    if (i >= kMaxRechecked || it == again.end()) {
      ++confirmed;  // not measured again: it stays a regression
      continue;
    }
    const auto d = reports::PerfChange(s.base, it->second, rule);
    if (d && *d > 0) ++confirmed;
  }
  std::printf("performance: %zu op cases looked slower, %lld still are when measured again (run %s)\n",
              suspects.size(), static_cast<long long>(confirmed), check_id.c_str());
  (void)global;
  return confirmed;
}

int Nightly(const GlobalOptions& global, const std::string& config_path, std::string run_id,
            const std::string& backend) {
  const std::string path = config_path.empty() ? global.home + "/configs/nightly.json" : config_path;
  auto text = ReadFile(path);
  if (!text) return ReportError(text.error().WithContext("--config"));
  auto config = ParseConfig(*text, path);
  if (!config) return ReportError(config.error());
  if (!backend.empty()) config->backend = backend;
  auto reg = OpenRegistry(global, false);
  if (!reg) return ReportError(reg.error());
  // To the millisecond, with the process id: two nightlies started in one
  // second must not share (and so resume) one run.
  if (run_id.empty()) run_id = config->run_prefix + "-" + UtcNowCompactMs() + "-" + std::to_string(::getpid());

  std::vector<std::string> common = {"--registry", global.registry_path, "--home", global.home, "--busy-timeout",
                                     fmt::format("{:g}", global.busy_timeout_s)};
  if (global.quiet) common.push_back("--quiet");
  if (global.threads) common.insert(common.end(), {"--threads", std::to_string(global.threads)});
  std::vector<std::string> runs;
  // Each family's configured stages, in the family's order, as one `coverage run` (Note [Test stages]).
  for (const auto* family : TestStageFamilies()) {
    std::string stages;
    for (const auto& s : family->stages()) {
      if (std::find(config->stages.begin(), config->stages.end(), s) != config->stages.end()) {
        stages += (stages.empty() ? "" : ",") + s;
      }
    }
    if (stages.empty()) continue;
    if (Status ready = family->Ready(**reg); !ready.ok()) {
      std::printf("\n%s: the %s stages are skipped: %s\n", global.registry_path.c_str(), stages.c_str(),
                  ready.message().c_str());
      continue;
    }
    const std::string family_run = run_id + std::string(family->run_suffix());
    std::vector<std::string> args = common;
    args.insert(args.end(), {"run", "--stage=" + stages, "--backend", config->backend, "--run", family_run});
    const auto& extra = config->family_args[std::string(family->nightly_args())];
    args.insert(args.end(), extra.begin(), extra.end());
    const int rc = RunSelf(args);
    if (rc != kExitOk && rc != kExitFailures) {
      std::fprintf(stderr, "coverage nightly: the %s stages ended with exit code %d; resume with --run-id %s\n",
                   stages.c_str(), rc, ShellQuote(run_id).c_str());
      return rc == kExitInterrupted ? kExitInterrupted : kExitUsage;
    }
    runs.push_back(family_run);
  }
  if (runs.empty()) return ReportError(Status::InvalidArgument("nightly: no stage ran"));

  std::printf("\n");
  ReportRequest request;
  request.runs = runs;
  request.out_dir = config->report_dir.empty() ? "" : config->report_dir + "/" + run_id;
  if (request.out_dir.empty()) {
    request.out_dir = (std::filesystem::path(global.registry_path).parent_path() / "reports" / run_id).string();
  }
  request.expectations = config->expectations;
  if (config->baseline == "none") {
    request.find_baseline = false;
  } else if (config->baseline != "auto") {
    // The baseline nightly's runs of the same stages; one it lacks (say its
    // model stages, before there was a selection) leaves that run without.
    for (const auto& r : runs) {
      const std::string id = config->baseline + r.substr(run_id.size());
      auto found = (*reg)->GetRun(id);
      if (found && *found) request.baselines.push_back(id);
      else std::printf("note: the baseline nightly has no run %s\n", id.c_str());
    }
    if (request.baselines.empty()) request.find_baseline = false;
  }
  request.title = "coverage nightly " + run_id + " on " + config->backend;
  auto written = WriteReports(global, **reg, request);
  if (!written) return ReportError(written.error());
  const bool fails_on_perf =
      std::find(config->fail_on.begin(), config->fail_on.end(), "perf_regression") != config->fail_on.end();
  if (fails_on_perf && !written->perf_suspects.empty()) {
    auto confirmed = ConfirmPerfRegressions(global, common, *config, run_id, written->perf_suspects, **reg);
    if (!confirmed) return ReportError(confirmed.error());
    written->changes["perf_regression"] = *confirmed;
  }
  std::string why;
  for (const auto& f : config->fail_on) {
    auto it = written->changes.find(f);
    if (it != written->changes.end() && it->second > 0) why += fmt::format("{}{} {}", why.empty() ? "" : ", ", it->second, f);
  }
  if (!why.empty()) {
    std::printf("REGRESSED (%s): exit 1\n", why.c_str());
  } else {
    std::printf("nothing the config fails on (%s) changed\n",
                fmt::format("{}", fmt::join(config->fail_on, ", ")).c_str());
  }
  if (!written->paths.empty()) std::printf("report: %s\n", written->paths.front().c_str());
  return why.empty() ? kExitOk : kExitFailures;
}

}  // namespace

void AddNightlyCommand(CLI::App& app, GlobalOptions& global) {
  auto config = std::make_shared<std::string>();
  auto run_id = std::make_shared<std::string>();
  auto backend = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "nightly",
      "The nightly job: the configured stages in order on the configured backend (each a `coverage run`, resumable), "
      "then the report against the baseline (the last finished runs of the same stages, backend and options).\n"
      "Exit code: 0 nothing regressed, 1 new failures, accuracy drift or performance regressions, 2 bad input or a "
      "harness error, 130 interrupted (resume with the same --run-id).");
  cmd->add_option("--config", *config, "Nightly config [default: <home>/configs/nightly.json]");
  cmd->add_option("--run-id", *run_id,
                  "Id of this nightly (its runs are <id>-unit and <id>-models); an existing id resumes it "
                  "[default: <run_prefix>-<UTC time to the millisecond>-<process id>]")
      ->check(RunIdCheck());
  cmd->add_option("--backend", *backend, "Backend under test [default: the config's]");
  cmd->callback([&global, config, run_id, backend]() {
    global.exit_code = Nightly(global, *config, *run_id, *backend);
  });
}

}  // namespace coverage::apps
