#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/outcome.h"
#include "core/text_safety.h"
#include "core/utc_time.h"
#include "registry/registry.h"
#include "reports/report.h"

namespace coverage::reports {

// Note [Run diffs]
// Each result of a reported run is compared with the result of the same op
// case (by case id) or model item (by model, stage and item; the profile may
// differ) in that run's baseline. Failing and passing are judged on verdicts,
// i.e. after the report's expectations are applied to both results, so a
// known failure is never a new failure. "Fails" means the verdict is an
// unexpected failure (core/outcome.h IsUnexpectedFailure) other than
// unexpected_pass: an expectation that starts passing is reported through its
// verdict, but it is not a regression.
//
//   no_baseline     the run has no baseline (none given, none found).
//   new_case        the baseline has no result for it (whatever it does now).
//   removed         the baseline has a result, the run has none.
//   new_failure     fails now, did not in the baseline (passed, skipped, expected).
//   fixed           failed in the baseline, does not now.
//   still_failing   fails in both (the outcome may differ: "mismatch -> crash").
// When the stored outcome is pass in both, the numbers are compared:
//   drift           max_abs_err grew by drift_factor (now > factor * before)
//                   and by drift_floor (now - before > floor).
//   perf_*          on the fastest warm calls (Note [Fastest calls]):
//                   d = fastest - base_fastest with |d| > perf_spreads *
//                   min(noise, base noise) and |d| > perf_min_rel *
//                   base_fastest and |d| > perf_min_us; d > 0 is
//                   perf_regression, else perf_improvement. Op cases only
//                   (model items have no warm calls).
//   compile_change  the first-call overhead (first_call - warm, at least 0)
//                   changed by compile_factor (max / min) and by
//                   compile_min_us. Op cases only.
//   unchanged       none of the above.
// The main `change` is the most important that applies: new_failure > fixed >
// still_failing > drift > perf_regression > compile_change >
// perf_improvement > unchanged; the other drift/perf/compile findings go to
// extra_changes, and change_detail says all of them in words with numbers.
// Report::Regressed() is true for new_failure, drift and perf_regression.

// Note [Fastest calls]
// A warm latency is measured over a few calls (--warm, 3 by default). On a
// shared machine the noise is additive: a call whose thread loses its core
// for a scheduler slice (about 8 ms here, 50 ms and more with busy loops
// beside on 2 cores) takes that much longer, never shorter. So the fastest
// warm call is what the kernel costs, and performance is judged on it; the
// median (warm_us) is what the report shows. A run's noise is how far its
// median sits above its fastest call: one undisturbed run shows the kernel's
// own variation there. A change must exceed perf_spreads times the smaller
// of the two runs' noise, so that one disturbed run, baseline or now, cannot
// hide a change the other shows clearly. Measured: a relu baseline of
// [19, 20, 91000] us under two busy loops (median 20, spread 91 ms) hid a
// +100 ms regression under the old rule (3 x the larger spread); a baseline
// of [3090, 51812, 51812] (two calls disturbed) hid it under any rule on the
// median. The nightly measures suspects again with 10 warm calls and keeps
// those still slower by the same rule (Note [Re-measured performance] in
// apps/cmd_nightly.cc), which removes changes that only a disturbed run
// showed.
std::optional<WarmTiming> WarmTimingOf(const std::optional<double>& warm_us, const std::optional<double>& warm_min_us,
                                       const std::optional<double>& warm_spread_us) {
  if (!warm_us) return std::nullopt;
  if (warm_min_us) return WarmTiming{*warm_min_us, std::max(0.0, *warm_us - *warm_min_us), true};
  return WarmTiming{*warm_us, warm_spread_us.value_or(0), false};
}

std::optional<double> PerfChange(const WarmTiming& base, const WarmTiming& now, const ReportOptions& o) {
  const double d = now.fastest_us - base.fastest_us, size = std::abs(d);
  // A result stored before the fastest call was (schema v11) has only its
  // median and spread: medians are compared against the larger spread.
  const double noise = base.fastest_known && now.fastest_known ? std::min(base.noise_us, now.noise_us)
                                                                 : std::max(base.noise_us, now.noise_us);
  if (!(size > o.perf_spreads * noise && size > o.perf_min_rel * base.fastest_us && size > o.perf_min_us)) {
    return std::nullopt;
  }
  return d;
}

namespace {

using registry::Registry;

std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t j = text.find(' ', i);
    const size_t end = j == std::string::npos ? text.size() : j;
    if (end > i) out.push_back(text.substr(i, end - i));
    i = end + 1;
  }
  return out;
}

bool Fails(std::optional<Outcome> verdict) {
  return verdict && IsUnexpectedFailure(*verdict) && *verdict != Outcome::kUnexpectedPass;
}

struct Judged {
  Outcome verdict;
  const Expectation* expectation = nullptr;
};

// The verdict of `outcome` under the expectation covering its result (or none).
Judged Judge(Outcome outcome, const Expectation* e) {
  if (e == nullptr) return {outcome, nullptr};
  if (outcome == Outcome::kPass) return {Outcome::kUnexpectedPass, e};
  if (Fails(outcome) && e->Lists(outcome)) return {Outcome::kExpectedFailure, e};
  return {outcome, e};
}

std::string NowUtc() { return UtcNowIso8601Ms(); }

// ---- runs and baselines ----------------------------------------------------

RunInfo FromOverview(const registry::RunOverview& o) {
  const registry::RunRecord& r = o.run;
  RunInfo run{r.run_id, r.stage, r.backend, r.started_at, r.finished_at, r.host, r.git_revision, r.libtorch_version,
              r.config_json};
  run.results = o.unit_results + o.model_results;
  if (o.shard_count > 0) run.shards = fmt::format("{} of {} shards finished", o.shards_finished, o.shard_count);
  return run;
}

Result<RunInfo> LoadRun(Registry& registry, const std::string& run_id) {
  COV_ASSIGN_OR_RETURN(auto overview, registry.GetRunOverview(run_id));
  if (!overview) return Status::NotFound("no run '" + run_id + "' in the registry");
  return FromOverview(*overview);
}

bool IsUnitStage(const RunInfo& run) { return run.stage == "unit"; }

// What makes two runs comparable (Note [Run diffs]): the options that
// decide verdicts, and what was run. A run's stored configuration minus
// where it ran (shard, isolation) and the paths of its config files (their
// contents are in the judging options' digests): a one-case replay
// (`--case`), another filter or cost cap is not a baseline for a full run.
nlohmann::json JudgingOptions(const RunInfo& run) {
  nlohmann::json j = nlohmann::json::parse(run.config_json, nullptr, false);
  if (!j.is_object()) return nlohmann::json();
  // max_case_gb defaults to the machine's memory: a case it skips shows as
  // skipped, which the diff reports, rather than making runs incomparable.
  for (const char* k : {"shard", "isolation", "tolerances", "profiles", "max_case_gb"}) j.erase(k);
  return j;
}

// The last finished run of the same stage and backend before `run` in the
// run order (Note [Run order] in registry/reads.cc), judged with the same
// options; or the reason there is none.
Result<std::pair<std::optional<RunInfo>, std::string>> FindBaseline(Registry& registry, const RunInfo& run) {
  COV_ASSIGN_OR_RETURN(auto earlier, registry.FinishedRunsBefore(run.stage, run.backend, run.run_id));
  const nlohmann::json judging = JudgingOptions(run);
  for (const auto& overview : earlier) {
    RunInfo candidate = FromOverview(overview);
    if (JudgingOptions(candidate) == judging) return std::make_pair(std::optional<RunInfo>(candidate), std::string());
  }
  std::string why = "no finished " + run.stage + " run on " + run.backend + " started before it";
  if (!earlier.empty()) {
    why = std::to_string(earlier.size()) + " earlier finished " + run.stage + " run(s) on " + run.backend +
          " ran other cases or were judged with other options";
  }
  return std::make_pair(std::optional<RunInfo>(), why);
}

// ---- diffs (Note [Run diffs]) -------------------------------------------------

struct Finding {
  Change change;
  std::string detail;
};

int Priority(Change c) {
  constexpr Change kOrder[] = {Change::kNewFailure, Change::kFixed,         Change::kStillFailing,
                               Change::kDrift,      Change::kPerfRegression, Change::kCompileChange,
                               Change::kPerfImprovement};
  for (int i = 0; i < static_cast<int>(std::size(kOrder)); ++i) {
    if (kOrder[i] == c) return i;
  }
  return 100;
}

std::optional<Finding> VerdictChange(Outcome base_verdict, Outcome verdict) {
  const bool was = Fails(base_verdict), is = Fails(verdict);
  const std::string words = fmt::format("{} -> {}", OutcomeName(base_verdict), OutcomeName(verdict));
  if (!was && is) return Finding{Change::kNewFailure, words};
  if (was && !is) return Finding{Change::kFixed, words};
  if (was && is) return Finding{Change::kStillFailing, words};
  return std::nullopt;
}

std::optional<Finding> Drift(std::optional<double> base, std::optional<double> now, const ReportOptions& o) {
  if (!base || !now) return std::nullopt;
  if (!(*now > o.drift_factor * *base && *now - *base > o.drift_floor)) return std::nullopt;
  std::string ratio = *base > 0 ? fmt::format(" ({:.3g}x)", *now / *base) : std::string();
  return Finding{Change::kDrift, fmt::format("max abs error {:.1e} -> {:.1e}{}", *base, *now, ratio)};
}

std::optional<Finding> Perf(const CaseEntry& c, const ReportOptions& o) {
  const auto now = WarmTimingOf(c.warm_us, c.warm_min_us, c.warm_spread_us);
  const auto base = WarmTimingOf(c.baseline_warm_us, c.baseline_warm_min_us, c.baseline_warm_spread_us);
  if (!now || !base) return std::nullopt;
  const auto d = PerfChange(*base, *now, o);
  if (!d) return std::nullopt;
  const std::string rel = base->fastest_us > 0 ? fmt::format(", {:+.0f}%", 100 * *d / base->fastest_us) : std::string();
  return Finding{*d > 0 ? Change::kPerfRegression : Change::kPerfImprovement,
                 fmt::format("{} {:.1f} us -> {:.1f} us ({:+.1f} us{})",
                             base->fastest_known && now->fastest_known ? "fastest warm call" : "warm", base->fastest_us,
                             now->fastest_us, *d, rel)};
}

std::optional<Finding> Compile(const CaseEntry& c, const ReportOptions& o) {
  if (!c.first_call_us || !c.warm_us || !c.baseline_first_call_us || !c.baseline_warm_us) return std::nullopt;
  const double before = std::max(0.0, *c.baseline_first_call_us - *c.baseline_warm_us);
  const double now = std::max(0.0, *c.first_call_us - *c.warm_us);
  const double lo = std::min(before, now), hi = std::max(before, now);
  if (!(hi - lo > o.compile_min_us && hi >= o.compile_factor * lo)) return std::nullopt;
  const std::string ratio = lo > 0 ? fmt::format(" ({:.3g}x)", now / before) : std::string();
  return Finding{Change::kCompileChange,
                 fmt::format("first-call overhead {:.0f} us -> {:.0f} us{}", before, now, ratio)};
}

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

// ---- unit runs -------------------------------------------------------------

CaseEntry FromRow(const std::string& run_id, const registry::CaseResultRow& row) {
  const registry::ResultRecord& r = row.result;
  CaseEntry c;
  c.run_id = run_id;
  c.key = row.key;
  c.op = row.op;
  c.summary = row.summary;
  c.dtypes = row.dtypes;
  c.outcome = r.outcome;
  c.error = r.error;
  c.max_abs_err = r.max_abs_err;
  c.max_rel_err = r.max_rel_err;
  c.mismatch_frac = r.mismatch_frac;
  c.cosine = r.cosine;
  c.error_ratio = r.error_ratio;
  c.first_call_us = r.first_call_us;
  c.warm_us = r.warm_us;
  c.warm_spread_us = r.warm_spread_us;
  c.warm_min_us = r.warm_min_us;
  c.attempts = r.attempts;
  c.flaky = r.flaky;
  c.attempt_outcomes = r.attempt_outcomes;
  c.counters_json = r.counters_json;
  return c;
}

using CaseMap = std::unordered_map<int64_t, CaseEntry>;

// The results of `run_id` by case id; none for "" (no baseline).
Result<CaseMap> LoadCases(Registry& registry, const std::string& run_id) {
  if (run_id.empty()) return CaseMap();
  COV_ASSIGN_OR_RETURN(auto rows, registry.CaseResultsForRun(run_id));
  CaseMap out;
  out.reserve(rows.size());
  for (const auto& row : rows) out.emplace(row.result.case_id, FromRow(run_id, row));
  return out;
}

// Provenance of every case with a result in either run, in one query.
Status AddProvenance(Registry& registry, const std::string& run_id, const std::string& baseline_id, CaseMap& now,
                     CaseMap& removed) {
  COV_ASSIGN_OR_RETURN(auto rows, registry.CaseModelsOfRuns(run_id, baseline_id));
  for (const auto& row : rows) {
    const int64_t id = row.case_id;
    auto it = now.find(id);
    CaseEntry* c = it != now.end() ? &it->second : nullptr;
    if (c == nullptr) {
      auto r = removed.find(id);
      if (r == removed.end()) continue;
      c = &r->second;
    }
    if (c->models.empty() || c->models.back() != row.model_id) c->models.push_back(row.model_id);
    if (!row.model_type.empty()) c->families.push_back(row.model_type);
  }
  COV_ASSIGN_OR_RETURN(auto opinfos, registry.CaseOpInfosOfRuns(run_id, baseline_id));
  for (const auto& [id, name] : opinfos) {
    auto it = now.find(id);
    if (it != now.end()) {
      it->second.opinfos.push_back(name);
    } else if (auto r = removed.find(id); r != removed.end()) {
      r->second.opinfos.push_back(name);
    }
  }
  auto tidy = [](CaseEntry& c) {
    std::sort(c.families.begin(), c.families.end());
    c.families.erase(std::unique(c.families.begin(), c.families.end()), c.families.end());
  };
  for (auto& [id, c] : now) tidy(c);
  for (auto& [id, c] : removed) tidy(c);
  return Status::Ok();
}

class Builder {
 public:
  Builder(Registry& registry, const ReportOptions& options)
      : registry_(registry), options_(options), matched_(options.expectations.entries.size(), 0) {}

  Result<Report> Build();

 private:
  // Cases and items loaded from the registry always have an outcome.
  Judged JudgeCase(const CaseEntry& c, bool count) {
    const Expectation* e = options_.expectations.MatchCase(c.op, c.key, Words(c.dtypes), c.outcome);
    if (e != nullptr && count) ++matched_[e - options_.expectations.entries.data()];
    return Judge(*c.outcome, e);
  }
  Judged JudgeItem(const std::string& model_id, const ModelItemEntry& item, bool count) {
    const Expectation* e = options_.expectations.MatchModelItem(item.stage, model_id, item.item, item.outcome);
    if (e != nullptr && count) ++matched_[e - options_.expectations.entries.data()];
    return Judge(*item.outcome, e);
  }

  Status AddUnitRun(const RunInfo& run, const std::optional<RunInfo>& baseline);
  Status AddModelRun(const RunInfo& run, const std::optional<RunInfo>& baseline);
  void DiffCase(CaseEntry& c, const CaseEntry& base);
  void Finish();

  Registry& registry_;
  const ReportOptions& options_;
  std::vector<int64_t> matched_;  // per expectation: results it covered
  Report report_;
  std::map<std::string, ModelEntry> models_;
};

void SetBaseline(CaseEntry& c, const CaseEntry& base) {
  c.baseline_run_id = base.run_id;
  c.baseline_outcome = base.outcome;
  c.baseline_max_abs_err = base.max_abs_err;
  c.baseline_first_call_us = base.first_call_us;
  c.baseline_warm_us = base.warm_us;
  c.baseline_warm_spread_us = base.warm_spread_us;
  c.baseline_warm_min_us = base.warm_min_us;
}

void Builder::DiffCase(CaseEntry& c, const CaseEntry& base) {
  SetBaseline(c, base);
  std::vector<Finding> findings;
  if (auto f = VerdictChange(JudgeCase(base, false).verdict, *c.verdict)) findings.push_back(*f);
  if (c.outcome == Outcome::kPass && base.outcome == Outcome::kPass) {
    for (auto f : {Drift(base.max_abs_err, c.max_abs_err, options_), Perf(c, options_), Compile(c, options_)}) {
      if (f) findings.push_back(*f);
    }
  }
  ApplyFindings(c, std::move(findings));
}

Status Builder::AddUnitRun(const RunInfo& run, const std::optional<RunInfo>& baseline) {
  const std::string baseline_id = baseline ? baseline->run_id : std::string();
  COV_ASSIGN_OR_RETURN(CaseMap now, LoadCases(registry_, run.run_id));
  COV_ASSIGN_OR_RETURN(const CaseMap before, LoadCases(registry_, baseline_id));
  CaseMap removed;
  for (auto& [id, c] : before) {
    if (!now.count(id)) removed.emplace(id, c);
  }
  COV_RETURN_IF_ERROR(AddProvenance(registry_, run.run_id, baseline_id, now, removed));

  for (auto& [id, c] : now) {
    const Judged j = JudgeCase(c, true);
    c.verdict = j.verdict;
    if (j.expectation) c.expectation = j.expectation->reason;
    if (!baseline) {
      c.change = Change::kNoBaseline;
    } else if (auto b = before.find(id); b == before.end()) {
      c.change = Change::kNewCase;
    } else {
      DiffCase(c, b->second);
    }
    report_.cases.push_back(std::move(c));
  }
  for (auto& [id, base] : removed) {
    CaseEntry c;  // the case as it was; nothing of this run
    c.key = base.key;
    c.op = base.op;
    c.summary = base.summary;
    c.dtypes = base.dtypes;
    c.models = base.models;
    c.families = base.families;
    SetBaseline(c, base);
    c.change = Change::kRemoved;
    c.change_detail = fmt::format("in {} ({}), not in {}", base.run_id, OutcomeName(*base.outcome), run.run_id);
    report_.cases.push_back(std::move(c));
  }
  return Status::Ok();
}

// ---- model-level runs --------------------------------------------------------

using ItemKey = std::tuple<std::string, std::string, std::string>;  // model, stage, item

// The "first_divergent" object of a model result's detail (written by
// replay/program_replay.cc); none when absent or not readable.
std::optional<FirstDivergent> ReadFirstDivergent(const std::string& detail_json) {
  auto j = nlohmann::json::parse(detail_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("first_divergent") || !j["first_divergent"].is_object()) return std::nullopt;
  const auto& d = j["first_divergent"];
  FirstDivergent f;
  auto text = [&](const char* k) { return d.contains(k) && d[k].is_string() ? d[k].get<std::string>() : ""; };
  auto number = [&](const char* k) -> std::optional<double> {
    if (d.contains(k) && d[k].is_number()) return d[k].get<double>();
    return std::nullopt;
  };
  if (d.contains("call") && d["call"].is_number_integer()) f.call = d["call"].get<int64_t>();
  f.op = text("op");
  f.case_key = text("case_key");
  f.module = text("module");
  f.phase = text("phase");
  f.outcome = text("outcome");
  f.message = text("message");
  f.max_abs_err = number("max_abs_err");
  f.error_ratio = number("error_ratio");
  return f;
}

Result<std::map<ItemKey, ModelItemEntry>> LoadItems(Registry& registry, const std::string& run_id,
                                                     std::vector<ItemKey>* order,
                                                     std::map<std::string, std::string>* families) {
  COV_ASSIGN_OR_RETURN(auto rows, registry.ModelResultsForRun(run_id, /*as_stored=*/true));
  std::map<ItemKey, ModelItemEntry> out;
  for (const auto& r : rows) {
    ModelItemEntry e;
    e.run_id = run_id;
    e.profile = r.profile;
    e.stage = r.stage;
    e.item = r.item;
    e.outcome = r.outcome;
    e.error = r.error;
    e.blocked_by = r.blocked_by;
    e.max_abs_err = r.max_abs_err;
    e.max_rel_err = r.max_rel_err;
    e.cosine = r.cosine;
    e.error_ratio = r.error_ratio;
    e.seconds = r.seconds;
    e.attempts = r.attempts;
    e.flaky = r.flaky;
    e.first_divergent = ReadFirstDivergent(r.detail_json);
    ItemKey key{r.model_id, r.stage, r.item};
    if (order) order->push_back(key);
    if (families && !r.family.empty()) families->emplace(r.model_id, r.family);
    out.emplace(std::move(key), std::move(e));
  }
  return out;
}

Status Builder::AddModelRun(const RunInfo& run, const std::optional<RunInfo>& baseline) {
  std::vector<ItemKey> order;
  std::map<std::string, std::string> families;
  COV_ASSIGN_OR_RETURN(auto now, LoadItems(registry_, run.run_id, &order, &families));
  std::map<ItemKey, ModelItemEntry> before;
  if (baseline) {
    COV_ASSIGN_OR_RETURN(before, LoadItems(registry_, baseline->run_id, nullptr, &families));
  }

  for (const ItemKey& key : order) {
    const auto& [model_id, stage, item_name] = key;
    ModelItemEntry item = std::move(now.at(key));
    const Judged j = JudgeItem(model_id, item, true);
    item.verdict = j.verdict;
    if (j.expectation) item.expectation = j.expectation->reason;
    if (!baseline) {
      item.change = Change::kNoBaseline;
    } else if (auto b = before.find(key); b == before.end()) {
      item.change = Change::kNewCase;
    } else {
      item.baseline_outcome = b->second.outcome;
      std::vector<Finding> findings;
      if (auto f = VerdictChange(JudgeItem(model_id, b->second, false).verdict, *item.verdict)) {
        findings.push_back(*f);
      }
      if (item.outcome == Outcome::kPass && b->second.outcome == Outcome::kPass) {
        if (auto f = Drift(b->second.max_abs_err, item.max_abs_err, options_)) findings.push_back(*f);
      }
      ApplyFindings(item, std::move(findings));
      before.erase(b);
    }
    ModelEntry& model = models_[model_id];
    model.model_id = model_id;
    model.items.push_back(std::move(item));
  }
  for (auto& [key, base] : before) {  // what is left was not run this time
    ModelItemEntry item;
    item.stage = base.stage;
    item.item = base.item;
    item.profile = base.profile;
    item.baseline_outcome = base.outcome;
    item.change = Change::kRemoved;
    item.change_detail =
        fmt::format("in {} ({}), not in {}", baseline->run_id, OutcomeName(*base.outcome), run.run_id);
    ModelEntry& model = models_[std::get<0>(key)];
    model.model_id = std::get<0>(key);
    model.items.push_back(std::move(item));
  }
  for (auto& [id, family] : families) {
    auto m = models_.find(id);
    if (m != models_.end() && m->second.family.empty()) m->second.family = family;
  }
  return Status::Ok();
}

// ---- what follows from all runs ------------------------------------------------

// The verdict standing for a model's stage: its first failing item, else
// skipped if an item was, else unexpected_pass, else expected_failure, else pass.
Outcome StageVerdict(const std::vector<const ModelItemEntry*>& items) {
  for (const auto* i : items) {
    if (Fails(i->verdict)) return *i->verdict;
  }
  for (Outcome v : {Outcome::kSkipped, Outcome::kUnexpectedPass, Outcome::kExpectedFailure}) {
    for (const auto* i : items) {
      if (i->verdict == v) return v;
    }
  }
  return Outcome::kPass;
}

int StageRank(const std::string& stage) {
  constexpr std::string_view kStages[] = {"unit", "module", "model", "train"};
  for (int i = 0; i < 4; ++i) {
    if (kStages[i] == stage) return i;
  }
  return 4;
}

void Builder::Finish() {
  Report& r = report_;
  // Models: stage verdicts and whether they fail.
  std::set<std::string> failing_models;
  for (auto& [id, model] : models_) {
    std::map<std::string, std::vector<const ModelItemEntry*>> by_stage;
    for (const auto& item : model.items) {
      if (item.change != Change::kRemoved) by_stage[item.stage].push_back(&item);
    }
    for (const auto& [stage, items] : by_stage) model.stage_verdict[stage] = StageVerdict(items);
    model.failing = std::any_of(model.items.begin(), model.items.end(),
                                [](const ModelItemEntry& i) { return Fails(i.verdict); });
    if (model.failing) failing_models.insert(id);
  }

  // Root cause and blockers: failing op cases of reported unit runs, traced
  // through provenance to the failing models that captured them.
  for (const CaseEntry& c : r.cases) {
    if (c.change == Change::kRemoved || !Fails(c.verdict)) continue;
    Blocker b{c.key, c.op, c.summary, c.verdict, {}};
    for (const std::string& m : c.models) {
      if (!failing_models.count(m)) continue;
      models_[m].failing_cases.push_back(c.key);
      b.models.push_back(m);
    }
    if (!b.models.empty()) r.blockers.push_back(std::move(b));
  }
  std::sort(r.blockers.begin(), r.blockers.end(), [](const Blocker& a, const Blocker& b) {
    return std::make_tuple(-static_cast<int64_t>(a.models.size()), a.op, a.key) <
           std::make_tuple(-static_cast<int64_t>(b.models.size()), b.op, b.key);
  });
  for (auto& [id, model] : models_) {
    std::sort(model.failing_cases.begin(), model.failing_cases.end());
    model.failing_cases.erase(std::unique(model.failing_cases.begin(), model.failing_cases.end()),
                              model.failing_cases.end());
  }

  // Stage summaries and the stage x family matrix. Skipped results count in
  // neither a pass rate's denominator nor a matrix cell: they were not judged.
  // Rows are model types (models.model_type: "llama", "bert"), as for unit
  // cases through their source models, so that one model lands in one row
  // across all stages; a model without a known type falls back to its
  // structure.
  std::map<std::string, std::string> model_types;
  {
    std::vector<std::string> ids;
    for (const auto& [id, model] : models_) ids.push_back(id);
    auto types = registry_.ModelTypes(ids);
    if (types) model_types = std::move(*types);  // else the matrix uses structures
  }
  std::map<std::string, StageSummary> stages;
  auto count = [&](const std::string& stage, Outcome verdict) {
    StageSummary& s = stages[stage];
    s.stage = stage;
    ++s.verdicts[verdict];
    ++s.total;
  };
  auto cell = [&](std::string family, const std::string& stage, Outcome verdict) {
    if (verdict == Outcome::kSkipped) return;
    if (family.empty()) family = "unknown";
    auto& [passing, total] = r.matrix[family][stage];
    passing += Passes(verdict) ? 1 : 0;
    ++total;
  };
  for (const CaseEntry& c : r.cases) {
    if (c.change == Change::kRemoved) continue;
    const Outcome verdict = *c.verdict;  // every case of a reported run was judged
    count("unit", verdict);
    StageSummary& unit = stages["unit"];
    if (!c.models.empty()) ++unit.by_source["captured"][verdict];
    if (!c.opinfos.empty()) {
      ++unit.by_source["opinfo"][verdict];
      cell(kOpInfoFamily, "unit", verdict);
    }
    if (c.families.empty() && c.opinfos.empty()) cell("", "unit", verdict);
    for (const auto& f : c.families) cell(f, "unit", verdict);
  }
  for (const auto& [id, model] : models_) {
    for (const auto& [stage, verdict] : model.stage_verdict) {
      count(stage, verdict);
      auto type = model_types.find(id);
      cell(type != model_types.end() ? type->second : model.family, stage, verdict);
    }
  }
  for (auto& [name, s] : stages) {
    int64_t passing = 0;
    for (const auto& [v, n] : s.verdicts) passing += Passes(v) ? n : 0;
    const int64_t judged = s.total - (s.verdicts.count(Outcome::kSkipped) ? s.verdicts.at(Outcome::kSkipped) : 0);
    s.pass_rate = judged > 0 ? static_cast<double>(passing) / static_cast<double>(judged) : 0;
    r.stages.push_back(s);
  }
  std::sort(r.stages.begin(), r.stages.end(),
            [](const StageSummary& a, const StageSummary& b) { return StageRank(a.stage) < StageRank(b.stage); });

  // Change counts, order, repro commands.
  for (const CaseEntry& c : r.cases) ++r.changes[c.change];
  for (const auto& [id, model] : models_) {
    for (const auto& item : model.items) ++r.changes[item.change];
  }
  auto regression_rank = [](Change c) {
    return c == Change::kNewFailure ? 0 : c == Change::kDrift ? 1 : c == Change::kPerfRegression ? 2 : 3;
  };
  std::sort(r.cases.begin(), r.cases.end(), [&](const CaseEntry& a, const CaseEntry& b) {
    return std::make_tuple(regression_rank(a.change), std::cref(a.op), std::cref(a.key), std::cref(a.run_id)) <
           std::make_tuple(regression_rank(b.change), std::cref(b.op), std::cref(b.key), std::cref(b.run_id));
  });
  const std::string registry_flag =
      options_.registry_path.empty() ? std::string() : " --registry " + ShellQuote(options_.registry_path);
  for (CaseEntry& c : r.cases) c.repro = "coverage" + registry_flag + " repro " + ShellQuote(c.key);

  for (auto& [id, model] : models_) r.models.push_back(std::move(model));
  FindBroken(r);
  std::stable_sort(r.models.begin(), r.models.end(),
                   [](const ModelEntry& a, const ModelEntry& b) { return a.failing && !b.failing; });

  for (size_t i = 0; i < matched_.size(); ++i) {
    if (matched_[i] > 0) continue;
    const Expectation& e = options_.expectations.entries[i];
    r.warnings.push_back(fmt::format("expectation {} of {} ({}) matched no result: remove it or fix its fields",
                                     i, options_.expectations.source, e.reason));
  }
}

Result<Report> Builder::Build() {
  if (options_.run_ids.empty()) return Status::InvalidArgument("a report needs at least one run id");
  Report& r = report_;
  r.registry_path = options_.registry_path;
  r.generated_at = NowUtc();
  {
    COV_ASSIGN_OR_RETURN(registry::PipelineCounts p, registry_.GetPipelineCounts());
    PipelineInfo& info = r.pipeline;
    info.crawls = p.crawls;
    info.models_listed = p.models;
    info.configs_fetched = p.configs_fetched;
    info.selection_id = p.selection_id;
    info.selection_k = p.selection_k;
    info.selection_models = p.selection_models;
    info.representatives = p.representatives;
    info.families = p.coarse_total;
    info.families_covered = p.coarse_covered;
    info.capture_statuses = p.program_statuses;
    for (const auto& [status, n] : p.program_statuses) {
      (status == "captured" ? info.pairs_captured : info.pairs_not_captured) += n;
    }
    info.models_captured = p.models_captured;
    info.op_cases = p.op_cases;
  }
  for (const auto& id : options_.run_ids) {
    COV_ASSIGN_OR_RETURN(RunInfo run, LoadRun(registry_, id));
    r.runs.push_back(std::move(run));
  }
  std::vector<RunInfo> explicit_baselines;
  for (const auto& id : options_.baseline_run_ids) {
    COV_ASSIGN_OR_RETURN(RunInfo run, LoadRun(registry_, id));
    explicit_baselines.push_back(std::move(run));
  }
  std::vector<bool> used(explicit_baselines.size(), false);

  for (const RunInfo& run : r.runs) {
    if (run.finished_at.empty()) {
      r.warnings.push_back("run " + run.run_id + " is not finished" + (run.shards.empty() ? "" : " (" + run.shards + ")") +
                           ": its results are partial");
    }
    if (!options_.expectations.backend.empty() && options_.expectations.backend != run.backend) {
      r.warnings.push_back("expectations " + options_.expectations.source + " are for backend " +
                           options_.expectations.backend + ", run " + run.run_id + " is on " + run.backend);
    }
    std::optional<RunInfo> baseline;
    std::string why;
    if (!explicit_baselines.empty()) {
      for (size_t i = 0; i < explicit_baselines.size() && !baseline; ++i) {
        if (explicit_baselines[i].stage != run.stage) continue;
        baseline = explicit_baselines[i];
        used[i] = true;
      }
      if (!baseline) why = "no baseline given has stage " + run.stage;
    } else if (options_.find_baseline) {
      COV_ASSIGN_OR_RETURN(auto found, FindBaseline(registry_, run));
      baseline = std::move(found.first);
      why = std::move(found.second);
    } else {
      why = "none given";
    }
    if (baseline) {
      if (JudgingOptions(*baseline) != JudgingOptions(run)) {
        r.warnings.push_back("baseline " + baseline->run_id + " of run " + run.run_id +
                             " was judged with other options: differences may come from them");
      }
      r.baselines.push_back(*baseline);
    } else {
      r.warnings.push_back("no baseline for run " + run.run_id + ": " + why);
    }
    COV_RETURN_IF_ERROR(IsUnitStage(run) ? AddUnitRun(run, baseline) : AddModelRun(run, baseline));
  }
  for (size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) {
      r.warnings.push_back("baseline " + explicit_baselines[i].run_id + " (stage " + explicit_baselines[i].stage +
                           ") matches no reported run");
    }
  }

  std::set<std::string> backends;
  std::string ids;
  for (const RunInfo& run : r.runs) {
    backends.insert(run.backend);
    ids += " " + run.run_id;
  }
  std::string backend;
  for (const auto& b : backends) backend += (backend.empty() ? "" : ",") + b;
  r.title = options_.title.empty() ? "coverage: " + backend + ids : options_.title;
  Finish();
  return std::move(report_);
}

}  // namespace

std::string_view ChangeName(Change change) {
  switch (change) {
    case Change::kNoBaseline: return "no_baseline";
    case Change::kNewCase: return "new_case";
    case Change::kRemoved: return "removed";
    case Change::kNewFailure: return "new_failure";
    case Change::kFixed: return "fixed";
    case Change::kStillFailing: return "still_failing";
    case Change::kDrift: return "drift";
    case Change::kPerfRegression: return "perf_regression";
    case Change::kPerfImprovement: return "perf_improvement";
    case Change::kCompileChange: return "compile_change";
    case Change::kUnchanged: return "unchanged";
  }
  return "unknown";
}

bool IsRegression(Change change) {
  return change == Change::kNewFailure || change == Change::kDrift || change == Change::kPerfRegression;
}

bool Report::Regressed() const {
  return std::any_of(changes.begin(), changes.end(), [](const auto& c) { return IsRegression(c.first) && c.second > 0; });
}

int64_t Report::CountOf(Change change) const {
  auto it = changes.find(change);
  return it == changes.end() ? 0 : it->second;
}

bool Passes(Outcome verdict) {
  return verdict == Outcome::kPass || verdict == Outcome::kExpectedFailure || verdict == Outcome::kUnexpectedPass;
}

std::vector<std::pair<Outcome, int64_t>> StageSummary::VerdictsInNameOrder() const {
  std::vector<std::pair<Outcome, int64_t>> out(verdicts.begin(), verdicts.end());
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return OutcomeName(a.first) < OutcomeName(b.first); });
  return out;
}

std::string_view OutcomeNameOrEmpty(const std::optional<Outcome>& outcome) {
  return outcome ? OutcomeName(*outcome) : std::string_view();
}

// Note [What is broken]
// The report opens with what fails now, before what changed: a first run has
// no baseline, and a backend team's first question is which ops, dtypes and
// models do not work. Op cases failing unexpectedly are grouped by op and
// dtypes, the group's worst error ratio against the fp64 golden beside it
// (how much worse than the CPU's own rounding the backend is); models list
// their earliest failing stage item with the call the replay first went
// wrong at, whose op case is in the case table.
void FindBroken(Report& r) {
  r.broken_ops.clear();
  r.broken_models.clear();
  std::map<std::pair<std::string, std::string>, BrokenOp> ops;
  std::map<std::pair<std::string, std::string>, std::set<std::string>> models_of;
  for (const CaseEntry& c : r.cases) {
    if (c.change == Change::kRemoved || !Fails(c.verdict)) continue;
    const auto group = std::make_pair(c.op, c.dtypes);
    BrokenOp& b = ops[group];
    b.op = c.op;
    b.dtypes = c.dtypes;
    ++b.cases;
    ++b.verdicts[*c.verdict];
    if (c.change == Change::kNewFailure) ++b.new_failures;
    if (b.worst_key.empty()) b.worst_key = c.key;
    if (c.error_ratio && std::isfinite(*c.error_ratio) &&
        (!b.worst_error_ratio || *c.error_ratio > *b.worst_error_ratio)) {
      b.worst_error_ratio = c.error_ratio;
      b.worst_key = c.key;
    }
    models_of[group].insert(c.models.begin(), c.models.end());
  }
  for (auto& [group, b] : ops) {
    b.models.assign(models_of[group].begin(), models_of[group].end());
    r.broken_ops.push_back(std::move(b));
  }
  std::sort(r.broken_ops.begin(), r.broken_ops.end(), [](const BrokenOp& a, const BrokenOp& b) {
    return std::make_tuple(-a.cases, -static_cast<int64_t>(a.models.size()), a.op, a.dtypes) <
           std::make_tuple(-b.cases, -static_cast<int64_t>(b.models.size()), b.op, b.dtypes);
  });
  static const std::vector<std::string> kStages = {"module", "model", "train"};
  auto stage_rank = [](const std::string& stage) {
    auto it = std::find(kStages.begin(), kStages.end(), stage);
    return static_cast<int>(it - kStages.begin());
  };
  for (const ModelEntry& model : r.models) {
    if (!model.failing) continue;
    const std::string& id = model.model_id;
    const ModelItemEntry* first = nullptr;
    for (const ModelItemEntry& item : model.items) {
      if (item.change == Change::kRemoved || !Fails(item.verdict)) continue;
      if (first == nullptr || stage_rank(item.stage) < stage_rank(first->stage)) first = &item;
    }
    if (first == nullptr) continue;
    BrokenModel b;
    b.model_id = id;
    b.family = model.family;
    b.stage = first->stage;
    b.item = first->item;
    b.profile = first->profile;
    b.error = first->error;
    b.verdict = *first->verdict;
    b.first_divergent = first->first_divergent;
    b.error_ratio = first->error_ratio;
    b.is_new = first->change == Change::kNewFailure;
    r.broken_models.push_back(std::move(b));
  }
  std::sort(r.broken_models.begin(), r.broken_models.end(), [&](const BrokenModel& a, const BrokenModel& b) {
    return std::make_tuple(stage_rank(a.stage), a.model_id) < std::make_tuple(stage_rank(b.stage), b.model_id);
  });
}

Result<Report> BuildReport(registry::Registry& registry, const ReportOptions& options) {
  return Builder(registry, options).Build();
}

}  // namespace coverage::reports
