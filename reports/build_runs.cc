// One reported run against its baseline: every op case (AddUnitRun) or model
// item (AddModelRun) gets its verdict after the expectations and its change
// (Note [Run diffs] in build.cc).
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/outcome.h"
#include "reports/build_parts.h"

namespace coverage::reports::build {

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

Judged Judge(Outcome outcome, const Expectation* e) {
  if (e == nullptr) return {outcome, nullptr};
  if (outcome == Outcome::kPass) return {Outcome::kUnexpectedPass, e};
  if (Fails(outcome) && e->Lists(outcome)) return {Outcome::kExpectedFailure, e};
  return {outcome, e};
}

void Builder::DiffCase(CaseEntry& c, CaseEntry& base) {
  const Outcome base_verdict = JudgeCase(base, false).verdict;
  c.baseline_run_id = base.run_id;
  c.baseline = std::move(base.result);
  const CaseResult& now = *c.result;
  const CaseResult& before = *c.baseline;
  std::vector<Finding> findings;
  if (auto f = VerdictChange(base_verdict, *c.verdict)) findings.push_back(*f);
  if (now.outcome == Outcome::kPass && before.outcome == Outcome::kPass) {
    for (auto f : {Drift(before.max_abs_err, now.max_abs_err, options_), Perf(before, now, options_),
                   Compile(before, now, options_)}) {
      if (f) findings.push_back(*f);
    }
  }
  ApplyFindings(c, std::move(findings));
}

Status Builder::AddUnitRun(const RunInfo& run, const std::optional<RunInfo>& baseline) {
  const std::string baseline_id = baseline ? baseline->run_id : std::string();
  COV_ASSIGN_OR_RETURN(CaseMap now, LoadCases(registry_, run.run_id));
  COV_ASSIGN_OR_RETURN(CaseMap before, LoadCases(registry_, baseline_id));
  CaseMap removed;
  for (auto& [id, c] : before) {
    if (!now.count(id)) removed.emplace(id, std::move(c));  // `before` is only searched for cases of `now`
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
    c.key = std::move(base.key);
    c.op = std::move(base.op);
    c.summary = std::move(base.summary);
    c.dtypes = std::move(base.dtypes);
    c.models = std::move(base.models);
    c.families = std::move(base.families);
    c.baseline_run_id = base.run_id;
    c.baseline = std::move(base.result);
    c.change = Change::kRemoved;
    c.change_detail = fmt::format("in {} ({}), not in {}", base.run_id, OutcomeName(c.baseline->outcome), run.run_id);
    report_.cases.push_back(std::move(c));
  }
  return Status::Ok();
}

Status Builder::AddModelRun(const RunInfo& run, const std::optional<RunInfo>& baseline) {
  std::vector<ItemKey> order;
  std::map<std::string, std::string> families;
  COV_ASSIGN_OR_RETURN(ItemMap now, LoadItems(registry_, run.run_id, &order, &families));
  ItemMap before;
  if (baseline) {
    COV_ASSIGN_OR_RETURN(before, LoadItems(registry_, baseline->run_id, nullptr, &families));
  }

  for (const ItemKey& key : order) {
    const std::string& model_id = std::get<0>(key);
    ModelItemEntry item;
    item.result = std::move(now.at(key));
    const registry::ModelResultRecord& result = *item.result;
    item.first_divergent = ReadFirstDivergent(result.result.detail);
    item.locate_note = ReadLocateNote(result.result.detail);
    const Judged j = JudgeItem(result, true);
    item.verdict = j.verdict;
    if (j.expectation) item.expectation = j.expectation->reason;
    if (!baseline) {
      item.change = Change::kNoBaseline;
    } else if (auto b = before.find(key); b == before.end()) {
      item.change = Change::kNewCase;
    } else {
      const Outcome base_verdict = JudgeItem(b->second, false).verdict;
      item.baseline = std::move(b->second);
      before.erase(b);
      const registry::ModelResultRecord& base = *item.baseline;
      std::vector<Finding> findings;
      if (auto f = VerdictChange(base_verdict, *item.verdict)) findings.push_back(*f);
      const ModelItemResult& now_item = result.result;
      const ModelItemResult& base_item = base.result;
      if (now_item.outcome == Outcome::kPass && base_item.outcome == Outcome::kPass) {
        if (auto f = Drift(base_item.max_abs_err, now_item.max_abs_err, options_)) findings.push_back(*f);
      }
      ApplyFindings(item, std::move(findings));
    }
    ModelEntry& model = models_[model_id];
    model.model_id = model_id;
    model.items.push_back(std::move(item));
  }
  for (auto& [key, base] : before) {  // what is left was not run this time
    ModelItemEntry item;
    item.change = Change::kRemoved;
    item.change_detail =
        fmt::format("in {} ({}), not in {}", baseline->run_id, OutcomeName(base.result.outcome), run.run_id);
    item.baseline = std::move(base);
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

}  // namespace coverage::reports::build
