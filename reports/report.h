// Reports: what a run (or a group of runs, e.g. a nightly's unit run and its
// module/model/train run) found, compared against a baseline, with known
// failures applied and root causes traced from failing models down to the
// op cases they use. One data model (Report), built from the registry by
// BuildReport, written as self-contained HTML, JUnit XML and JSON.
//
// Torch-free: depends on core and registry only. Nothing here runs a case.
// Thread safety: a Report is a plain value.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/case_result.h"
#include "core/outcome.h"
#include "core/result.h"
#include "registry/registry.h"
#include "reports/expectations.h"

namespace coverage::reports {

// How one result compares with the baseline's result for the same case or
// model item (Note [Run diffs] in build.cc).
enum class Change {
  kNoBaseline,       // the report has no baseline for this result's run
  kNewCase,          // the baseline run has no result for it
  kRemoved,          // the baseline run has a result, this run has none
  kNewFailure,       // did not fail unexpectedly in the baseline, does now
  kFixed,            // failed unexpectedly in the baseline, does not now
  kStillFailing,     // fails unexpectedly in both
  kDrift,            // passes in both, but its error grew past the drift threshold
  kPerfRegression,   // warm latency slower than the baseline beyond the measured spread
  kPerfImprovement,  // faster beyond the spread
  kCompileChange,    // first-call overhead (first call minus warm) changed beyond the threshold
  kUnchanged,
};
std::string_view ChangeName(Change change);  // "new_failure", "fixed", ...

// One result's warm latency as performance is judged (Note [Fastest calls]
// in build.cc): its fastest warm call, and its noise, how far its median
// sits above that.
struct WarmTiming {
  double fastest_us = 0;
  double noise_us = 0;
  bool fastest_known = true;  // false: a result stored before schema v11, its median and spread
};
// From a stored result's figures. nullopt without warm calls.
std::optional<WarmTiming> WarmTimingOf(const std::optional<double>& warm_us, const std::optional<double>& warm_min_us,
                                       const std::optional<double>& warm_spread_us);
struct ReportOptions;
// now.fastest - base.fastest when it is a change by the options' rule, else
// nullopt. The report and the nightly's second measurement both judge so.
std::optional<double> PerfChange(const WarmTiming& base, const WarmTiming& now, const ReportOptions& options);
// What Report::Regressed() fails on: new_failure, drift, perf_regression.
bool IsRegression(Change change);

struct ReportOptions {
  std::vector<std::string> run_ids;           // the runs to report (at least one)
  // Baselines: explicit run ids (matched to runs by stage), or, when empty
  // and find_baseline, for each run the last finished run before it of the
  // same stage and backend whose judging options (config "replay" /
  // "checks") are the same.
  std::vector<std::string> baseline_run_ids;
  bool find_baseline = true;
  Expectations expectations;                  // known failures of the backend (may be empty)
  // Accuracy drift: both pass, and max_abs_err grew by drift_factor and by
  // at least drift_floor.
  double drift_factor = 4.0;
  double drift_floor = 1e-6;
  // Performance, judged on the fastest warm calls (Note [Fastest calls] in
  // build.cc): changed by more than perf_spreads times the smaller of the two
  // runs' noise, and by perf_min_rel, and by perf_min_us.
  double perf_spreads = 3.0;
  double perf_min_rel = 0.10;
  double perf_min_us = 5.0;
  // Compile (first call minus warm): changed by compile_factor and compile_min_us.
  double compile_factor = 2.0;
  double compile_min_us = 1000.0;
  std::string title;                          // default: "coverage: <backend> <run ids>"
  std::string registry_path;                  // shown in the report and used in repro commands
};

struct RunInfo {
  std::string run_id, stage, backend, started_at, finished_at, host, git_revision, libtorch_version, config_json;
  int64_t results = 0;
  std::string shards;  // "3 of 4 shards finished"; empty when not sharded
  // The numerics it was judged under (Note [Declared numerics]): "fp32 operands
  // rounded to bf16 in 12 ops (...)", "exact fp32"; "" when not recorded.
  std::string numerics;
  // The backend as baselines know it (registry::RunRecord::Identity) and its
  // version ("" when it gives none or the run predates schema v14).
  std::string backend_name, backend_version;
};

// One op case of a reported unit run, or of its baseline when removed. The
// results are the registry's records as stored (core/case_result.h, read
// through registry::CaseResultRow); the rest is the report's own.
struct CaseEntry {
  std::string run_id;           // the run it belongs to ("" for removed)
  std::string key, op, summary; // op: "aten::add.Tensor"
  std::string dtypes;           // "f32 i64"
  std::vector<std::string> models;    // provenance: models whose capture produced it (sorted)
  std::vector<std::string> families;  // their model types (sorted, distinct)
  std::vector<std::string> opinfos;   // OpInfos whose samples make it (`coverage import opinfo`), sorted
  std::optional<CaseResult> result;   // the run's result (none when removed)
  std::optional<Outcome> verdict;  // after expectations: the outcome, kExpectedFailure or kUnexpectedPass
  std::string expectation;      // the matching expectation's reason, if any
  std::string baseline_run_id;
  std::optional<CaseResult> baseline;  // the baseline's result, when it has one
  Change change = Change::kNoBaseline;
  std::string change_detail;    // "max abs error 3.2e-05 -> 4.1e-03 (128x)", "fastest warm call 12.0 us -> 30.1 us (...)"
  std::vector<std::string> extra_changes;  // drift/perf/compile names when they coexist with the main change
  std::string repro;            // the `coverage repro` command for it

  // The run's result, or for a removed case an empty one (no figures, one
  // attempt, no counters) whose outcome means nothing: read outcomes with
  // OutcomeOf(result).
  const CaseResult& ResultOrEmpty() const;
};

// The call a failing model item was first wrong at: the program replayed
// again with every call fed the reference's inputs (Note in
// replay/program_replay.h); its op case is in the registry under case_key.
struct FirstDivergent {
  int64_t call = -1;
  std::string op, case_key, module, phase, outcome, message;
  std::optional<double> max_abs_err, error_ratio;
  // The call a crashed or hung worker was in (detail "in_call", Note [Where
  // a worker died]), not a call judged wrong.
  bool died_in = false;
};

// One item of a model-level stage (module kind, "forward", "train", "*"): the
// registry's records of it as stored, and what the report makes of them.
struct ModelItemEntry {
  std::optional<registry::ModelResultRecord> result;    // the run's (none when removed)
  std::optional<registry::ModelResultRecord> baseline;  // the baseline's, when it has the item
  std::optional<Outcome> verdict;  // as for CaseEntry
  std::string expectation;
  Change change = Change::kNoBaseline;
  std::string change_detail;
  // From the result's detail_json: failing items whose first wrong call was found.
  std::optional<FirstDivergent> first_divergent;
  std::string locate_note;  // why no call is named, in words (ReadLocateNote)

  // What names the item (run, stage, item, profile), its error and figures:
  // the result, else the baseline's record (a removed item). An entry has at
  // least one of them.
  const registry::ModelResultRecord& Record() const;
};

struct ModelEntry {
  std::string model_id, family;
  std::map<std::string, Outcome> stage_verdict;  // stage -> worst verdict of its items
  std::vector<ModelItemEntry> items;
  // Root cause: keys of op cases this model's capture produced (registry
  // provenance) that fail unexpectedly in a reported unit run.
  std::vector<std::string> failing_cases;
  bool failing = false;  // some module/model/train item fails unexpectedly
};

// A failing op case, and the failing models that use it.
struct Blocker {
  std::string key, op, summary;
  std::optional<Outcome> verdict;
  std::vector<std::string> models;  // failing models whose located first wrong call it is
};

// "What is broken": op cases failing now (unexpectedly; expected failures
// are not broken news), one group per op and dtypes.
struct BrokenOp {
  std::string op, dtypes;
  int64_t cases = 0;
  std::map<Outcome, int64_t> verdicts;
  // The largest error against the fp64 golden relative to the CPU
  // reference's own (the backend's error / the CPU's, both against the golden);
  // none when no case had a golden.
  std::optional<double> worst_error_ratio;
  std::string worst_key;                 // the case with that ratio (else the first failing case)
  std::vector<std::string> models;       // models whose capture produced them (sorted, distinct)
  int64_t new_failures = 0;              // of them, new since the baseline
};

// A model failing now: its first failing item, and where it first went wrong.
struct BrokenModel {
  std::string model_id, family, stage, item, profile, error;
  Outcome verdict = Outcome::kMismatch;
  std::optional<FirstDivergent> first_divergent;
  std::string locate_note;  // why no call is named, in words
  std::optional<double> error_ratio;
  bool is_new = false;  // a new failure since the baseline
};

// What the backend lacks (Note [Missing kernels] in core/outcome.h), as a
// backend's supported-operators page lists it: per op and dtypes of the
// reported unit cases, whether the backend ran them itself, through a host
// fallback its counters count, or not at all.
struct OpSupport {
  std::string op, dtypes;
  int64_t cases = 0;        // judged cases (skipped ones are not)
  int64_t unsupported = 0;  // of them, the backend has no kernel for
  int64_t fallback = 0;     // of the others, run through the backend's host fallback
  std::string missing;      // what the first unsupported case's error names ("convolution_overrideable")
  std::string example_key;  // an unsupported case, else a fallback one
  // "N" (no judged case ran), "partly" (some did not), "CPU fallback" (all
  // ran, some on the host).
  std::string_view Support() const;
};

// Where the reported models came from: the crawl, the selection and the
// capture in the same registry (absent parts stay empty).
struct PipelineInfo {
  int64_t models_listed = 0, configs_fetched = 0, crawls = 0;
  int64_t selection_id = 0, selection_k = 0, representatives = 0, selection_models = 0;
  int64_t families = 0, families_covered = 0;
  int64_t pairs_captured = 0, pairs_not_captured = 0, models_captured = 0, op_cases = 0;
  std::map<std::string, int64_t> capture_statuses;  // status -> pairs
};

struct StageSummary {
  std::string stage;                          // unit, module, model, train
  std::map<Outcome, int64_t> verdicts;        // verdict -> count (cases for unit, models for the others)
  int64_t total = 0;
  double pass_rate = 0;                       // pass (+ expected_failure, unexpected_pass) / (total - skipped)
  // unit: verdict counts by the cases' source, "captured" (from a model) and
  // "opinfo" (from an OpInfo sample); a case from both counts in both.
  std::map<std::string, std::map<Outcome, int64_t>> by_source;

  // `verdicts` in the order of their names, the order the writers list them in.
  std::vector<std::pair<Outcome, int64_t>> VerdictsInNameOrder() const;
};

// The stage x family matrix's row of the unit cases from OpInfo samples.
inline constexpr const char* kOpInfoFamily = "OpInfo samples";

struct Report {
  std::string title, generated_at, registry_path;
  std::vector<RunInfo> runs, baselines;
  std::vector<StageSummary> stages;
  // family -> stage -> (passing, total): the stage x family matrix; skipped
  // results are not counted (total is what was judged). Unit cases from
  // OpInfo samples have the row kOpInfoFamily.
  std::map<std::string, std::map<std::string, std::pair<int64_t, int64_t>>> matrix;
  std::vector<CaseEntry> cases;    // regressions first (new failures, drift, perf), then the rest by op and key
  std::vector<ModelEntry> models;  // failing first, then by id
  std::vector<Blocker> blockers;   // most models blocked first
  std::vector<BrokenOp> broken_ops;       // most failing cases first
  std::vector<BrokenModel> broken_models; // by stage (earliest first), then id
  std::vector<OpSupport> lacks;           // N, then partly, then CPU fallback; by op and dtypes
  PipelineInfo pipeline;
  std::map<Change, int64_t> changes;  // over cases and model items
  std::vector<std::string> warnings;  // "no baseline for run X: ...", expectations that matched nothing, ...

  // What `coverage nightly` fails on: a new failure (not expected), accuracy
  // drift, or a performance regression.
  bool Regressed() const;
  int64_t CountOf(Change change) const;
};

Result<Report> BuildReport(registry::Registry& registry, const ReportOptions& options);

// Derives broken_ops and broken_models from cases and models (Note [What is
// broken] in build_finish.cc), and lacks from the cases; BuildReport calls it.
void FindBroken(Report& report);

// Passing for pass rates and the matrix: the op or model works, whether or not
// an expectation said otherwise (pass, expected_failure, unexpected_pass).
bool Passes(Outcome verdict);

// How the writers spell an optional outcome: its name, or "" for none (a
// removed case, a result without a baseline).
std::string_view OutcomeNameOrEmpty(const std::optional<Outcome>& outcome);

// The outcome of a stored result (CaseResult, registry::ModelResultRecord),
// or none when there is none.
inline std::optional<Outcome> OutcomeOf(const std::optional<CaseResult>& result) {
  return result ? std::optional<Outcome>(result->outcome) : std::nullopt;
}
inline std::optional<Outcome> OutcomeOf(const std::optional<registry::ModelResultRecord>& record) {
  return record ? std::optional<Outcome>(record->result.outcome) : std::nullopt;
}

// Writers. Every string from the registry (model ids, error text, case
// summaries) is escaped for its format.
std::string ReportToJson(const Report& report);   // a summary: runs, stages, changes, regressions, blockers
std::string ReportToJUnit(const Report& report);  // one testcase per case and per model item per stage
std::string ReportToHtml(const Report& report);   // one self-contained file (inline CSS, JS, SVG)

}  // namespace coverage::reports
