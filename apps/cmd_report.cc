// `coverage report`: a run (or a nightly's runs) against a baseline, as
// HTML, JUnit XML and JSON. `coverage repro`: one case, reproducible.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "apps/app.h"
#include "backends/backends.h"
#include "backends/plugin_backend.h"
#include "core/output_file.h"
#include "apps/flags.h"
#include "core/text_safety.h"
#include "registry/registry.h"
#include "reports/report.h"
#include "reports/repro.h"

namespace coverage::apps {
namespace {

struct ReportFlags {
  std::vector<std::string> runs;
  std::vector<std::string> baselines;
  bool no_baseline = false;
  std::string out;
  std::string expectations;
  std::vector<std::string> formats = {"html", "junit", "json"};
  double drift_factor = 4.0;
  double perf_spreads = 3.0;
  std::string title;
  bool fail_on_regression = false;
};

// "latest": the newest run in the registry.
Result<std::string> ResolveRun(registry::Registry& reg, const std::string& id) {
  if (id != "latest") return id;
  COV_ASSIGN_OR_RETURN(auto latest, reg.LatestRunId());
  if (!latest) return Status::NotFound("--run latest: the registry has no runs; run `coverage run` first");
  return *latest;
}

int Report(const GlobalOptions& global, const ReportFlags& flags) {
  auto reg = OpenRegistry(global, /*read_only=*/false);
  if (!reg) return ReportError(reg.error());
  ReportRequest request;
  for (const auto& r : flags.runs) {
    auto id = ResolveRun(**reg, r);
    if (!id) return ReportError(id.error());
    request.runs.push_back(*id);
  }
  if (flags.no_baseline && !flags.baselines.empty()) {
    return ReportError(Status::InvalidArgument("--no-baseline and --baseline contradict each other"));
  }
  request.baselines = flags.baselines;
  request.find_baseline = !flags.no_baseline;
  request.out_dir = flags.out;
  request.expectations = flags.expectations;
  request.formats = flags.formats;
  request.drift_factor = flags.drift_factor;
  request.perf_spreads = flags.perf_spreads;
  request.title = flags.title;
  auto written = WriteReports(global, **reg, request);
  if (!written) return ReportError(written.error());
  std::printf("%s\n", written->regressed ? "REGRESSED: new failures, accuracy drift or performance regressions"
                                         : "no regressions");
  return flags.fail_on_regression && written->regressed ? kExitFailures : kExitOk;
}

int Repro(const GlobalOptions& global, const std::string& key, const std::string& backend,
          const std::string& device_name, uint64_t seed) {
  // A name no backend has would give a script that compares the CPU with itself.
  {
    backends::BackendRegistry known;
    RegisterBackends(global, known);
    bool found = backend.rfind(backends::kPluginPrefix, 0) == 0;
    std::string names;
    for (const auto& b : known.Describe()) {
      found = found || b.name == backend;
      names += (names.empty() ? "" : ", ") + b.name;
    }
    if (!found) {
      return ReportError(Status::InvalidArgument("--backend '" + TerminalSafe(backend) + "' is not a backend of this "
                                                 "build (known: " + names + ")"));
    }
  }
  auto reg = OpenRegistry(global, /*read_only=*/true);
  if (!reg) return ReportError(reg.error());
  auto found = (*reg)->GetCaseByKey(key);
  if (!found) return ReportError(found.error());
  if (!*found) {
    return ReportError(Status::NotFound("no case with key '" + key + "' in " + global.registry_path +
                                        " (keys are 16 hex digits, as in reports and `coverage registry query`)"));
  }
  const OpCase& c = (*found)->op_case;
  std::printf("case %s: %s\n", key.c_str(), c.Summary().c_str());
  auto sources = (*reg)->SourcesOfCase(key, 10);
  if (sources && !sources->empty()) {
    std::printf("used by:\n");
    for (const auto& s : *sources) {
      // Note [Terminal-safe text]: model ids and module paths come from the Hub.
      std::printf("  %s  %s (%s, %lld calls)\n", TerminalSafe(s.model_id).c_str(), TerminalSafe(s.module_path).c_str(),
                  TerminalSafe(s.profile).c_str(), static_cast<long long>(s.call_count));
    }
  }
  auto results = (*reg)->ResultsOfCase(key, 5);
  if (!results) return ReportError(results.error());
  if (!results->empty()) {
    std::printf("latest results:\n");
    for (const auto& r : *results) {
      const std::string err = TerminalSafe(r.error, 197);
      std::printf("  %s (%s): %s%s%s\n", r.run_id.c_str(), r.backend.c_str(), std::string(OutcomeName(r.outcome)).c_str(),
                  err.empty() ? "" : ": ", err.c_str());
    }
  }
  std::printf("\n# The case as stored (canonical JSON):\n%s\n", c.ToCanonicalJson().c_str());
  std::printf("\n# Replay it on a backend with the unit stage's inputs and judging:\n"
              "coverage --registry %s run --stage=unit --backend %s%s --case %s --run repro-%s-%d\n",
              ShellQuote(global.registry_path).c_str(), ShellQuote(backend).c_str(),
              device_name.empty() ? "" : (" --device-name " + ShellQuote(device_name)).c_str(), ShellQuote(key).c_str(),
              ShellQuote(key).c_str(), static_cast<int>(getpid()));
  // The script loads a plugin itself (Note in reports/repro.h), by its
  // absolute path, so it runs from any folder.
  reports::ReproTarget target;
  if (backend == "cuda" || backend == "cuda-tf32") target.device = "cuda";
  if (backend == "sim") {
    target.plugin = backends::DefaultSimPluginPath();
    const char* config = std::getenv("COVERAGE_SIM_CONFIG");  // as the run would take it
    target.environment = {{"COVERAGE_SIM_CONFIG", config && *config ? std::string(config)
                                                                      : global.home + "/configs/sim.json"}};
  } else if (backend.rfind(backends::kPluginPrefix, 0) == 0) {
    target.plugin = std::filesystem::absolute(backend.substr(backends::kPluginPrefix.size())).string();
  }
  target.device_name = device_name;
  std::printf("\n# The same call in PyTorch (same shapes, dtypes, strides, value domains and seed; the values are "
              "not bit-identical to the unit stage's):\ncat > repro_%s.py <<'PY'\n%sPY\npython3 repro_%s.py\n",
              key.c_str(), reports::PythonRepro(c, seed, target).c_str(), key.c_str());
  return kExitOk;
}

}  // namespace

Result<WrittenReports> WriteReports(const GlobalOptions& global, registry::Registry& reg, const ReportRequest& r) {
  if (r.runs.empty()) return Status::InvalidArgument("--run: name at least one run (or 'latest')");
  // The first run names the report folder (Note [Run ids]).
  for (size_t i = 0; i < r.runs.size(); ++i) {
    COV_RETURN_IF_ERROR(CheckRunId(r.runs[i], "--run"));
    // Twice would count every result twice.
    if (std::find(r.runs.begin(), r.runs.begin() + static_cast<std::ptrdiff_t>(i), r.runs[i]) !=
        r.runs.begin() + static_cast<std::ptrdiff_t>(i)) {
      return Status::InvalidArgument("--run '" + r.runs[i] + "' is given twice");
    }
  }
  for (const auto& id : r.baselines) COV_RETURN_IF_ERROR(CheckRunId(id, "--baseline"));
  reports::ReportOptions options;
  options.run_ids = r.runs;
  options.baseline_run_ids = r.baselines;
  options.find_baseline = r.find_baseline;
  options.drift_factor = r.drift_factor;
  options.perf_spreads = r.perf_spreads;
  options.title = r.title;
  options.registry_path = global.registry_path;
  // Expectations: the named file, else <home>/configs/expectations/<backend>.json when there is one.
  std::string expectations_path = r.expectations;
  if (expectations_path.empty()) {
    COV_ASSIGN_OR_RETURN(auto run, reg.GetRun(r.runs.front()));
    if (!run) return Status::NotFound("--run '" + r.runs.front() + "': no such run in " + global.registry_path);
    std::string backend = run->backend;
    for (char& c : backend) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
    }
    const std::string candidate = global.home + "/configs/expectations/" + backend + ".json";
    if (std::filesystem::exists(candidate)) expectations_path = candidate;
  }
  if (!expectations_path.empty()) {
    COV_ASSIGN_OR_RETURN(std::string text, ReadFile(expectations_path));
    COV_ASSIGN_OR_RETURN(options.expectations, reports::Expectations::FromJson(text, expectations_path));
  }
  for (const auto& format : r.formats) {
    if (format != "html" && format != "junit" && format != "json") {
      return Status::InvalidArgument("--format: '" + format + "' is not html, junit or json");
    }
  }
  COV_ASSIGN_OR_RETURN(reports::Report report, reports::BuildReport(reg, options));

  std::string dir = r.out_dir;
  if (dir.empty()) {
    dir = (std::filesystem::path(global.registry_path).parent_path() / "reports" / r.runs.front()).string();
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create the report folder '" + dir + "': " + ec.message());
  WrittenReports written;
  written.regressed = report.Regressed();
  // Every change a result shows, not only its main one: a case that drifted
  // and got slower counts for both.
  for (const auto& [change, n] : report.changes) written.changes[std::string(reports::ChangeName(change))] += n;
  for (const auto& c : report.cases) {
    for (const auto& extra : c.extra_changes) ++written.changes[extra];
    const bool slower = c.change == reports::Change::kPerfRegression ||
                        std::find(c.extra_changes.begin(), c.extra_changes.end(),
                                  reports::ChangeName(reports::Change::kPerfRegression)) != c.extra_changes.end();
    if (!slower || !c.baseline) continue;
    const auto base = reports::WarmTimingOf(c.baseline->warm_us, c.baseline->warm_min_us, c.baseline->warm_spread_us);
    if (base) written.perf_suspects.push_back({c.key, *base});
  }
  for (const auto& format : r.formats) {
    std::string path, text;
    if (format == "html") {
      path = dir + "/report.html";
      text = reports::ReportToHtml(report);
    } else if (format == "junit") {
      path = dir + "/junit.xml";
      text = reports::ReportToJUnit(report);
    } else if (format == "json") {
      path = dir + "/report.json";
      text = reports::ReportToJson(report);
    } else {
      return Status::InvalidArgument("--format: '" + format + "' is not html, junit or json");
    }
    COV_RETURN_IF_ERROR(WriteOutputFile(path, text));
    written.paths.push_back(path);
  }
  // What a person reads first.
  std::printf("report of %s", fmt::format("{}", fmt::join(r.runs, ", ")).c_str());
  if (!report.baselines.empty()) {
    std::string b;
    for (const auto& info : report.baselines) b += (b.empty() ? "" : ", ") + info.run_id;
    std::printf(" against %s", b.c_str());
  }
  std::printf("\n");
  for (const auto& s : report.stages) {
    std::string verdicts;
    for (const auto& [v, n] : s.VerdictsInNameOrder()) {
      verdicts += fmt::format("{}{} {}", verdicts.empty() ? "" : ", ", n, OutcomeName(v));
    }
    std::printf("  %-7s %lld: %s (pass rate %.1f%%)\n", s.stage.c_str(), static_cast<long long>(s.total),
                verdicts.c_str(), 100 * s.pass_rate);
  }
  std::string changes;
  for (reports::Change c : {reports::Change::kNewFailure, reports::Change::kFixed, reports::Change::kStillFailing,
                            reports::Change::kDrift, reports::Change::kPerfRegression, reports::Change::kCompileChange,
                            reports::Change::kNewCase, reports::Change::kRemoved}) {
    if (int64_t n = report.CountOf(c)) changes += fmt::format("{}{} {}", changes.empty() ? "" : ", ", n, reports::ChangeName(c));
  }
  if (!changes.empty()) std::printf("  changes: %s\n", changes.c_str());
  for (const auto& w : report.warnings) std::printf("  note: %s\n", w.c_str());
  if (!report.blockers.empty()) {
    std::printf("  top blocker: %s %s (blocks %zu models)\n", report.blockers[0].key.c_str(),
                report.blockers[0].summary.c_str(), report.blockers[0].models.size());
  }
  for (const auto& p : written.paths) std::printf("wrote %s\n", p.c_str());
  return written;
}

void AddReportCommand(CLI::App& app, GlobalOptions& global) {
  auto flags = std::make_shared<ReportFlags>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Write a run's report (one self-contained HTML file, JUnit XML and a JSON summary): regressions against a "
      "baseline run first, stage x family matrix, models with their failing items and the op cases behind them, "
      "every case. Exit code 0, or 1 with --fail-on-regression when something regressed.");
  cmd->add_option("--run", flags->runs,
                  "Run to report (repeatable, e.g. a nightly's unit and model-stage runs); 'latest' for the newest")
      ->required()
      ->check(RunIdCheck());
  cmd->add_option("--baseline", flags->baselines,
                  "Baseline run (repeatable, matched by stage) [default: the last finished run of the same stage, "
                  "backend and judging options]")
      ->check(RunIdCheck());
  cmd->add_flag("--no-baseline", flags->no_baseline, "Compare with nothing");
  cmd->add_option("--out", flags->out, "Folder for report.html, junit.xml, report.json [default: reports/<run> next "
                                       "to the registry]");
  cmd->add_option("--expectations", flags->expectations,
                  "Known failures [default: <home>/configs/expectations/<backend>.json when it exists]");
  cmd->add_option("--format", flags->formats, "Outputs: html, junit, json (repeatable)")->capture_default_str();
  cmd->add_option("--drift-factor", flags->drift_factor, "Accuracy drift: error grew by this factor")
      ->capture_default_str()
      ->check(FiniteRange(1.0, 1e12));
  cmd->add_option("--perf-spreads", flags->perf_spreads,
                  "Performance regression: the fastest warm call slower by more than this many times the smaller of the "
                  "two runs' noise (median minus fastest call)")
      ->capture_default_str()
      ->check(FiniteRange(0.0, 1e6));
  cmd->add_option("--title", flags->title, "Report title");
  cmd->add_flag("--fail-on-regression", flags->fail_on_regression, "Exit 1 when something regressed");
  cmd->callback([&global, flags]() { global.exit_code = Report(global, *flags); });

  auto key = std::make_shared<std::string>();
  auto backend = std::make_shared<std::string>("sim");
  auto seed = std::make_shared<uint64_t>(0);
  CLI::App* repro = app.add_subcommand(
      "repro", "Print a copy-paste reproduction of one op case: its JSON, the command that replays it on a backend, "
               "and a PyTorch script calling torch.ops.aten.<op>.<overload> with the same shapes, dtypes and strides");
  repro->add_option("key", *key, "Case key (16 hex digits; in reports and `coverage registry query`)")->required();
  repro->add_option("--backend", *backend, "Backend for the replay command and the script's device")
      ->capture_default_str();
  repro->add_option("--seed", *seed, "Seed of the script's inputs")->capture_default_str()
      ->check(SeedCheck());
  auto device_name = std::make_shared<std::string>();
  repro->add_option("--device-name", *device_name,
                    "A plugin device's name, for a plugin that leaves its device unnamed (as `run --device-name`)")
      ->check(DeviceNameCheck());
  repro->callback([&global, key, backend, device_name, seed]() {
    global.exit_code = Repro(global, *key, *backend, *device_name, *seed);
  });
}

}  // namespace coverage::apps
