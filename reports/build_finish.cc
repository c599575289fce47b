// What follows from all reported runs together: each model's stage verdicts,
// root causes and blockers, stage summaries, the stage x family matrix,
// change counts, repro commands, warnings about expectations that matched
// nothing, and what is broken (Note [What is broken]).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/outcome.h"
#include "core/text_safety.h"
#include "registry/registry.h"
#include "reports/build_parts.h"
#include "reports/report.h"

namespace coverage::reports {
namespace build {
namespace {

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

}  // namespace

void Builder::Finish() {
  Report& r = report_;
  // Models: stage verdicts and whether they fail.
  std::set<std::string> failing_models;
  for (auto& [id, model] : models_) {
    std::map<std::string, std::vector<const ModelItemEntry*>> by_stage;
    for (const auto& item : model.items) {
      if (item.change != Change::kRemoved) by_stage[item.Record().stage].push_back(&item);
    }
    for (const auto& [stage, items] : by_stage) model.stage_verdict[stage] = StageVerdict(items);
    model.failing = std::any_of(model.items.begin(), model.items.end(),
                                [](const ModelItemEntry& i) { return Fails(i.verdict); });
    if (model.failing) failing_models.insert(id);
  }

  // Root cause: failing op cases of reported unit runs, traced through
  // provenance to the failing models that captured them. Blockers: of those,
  // the ones a failing model's items located as their first wrong call (an
  // op case that merely occurs in a failing model blocks nothing).
  std::map<std::string, std::set<std::string>> located;  // model -> case keys of its failing items' first wrong calls
  for (const auto& [id, model] : models_) {
    for (const auto& item : model.items) {
      if (item.change != Change::kRemoved && Fails(item.verdict) && item.first_divergent &&
          !item.first_divergent->case_key.empty()) {
        located[id].insert(item.first_divergent->case_key);
      }
    }
  }
  for (const CaseEntry& c : r.cases) {
    if (c.change == Change::kRemoved || !Fails(c.verdict)) continue;
    Blocker b{c.key, c.op, c.summary, c.verdict, {}};
    for (const std::string& m : c.models) {
      if (!failing_models.count(m)) continue;
      models_[m].failing_cases.push_back(c.key);
      if (auto l = located.find(m); l != located.end() && l->second.count(c.key)) b.models.push_back(m);
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

}  // namespace build

using build::Fails;

// Note [What is broken]
// The report opens with what fails now, before what changed: a first run has
// no baseline, and a backend team's first question is which ops, dtypes and
// models do not work. Op cases failing unexpectedly are grouped by op and
// dtypes, the group's worst error ratio against the fp64 golden beside it
// (how much worse than the CPU's own rounding the backend is); models list
// their earliest failing stage item with the call the replay first went
// wrong at, whose op case is in the case table, or the call a crashed or
// hung worker was in, or in words why no call is named (every call was
// within its tolerance and the error accumulated; the search stopped).
// What answered differently when run again (a rerun, a warm call) is listed
// as flaky beside the counts.
std::string_view OpSupport::Support() const {
  if (unsupported > 0) return unsupported == cases ? "N" : "partly";
  return "CPU fallback";
}

namespace {

// The case's op ran through the backend's host fallback, by its counters:
// "fallback:<op>" where the backend counts per op (sim, sim/sim_fallback.cc;
// its fallback also serves the views that place inputs, which are not the
// op), else "fallbacks" where it counts only in all.
bool RanOnAHostFallback(const CaseResult& result, const std::string& op) {
  bool per_op = false;
  for (const auto& [name, n] : result.counters) per_op = per_op || name.rfind("fallback:", 0) == 0;
  const auto it = result.counters.find(per_op ? "fallback:" + op : std::string("fallbacks"));
  return it != result.counters.end() && it->second > 0;
}

void FindLacks(Report& r) {
  r.lacks.clear();
  std::map<std::pair<std::string, std::string>, OpSupport> groups;
  for (const CaseEntry& c : r.cases) {
    if (c.change == Change::kRemoved || !c.result || c.result->outcome == Outcome::kSkipped) continue;
    OpSupport& s = groups[{c.op, c.dtypes}];
    s.op = c.op;
    s.dtypes = c.dtypes;
    ++s.cases;
    if (c.result->outcome == Outcome::kUnsupported) {
      if (s.unsupported++ == 0) {
        s.missing = MissingKernel(c.result->error);
        s.example_key = c.key;
      }
    } else if (RanOnAHostFallback(*c.result, c.op)) {
      if (s.fallback++ == 0 && s.example_key.empty()) s.example_key = c.key;
    }
  }
  for (auto& [group, s] : groups) {
    if (s.unsupported + s.fallback > 0) r.lacks.push_back(std::move(s));
  }
  auto rank = [](const OpSupport& s) { return s.unsupported == s.cases ? 0 : s.unsupported > 0 ? 1 : 2; };
  std::stable_sort(r.lacks.begin(), r.lacks.end(),
                   [&](const OpSupport& a, const OpSupport& b) { return rank(a) < rank(b); });
}

}  // namespace

void FindBroken(Report& r) {
  FindLacks(r);
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
    const std::optional<double>& ratio = c.ResultOrEmpty().error_ratio;
    if (ratio && std::isfinite(*ratio) && (!b.worst_error_ratio || *ratio > *b.worst_error_ratio)) {
      b.worst_error_ratio = ratio;
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
      if (first == nullptr || stage_rank(item.Record().stage) < stage_rank(first->Record().stage)) first = &item;
    }
    if (first == nullptr) continue;
    const registry::ModelResultRecord& record = first->Record();
    BrokenModel b;
    b.model_id = id;
    b.family = model.family;
    b.stage = record.stage;
    b.item = record.result.item;
    b.profile = record.profile;
    b.error = record.result.error;
    b.verdict = *first->verdict;
    b.first_divergent = first->first_divergent;
    b.locate_note = first->locate_note;
    b.error_ratio = record.result.error_ratio;
    b.is_new = first->change == Change::kNewFailure;
    r.broken_models.push_back(std::move(b));
  }
  std::sort(r.broken_models.begin(), r.broken_models.end(), [&](const BrokenModel& a, const BrokenModel& b) {
    return std::make_tuple(stage_rank(a.stage), a.model_id) < std::make_tuple(stage_rank(b.stage), b.model_id);
  });
}

}  // namespace coverage::reports
