#include "apps/test_stages.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "apps/flags.h"
#include "core/sha256.h"
#include "core/text_safety.h"
#include "replay/replay.h"

namespace coverage::apps {

WorkerState::WorkerState() = default;
WorkerState::~WorkerState() = default;

const std::vector<const TestStageFamily*>& TestStageFamilies() {
  static const std::vector<const TestStageFamily*> families = {&CasesFamily(), &ProgramsFamily()};
  return families;
}

std::string KnownStages() {
  std::string out;
  for (const auto* f : TestStageFamilies()) {
    for (const auto& s : f->stages()) out += (out.empty() ? "" : ", ") + s;
  }
  return out;
}

std::vector<std::string> TimedStages() {
  std::vector<std::string> out;
  for (const auto* f : TestStageFamilies()) {
    if (f->timed()) out.insert(out.end(), f->stages().begin(), f->stages().end());
  }
  return out;
}

Result<std::pair<const TestStageFamily*, std::vector<std::string>>> ParseStageList(const std::string& text,
                                                                                  const std::string& what) {
  const TestStageFamily* family = nullptr;
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string s;
  while (std::getline(in, s, ',')) {
    const TestStageFamily* of = nullptr;
    for (const auto* f : TestStageFamilies()) {
      if (std::find(f->stages().begin(), f->stages().end(), s) != f->stages().end()) of = f;
    }
    if (of == nullptr) {
      return Status::InvalidArgument(what + ": '" + s + "' is not a stage (" + KnownStages() + ")");
    }
    if (family != nullptr && family != of) {
      return Status::InvalidArgument(fmt::format(
          "{}: {} and {} run in separate invocations (one run holds one kind of result); got '{}'", what, out.front(),
          s, text));
    }
    family = of;
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  if (out.empty()) return Status::InvalidArgument(what + " is empty");
  return std::make_pair(family, out);
}

void PrintNotice(const std::string& message) { std::fprintf(stderr, "coverage: %s\n", message.c_str()); }

Result<stages::Shard> ResolveShard(const RunFlags& flags) {
  stages::Shard shard;
  if (!flags.shard.empty() && flags.shard != "auto") {
    COV_ASSIGN_OR_RETURN(shard, stages::ParseShard(flags.shard));
  } else {
    const bool engines = flags.shard == "auto";
    COV_ASSIGN_OR_RETURN(auto from_env,
                         stages::ShardFromEnvironment([](const char* n) { return std::getenv(n); }, engines));
    if (from_env) {
      shard = *from_env;
    } else if (engines) {
      return Status::InvalidArgument(
          "--shard auto: no shard in the environment (COVERAGE_SHARD_INDEX/COVERAGE_TOTAL_SHARDS, "
          "JOB_COMPLETION_INDEX with COVERAGE_TOTAL_SHARDS, or SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT)");
    }
  }
  if (shard.active() && flags.run_id.empty()) {
    return Status::InvalidArgument("shard " + shard.ToString() +
                                   ": pass --run <id>, the same for every shard, so that `coverage merge` joins "
                                   "them into one run");
  }
  return shard;
}

int StartFailed(const Status& started, const std::string& backend, const std::atomic<bool>* stop) {
  if (started.code() == StatusCode::kAborted && stop != nullptr && stop->load()) {
    std::fprintf(stderr, "coverage: %s; nothing ran\n", started.message().c_str());
    return kExitInterrupted;
  }
  return ReportError(started.WithContext("--backend " + backend));
}

Result<isolation::IsolationOptions> MakeIsolation(const GlobalOptions& global, const RunFlags& flags,
                                                  isolation::WorkerSetup setup, const std::atomic<bool>* stop) {
  const std::string path =
      flags.isolation_config.empty() ? global.home + "/configs/isolation.json" : flags.isolation_config;
  COV_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  isolation::IsolationOptions options;
  options.stop = stop;
  COV_ASSIGN_OR_RETURN(options.policy, isolation::IsolationPolicy::FromJson(text, path, TimedStages()));
  if (flags.timeout) {
    if (*flags.timeout <= 0) return Status::InvalidArgument("--timeout must be a positive number of seconds");
    options.policy.unit_timeout_s = *flags.timeout;
    options.policy.op_timeout_s.clear();
    for (auto& [stage, t] : options.policy.stage_timeout_s) t = *flags.timeout;
  }
  if (flags.reruns) options.policy.reruns = *flags.reruns;
  options.spawn.args = {"--home", global.home, "--quiet", "--threads", std::to_string(global.threads), "worker"};
  options.spawn.memory_ceiling_bytes = options.policy.MemoryCeilingBytes();
  options.setup = std::move(setup);
  return options;
}

void FillStageRunOptions(const RunContext& context, const stages::Shard& shard, stages::StageRunOptions* options) {
  options->run_id = context.flags.run_id;
  options->backend = context.flags.backend;
  options->libtorch_version = backends::LibtorchVersion();
  options->host = HostName();
  options->notice = PrintNotice;
  options->git_revision = GitRevision(context.global.home);
  options->shard = shard;
  options->progress = !context.global.quiet;
  options->stop = context.stop;
}

Table OutcomeTable(const std::string& row_header, const std::string& count_header, const std::vector<Outcome>& seen) {
  Table t;
  t.headers = {row_header, count_header};
  t.numeric = {false, true};
  for (Outcome o : seen) {
    t.headers.emplace_back(OutcomeName(o));
    t.numeric.push_back(true);
  }
  return t;
}

int FinishStageRun(const GlobalOptions& global, const std::string& run_id, const std::string& view, bool interrupted,
                   bool failed) {
  PrintWhereResultsAre(global, run_id, view);
  if (interrupted) {
    std::printf("interrupted: resume with --run %s\n", ShellQuote(run_id).c_str());
    return kExitInterrupted;
  }
  return failed ? kExitFailures : kExitOk;
}

void PrintWhereResultsAre(const GlobalOptions& global, const std::string& run_id, const std::string& view) {
  std::printf("\nresults: %s, run %s\n", global.registry_path.c_str(), run_id.c_str());
  // The run id is an SQL literal inside one shell word (Note [Run ids] keeps it plain anyway).
  const std::string sql = "SELECT * FROM " + view + " WHERE run_id = " + SqlQuote(run_id);
  // Double quotes read better and are safe without these characters.
  const bool plain = sql.find_first_of("\"$`\\!") == std::string::npos;
  const std::string word = plain ? "\"" + sql + "\"" : ShellQuote(sql);
  std::printf("  sqlite3 %s %s\n", ShellQuote(global.registry_path).c_str(), word.c_str());
}

void PrintIsolationStats(const isolation::IsolationStats& st, const std::string& tail) {
  std::printf("isolation: %lld workers started, %lld crashed, %lld timed out, %lld reruns (%lld in the same "
              "worker)%s\n",
              static_cast<long long>(st.workers_started), static_cast<long long>(st.crashes),
              static_cast<long long>(st.timeouts), static_cast<long long>(st.reruns),
              static_cast<long long>(st.same_worker_reruns), tail.c_str());
}

isolation::WorkerSetup BaseWorkerSetup(const RunContext& context) {
  isolation::WorkerSetup setup;
  setup.backend = context.flags.backend;
  setup.device_name = context.flags.device_name;
  setup.tolerances_json = context.tolerances_text;
  setup.tolerances_source = context.tolerances_path;
  setup.checks.comparison = context.comparison;
  setup.numerics_json = context.numerics_text;
  setup.numerics_source = context.numerics_source;
  setup.golden = GoldenModeOf(context.flags.golden);
  setup.seed = context.flags.seed;
  return setup;
}

Result<NumericsChoice> ResolveNumerics(const GlobalOptions& global, const RunFlags& flags) {
  if (flags.numerics == "none") return NumericsChoice{"", "none", {}};
  std::string path = flags.numerics;
  if (path.empty()) {
    // A backend name that is not a plain file name ("privateuse1:/path/x.so") has no file.
    const bool plain = !flags.backend.empty() &&
                       flags.backend.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                                       "._-") == std::string::npos &&
                       flags.backend[0] != '.';
    const std::string candidate = global.home + "/configs/numerics/" + flags.backend + ".json";
    if (!plain || !std::filesystem::exists(candidate)) {
      return NumericsChoice{"", std::string(isolation::WorkerSetup::kAskBackend), {}};
    }
    path = candidate;
  }
  COV_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  COV_ASSIGN_OR_RETURN(replay::DeclaredNumerics declared, replay::DeclaredNumerics::FromJson(text, path));
  return NumericsChoice{std::move(text), std::move(path), std::move(declared)};
}

nlohmann::json NumericsRecord(const RunContext& context, const std::string& declared) {
  auto parsed = replay::DeclaredNumerics::FromJson(declared, context.numerics_source);
  nlohmann::json j = {{"source", context.numerics_source},
                      {"declared", parsed ? parsed->Summary() : "unreadable: " + parsed.error().message()}};
  if (!declared.empty()) j["sha256"] = Sha256Hex(declared);
  return j;
}

replay::GoldenMode GoldenModeOf(const std::string& flag) {
  return flag == "always" ? replay::GoldenMode::kAlways
         : flag == "never" ? replay::GoldenMode::kNever
                           : replay::GoldenMode::kWhenNeeded;
}

}  // namespace coverage::apps
