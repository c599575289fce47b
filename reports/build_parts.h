// The pieces of BuildReport (build.cc), private to reports/. Not for use
// outside reports/.
//
//   build.cc         Note [Run diffs], Note [Fastest calls], the diff rules
//                    (VerdictChange, Drift, Perf, Compile) and Builder::Build,
//                    which picks each run's baseline.
//   build_load.cc    runs, baselines, case results, provenance and model
//                    results, read through the registry's typed reads.
//   build_runs.cc    one reported run and its baseline: verdicts after
//                    expectations, and every case and model item's change.
//   build_finish.cc  what follows from all runs: stage verdicts, blockers,
//                    summaries, the matrix, change counts, repro commands and
//                    what is broken (Note [What is broken]).
//
// Thread safety: none needed; a Builder is used by one call of BuildReport.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/case_result.h"
#include "core/outcome.h"
#include "core/result.h"
#include "registry/registry.h"
#include "reports/expectations.h"
#include "reports/report.h"

namespace coverage::reports::build {

// A verdict that counts as failing: an unexpected failure other than
// unexpected_pass (Note [Run diffs]).
inline bool Fails(std::optional<Outcome> verdict) {
  return verdict && IsUnexpectedFailure(*verdict) && *verdict != Outcome::kUnexpectedPass;
}

std::vector<std::string> Words(const std::string& text);  // split on spaces, empty words dropped

struct Judged {
  Outcome verdict;
  const Expectation* expectation = nullptr;
};

// The verdict of `outcome` under the expectation covering its result (or none).
Judged Judge(Outcome outcome, const Expectation* e);

// ---- diffs (Note [Run diffs]; build.cc) ----------------------------------------

struct Finding {
  Change change;
  std::string detail;
};

int Priority(Change c);  // lower is more important; the main change is the first

std::optional<Finding> VerdictChange(Outcome base_verdict, Outcome verdict);
std::optional<Finding> Drift(std::optional<double> base, std::optional<double> now, const ReportOptions& o);
std::optional<Finding> Perf(const CaseResult& base_result, const CaseResult& result, const ReportOptions& o);
std::optional<Finding> Compile(const CaseResult& base_result, const CaseResult& result, const ReportOptions& o);

// Sets change, change_detail and extra_changes from what was found.
template <typename Entry>
void ApplyFindings(Entry& entry, std::vector<Finding> findings) {
  if (findings.empty()) {
    entry.change = Change::kUnchanged;
    return;
  }
  std::stable_sort(findings.begin(), findings.end(),
                   [](const Finding& a, const Finding& b) { return Priority(a.change) < Priority(b.change); });
  entry.change = findings[0].change;
  entry.change_detail = findings[0].detail;
  for (size_t i = 1; i < findings.size(); ++i) {
    if constexpr (requires { entry.extra_changes; }) entry.extra_changes.emplace_back(ChangeName(findings[i].change));
    entry.change_detail += "; " + findings[i].detail;
  }
}

// ---- reads (build_load.cc) -----------------------------------------------------

Result<RunInfo> LoadRun(registry::Registry& registry, const std::string& run_id);

// What makes two runs comparable (Note [Run diffs]): the options that decide
// verdicts, and what was run; null when the stored configuration is not an
// object.
nlohmann::json JudgingOptions(const RunInfo& run, bool across_backends);

// The last finished run of the same stage and backend before `run` in the
// run order (Note [Run order] in registry/reads.cc), judged with the same
// options; or the reason there is none.
Result<std::pair<std::optional<RunInfo>, std::string>> FindBaseline(registry::Registry& registry,
                                                                    const RunInfo& run);

using CaseMap = std::unordered_map<int64_t, CaseEntry>;

// The results of `run_id` by case id, each entry holding its stored result;
// none for "" (no baseline).
Result<CaseMap> LoadCases(registry::Registry& registry, const std::string& run_id);

// Fills models, families and opinfos of every case with a result in either
// run (`now` from run_id, `removed` only in baseline_id).
Status AddProvenance(registry::Registry& registry, const std::string& run_id, const std::string& baseline_id,
                     CaseMap& now, CaseMap& removed);

using ItemKey = std::tuple<std::string, std::string, std::string>;  // model, stage, item

using ItemMap = std::map<ItemKey, registry::ModelResultRecord>;

// The model results of `run_id` by item. When given, `order` receives the
// keys in the registry's order and `families` each model's family.
Result<ItemMap> LoadItems(registry::Registry& registry, const std::string& run_id, std::vector<ItemKey>* order,
                          std::map<std::string, std::string>* families);

// The "first_divergent" object of a model result's detail (written by
// replay/program_replay.cc), else the call a worker died in ("in_call",
// written by isolation/isolation.cc); none when absent or not readable.
std::optional<FirstDivergent> ReadFirstDivergent(const nlohmann::json& detail);
// Why a failing item names no call, in words: the search's note ("every call
// is within its tolerance ...: the error accumulated"), or "" when it has none.
std::string ReadLocateNote(const nlohmann::json& detail);

// ---- the builder -----------------------------------------------------------------

class Builder {
 public:
  Builder(registry::Registry& registry, const ReportOptions& options)
      : registry_(registry), options_(options), matched_(options.expectations.entries.size(), 0) {}

  Result<Report> Build();  // build.cc

 private:
  // Cases loaded from the registry always hold their result.
  Judged JudgeCase(const CaseEntry& c, bool count) {
    const Outcome outcome = c.result->outcome;
    const Expectation* e = options_.expectations.MatchCase(c.op, c.key, Words(c.dtypes), outcome);
    if (e != nullptr && count) ++matched_[e - options_.expectations.entries.data()];
    return Judge(outcome, e);
  }
  Judged JudgeItem(const registry::ModelResultRecord& r, bool count) {
    const ModelItemResult& item = r.result;
    const Expectation* e = options_.expectations.MatchModelItem(r.stage, r.model_id, item.item, item.outcome);
    if (e != nullptr && count) ++matched_[e - options_.expectations.entries.data()];
    return Judge(item.outcome, e);
  }

  Status AddUnitRun(const RunInfo& run, const std::optional<RunInfo>& baseline);   // build_runs.cc
  Status AddModelRun(const RunInfo& run, const std::optional<RunInfo>& baseline);  // build_runs.cc
  void DiffCase(CaseEntry& c, CaseEntry& base);                                    // build_runs.cc; takes base's result
  void Finish();                                                                   // build_finish.cc

  registry::Registry& registry_;
  const ReportOptions& options_;
  std::vector<int64_t> matched_;  // per expectation: results it covered
  Report report_;
  std::map<std::string, ModelEntry> models_;
};

}  // namespace coverage::reports::build
