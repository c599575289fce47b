// Hand-built Report values for the writers' tests: no registry, no run.
//
// SmallReport() is fixed down to the last string (the golden outline of the
// HTML report is taken from it). RealisticReport() is a nightly-sized picture
// (unit cases of ten ops, models of eight families over three model stages,
// every kind of change, and hostile strings in ids, summaries and errors),
// generated deterministically, for the browser test and size checks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/case_result.h"
#include "core/outcome.h"
#include "registry/registry.h"
#include "reports/report.h"

namespace coverage::testing {

// Strings that break writers that do not escape: markup, a script end tag,
// quotes and ampersands, bytes that are not UTF-8, a line separator.
inline constexpr char kScriptModelId[] = "<script>alert(1)</script>/evil-model";
inline constexpr char kQuotesError[] = "RuntimeError: \"quoted\" 'single' & ampersand <b>bold</b>";
inline constexpr char kScriptEndError[] = "boom </script><script>alert(2)</script> <!-- end";
inline constexpr char kInvalidUtf8Error[] = "bad bytes \xff\xfe\xc3( after";
inline constexpr char kLineSeparatorSummary[] = "f32[4] line\xE2\x80\xA8separator\xE2\x80\xA9paragraph";

namespace internal {

// A case key shaped like the registry's (hex), fixed by the index.
inline std::string CaseKey(int i) {
  char key[17];
  std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(i + 1) * 0x9E3779B97F4A7C15ull);
  return key;
}

inline bool FailsUnexpectedly(std::optional<Outcome> verdict) { return verdict && IsUnexpectedFailure(*verdict); }

inline CaseResult ResultOf(Outcome outcome) {
  CaseResult r;
  r.outcome = outcome;
  return r;
}

// A model item's record as the registry stores it.
inline registry::ModelResultRecord ItemRecord(std::string run_id, std::string model_id, std::string stage,
                                              std::string item, std::string profile, Outcome outcome) {
  registry::ModelResultRecord r;
  r.run_id = std::move(run_id);
  r.model_id = std::move(model_id);
  r.stage = std::move(stage);
  r.result.item = std::move(item);
  r.profile = std::move(profile);
  r.result.outcome = outcome;
  return r;
}

// Fills the aggregate fields (stages, matrix, changes, blockers, root
// causes, order) from cases and models the way BuildReport defines them, so
// the fixture is self-consistent.
inline void Aggregate(reports::Report& report) {
  using reports::Change;
  std::map<std::string, reports::StageSummary> stages;
  auto count = [&](const std::string& stage, Outcome verdict) {
    auto& summary = stages[stage];
    summary.stage = stage;
    summary.verdicts[verdict]++;
    summary.total++;
  };
  for (const auto& c : report.cases) {
    if (!c.result) continue;  // removed
    count("unit", *c.verdict);
    for (const auto& family : c.families) {
      auto& cell = report.matrix[family]["unit"];
      cell.second++;
      if (!FailsUnexpectedly(c.verdict) && c.verdict != Outcome::kSkipped) cell.first++;
    }
  }
  for (auto& model : report.models) {
    for (const auto& [stage, verdict] : model.stage_verdict) {
      count(stage, verdict);
      auto& cell = report.matrix[model.family][stage];
      cell.second++;
      if (!FailsUnexpectedly(verdict) && verdict != Outcome::kSkipped) cell.first++;
    }
  }
  for (auto& [name, summary] : stages) {
    auto verdicts = [&](Outcome verdict) {
      auto it = summary.verdicts.find(verdict);
      return it == summary.verdicts.end() ? int64_t{0} : it->second;
    };
    const int64_t judged = summary.total - verdicts(Outcome::kSkipped);
    summary.pass_rate =
        judged > 0 ? double(verdicts(Outcome::kPass) + verdicts(Outcome::kExpectedFailure)) / double(judged) : 0;
  }
  for (const char* stage : {"unit", "module", "model", "train"}) {
    if (stages.count(stage)) report.stages.push_back(stages[stage]);
  }
  report.changes.clear();
  for (const auto& c : report.cases) report.changes[c.change]++;
  for (const auto& model : report.models) {
    for (const auto& item : model.items) report.changes[item.change]++;
  }
  // Root causes and blockers.
  std::map<std::string, std::vector<std::string>> users;  // failing case key -> failing models
  for (auto& model : report.models) {
    if (!model.failing) continue;
    for (const auto& c : report.cases) {
      if (FailsUnexpectedly(c.verdict) && std::count(c.models.begin(), c.models.end(), model.model_id)) {
        model.failing_cases.push_back(c.key);
        users[c.key].push_back(model.model_id);
      }
    }
  }
  for (const auto& c : report.cases) {
    auto it = users.find(c.key);
    if (it == users.end()) continue;
    report.blockers.push_back({c.key, c.op, c.summary, c.verdict, it->second});
  }
  std::stable_sort(report.blockers.begin(), report.blockers.end(),
                   [](const auto& a, const auto& b) { return a.models.size() > b.models.size(); });
  auto regression = [](const reports::CaseEntry& c) {
    return c.change == Change::kNewFailure || c.change == Change::kDrift || c.change == Change::kPerfRegression;
  };
  std::stable_sort(report.cases.begin(), report.cases.end(),
                   [&](const auto& a, const auto& b) { return regression(a) && !regression(b); });
  reports::FindBroken(report);
  std::stable_sort(report.models.begin(), report.models.end(),
                   [](const auto& a, const auto& b) { return a.failing && !b.failing; });
}

inline reports::RunInfo Run(std::string id, std::string stage, int64_t results) {
  reports::RunInfo run;
  run.run_id = std::move(id);
  run.stage = std::move(stage);
  run.backend = "sim";
  run.started_at = "2026-11-30T01:00:00Z";
  run.finished_at = "2026-11-30T02:30:00Z";
  run.host = "ci-runner-7";
  run.git_revision = "8962bb9";
  run.libtorch_version = "1.13.1";
  run.results = results;
  return run;
}

}  // namespace internal

inline reports::Report SmallReport() {
  using reports::Change;
  reports::Report report;
  report.title = "coverage: sim nightly-42";
  report.generated_at = "2026-11-30T03:00:00Z";
  report.registry_path = "nightly.db";
  report.runs = {internal::Run("nightly-42-unit", "unit", 6), internal::Run("nightly-42-model", "model", 3)};
  report.runs[0].shards = "4 of 4 shards finished";
  report.baselines = {internal::Run("nightly-41-unit", "unit", 6)};
  report.warnings = {"no baseline for run nightly-42-model: no finished model run of backend sim before it",
                     std::string("expectation 3 (model ") + kScriptModelId + ") matched nothing"};

  auto add_case = [&](std::string key, std::string op, std::string summary, std::optional<Outcome> outcome,
                      std::optional<Outcome> verdict, Change change) -> reports::CaseEntry& {
    reports::CaseEntry c;
    c.run_id = outcome ? "nightly-42-unit" : "";
    c.key = std::move(key);
    c.op = std::move(op);
    c.summary = std::move(summary);
    c.dtypes = "f32";
    if (outcome) c.result = internal::ResultOf(*outcome);
    c.verdict = verdict;
    c.change = change;
    c.baseline_run_id = "nightly-41-unit";
    c.repro = "coverage --registry nightly.db repro " + c.key;
    report.cases.push_back(std::move(c));
    return report.cases.back();
  };
  auto& mm = add_case("k-mm", "aten::mm", "f32[512x2048] @ f32[2048x2048]", Outcome::kMismatch, Outcome::kMismatch,
                      Change::kNewFailure);
  mm.result->error = kQuotesError;
  mm.result->max_abs_err = 3.2e-2;
  mm.result->max_rel_err = 4.1e-3;
  mm.result->error_ratio = 35.5;
  mm.baseline = internal::ResultOf(Outcome::kPass);
  mm.change_detail = "pass -> mismatch";
  mm.models = {kScriptModelId, "Qwen/Qwen3-0.6B"};
  mm.families = {"qwen3"};
  auto& softmax =
      add_case("k-softmax", "aten::_softmax", kLineSeparatorSummary, Outcome::kPass, Outcome::kPass, Change::kDrift);
  softmax.result->max_abs_err = 4.1e-3;
  softmax.result->max_rel_err = 2e-4;
  softmax.baseline = internal::ResultOf(Outcome::kPass);
  softmax.baseline->max_abs_err = 3.2e-5;
  softmax.change_detail = "max abs error 3.2e-05 -> 4.1e-03 (128x)";
  softmax.models = {"Qwen/Qwen3-0.6B"};
  softmax.families = {"qwen3"};
  auto& add = add_case("k-add", "aten::add.Tensor", "f32[8x1x2048] + f32[8x1x2048]", Outcome::kPass, Outcome::kPass,
                       Change::kPerfRegression);
  add.result->max_rel_err = 0;
  add.result->warm_us = 30.1;
  add.result->warm_spread_us = 1.2;
  add.baseline = internal::ResultOf(Outcome::kPass);
  add.baseline->warm_us = 12.0;
  add.change_detail = "warm 12.0 us -> 30.1 us (spread 1.2 us)";
  add.models = {"bert-base-uncased"};
  add.families = {"bert"};
  auto& conv = add_case("k-conv", "aten::convolution", "f32[1x3x224x224] conv 7x7/2", Outcome::kCrash, Outcome::kCrash,
                        Change::kStillFailing);
  conv.result->error = kScriptEndError;
  conv.result->attempts = 3;
  conv.result->attempt_outcomes = {Outcome::kCrash, Outcome::kCrash, Outcome::kCrash};
  conv.result->counters = {{"kernel_launches", 3}, {"</script>", 1}};  // names come from the backend
  conv.models = {kScriptModelId};
  conv.families = {"resnet"};
  auto& gelu =
      add_case("k-gelu", "aten::gelu", "f32[8x3072]", Outcome::kPass, Outcome::kUnexpectedPass, Change::kFixed);
  gelu.expectation = "erf approximation differs";
  gelu.result->max_rel_err = 1e-7;
  gelu.models = {"bert-base-uncased"};
  gelu.families = {"bert"};
  auto& removed = add_case("k-old", "aten::addmm", "f32[16x16] + f32[16x16] @ f32[16x16]", std::nullopt, std::nullopt,
                           Change::kRemoved);
  removed.baseline = internal::ResultOf(Outcome::kPass);
  auto& embedding = add_case("k-embedding", "aten::embedding", "i64[8x128] into f32[32000x2048]", Outcome::kSkipped,
                             Outcome::kSkipped, Change::kUnchanged);
  embedding.result->error = kInvalidUtf8Error;  // a skip reason with bytes that are not UTF-8
  embedding.baseline = internal::ResultOf(Outcome::kSkipped);

  auto add_model = [&](std::string id, std::string family, Outcome verdict) -> reports::ModelEntry& {
    reports::ModelEntry model;
    model.model_id = std::move(id);
    model.family = std::move(family);
    model.stage_verdict["model"] = verdict;
    reports::ModelItemEntry item;
    item.result = internal::ItemRecord("nightly-42-model", model.model_id, "model", "forward", "prefill", verdict);
    item.verdict = verdict;
    item.change = Change::kNoBaseline;
    model.items.push_back(item);
    model.failing = internal::FailsUnexpectedly(verdict);
    report.models.push_back(std::move(model));
    return report.models.back();
  };
  auto& evil = add_model(kScriptModelId, "resnet", Outcome::kCrash);
  evil.items[0].result->result.error = kScriptEndError;
  evil.items[0].result->blocked_by = "module:Conv2d";
  auto& qwen = add_model("Qwen/Qwen3-0.6B", "qwen3", Outcome::kMismatch);
  qwen.items[0].result->result.error = kInvalidUtf8Error;
  reports::FirstDivergent divergent;
  divergent.call = 17;
  divergent.op = "aten::mm";
  divergent.case_key = "k-mm";
  divergent.module = "model.layers.0.mlp.down_proj";
  divergent.phase = "forward";
  divergent.outcome = "mismatch";
  divergent.error_ratio = 35.5;
  qwen.items[0].first_divergent = divergent;
  add_model("bert-base-uncased", "bert", Outcome::kPass);
  internal::Aggregate(report);
  return report;
}

// `cases` unit cases over ten ops and `models` models of eight families with
// module, model and train items, against a baseline: every Change occurs.
inline reports::Report RealisticReport(int cases = 200, int models = 20) {
  using reports::Change;
  std::mt19937 random(42);  // mt19937's sequence is fixed by the standard
  auto uniform = [&](int n) { return static_cast<int>(random() % static_cast<uint32_t>(n)); };
  auto unit = [&]() { return static_cast<double>(random()) / 4294967296.0; };

  reports::Report report;
  report.title = "coverage: sim nightly-42 (fixture)";
  report.generated_at = "2026-11-30T03:00:00Z";
  report.registry_path = "nightly.db";
  report.runs = {internal::Run("nightly-42-unit", "unit", cases), internal::Run("nightly-42-models", "module", 0),
                 internal::Run("nightly-42-models-m", "model", 0), internal::Run("nightly-42-models-t", "train", 0)};
  report.runs[0].shards = "4 of 4 shards finished";
  report.baselines = {internal::Run("nightly-41-unit", "unit", cases), internal::Run("nightly-41-models", "module", 0)};
  report.warnings = {"no baseline for run nightly-42-models-t: no finished train run of backend sim before it",
                     "expectation 7 (op aten::gelu, reason \"erf <approximation>\") matched nothing"};

  struct Family {
    const char* name;
    std::vector<std::string> ids;
  };
  const std::vector<Family> families = {
      {"llama", {"TinyLlama/TinyLlama-1.1B-Chat-v1.0", "meta-llama/Llama-3.2-1B", "openlm-research/open_llama_3b"}},
      {"qwen3", {"Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B"}},
      {"bert", {"bert-base-uncased", "google-bert/bert-large-cased", "distilbert/distilbert-base-uncased"}},
      {"vit", {"google/vit-large-patch32-224-in21k", "google/vit-base-patch16-224"}},
      {"resnet", {"microsoft/resnet-50", kScriptModelId}},
      {"mistral", {"mistralai/Mistral-7B-v0.3", "mistral-\"quoted\"&'apos'/model"}},
      {"gpt2", {"openai-community/gpt2", "distilbert/distilgpt2"}},
      {"t5", {"google-t5/t5-small", "google/flan-t5-base", "google/\xff\xfe-invalid-utf8"}},
  };
  std::vector<std::pair<std::string, std::string>> all_models;  // id, family
  for (const auto& family : families) {
    for (const auto& id : family.ids) all_models.emplace_back(id, family.name);
  }
  all_models.resize(std::min<size_t>(all_models.size(), static_cast<size_t>(models)));

  const char* ops[] = {"aten::linear",      "aten::mm",   "aten::add.Tensor", "aten::_softmax",   "aten::layer_norm",
                       "aten::convolution", "aten::gelu", "aten::embedding",  "aten::mul.Tensor", "aten::bmm"};
  const char* dtypes[] = {"f32", "bf16", "f32 i64", "f16"};
  const Outcome failing[] = {Outcome::kMismatch, Outcome::kError, Outcome::kCrash,
                             Outcome::kTimeout, Outcome::kNonFiniteMismatch, Outcome::kUnsupported};
  for (int i = 0; i < cases; ++i) {
    reports::CaseEntry c;
    c.run_id = "nightly-42-unit";
    c.key = internal::CaseKey(i);
    c.op = ops[i % 10];
    c.dtypes = dtypes[uniform(4)];
    c.summary = c.op.substr(6) + " " + c.dtypes + "[" + std::to_string(1 << (3 + uniform(8))) + "x" +
                std::to_string(64 * (1 + uniform(64))) + "]";
    if (i == 11) c.summary = kLineSeparatorSummary;
    // Two to four models of one or two families use each case.
    const int users = 2 + uniform(3);
    std::set<std::string> ids, fams;
    for (int u = 0; u < users; ++u) {
      const auto& [id, family] = all_models[static_cast<size_t>(uniform(static_cast<int>(all_models.size())))];
      ids.insert(id);
      fams.insert(family);
    }
    c.models.assign(ids.begin(), ids.end());
    c.families.assign(fams.begin(), fams.end());
    c.baseline_run_id = "nightly-41-unit";
    c.repro = "coverage --registry nightly.db repro " + c.key;
    CaseResult& r = c.result.emplace();
    CaseResult& base = c.baseline.emplace();
    r.warm_us = 5 + 500 * unit() * unit();
    r.first_call_us = *r.warm_us * (1.5 + unit());
    r.warm_spread_us = *r.warm_us * 0.02;
    base.warm_us = *r.warm_us * (0.9 + 0.2 * unit());
    base.first_call_us = r.first_call_us;
    r.max_rel_err = std::pow(10.0, -2.0 - 7.0 * unit());
    r.max_abs_err = *r.max_rel_err * (1 + 10 * unit());
    r.counters = {{"kernel_launches", 1 + uniform(5)}};
    c.change = Change::kUnchanged;
    if (i % 9 == 4) {  // fails
      r.outcome = failing[uniform(6)];
      base.outcome = r.outcome;
      c.change = Change::kStillFailing;
      r.error = "RuntimeError: " + c.op + " failed on sim: " + std::to_string(i);
      if (r.outcome == Outcome::kNonFiniteMismatch) r.max_rel_err = INFINITY;
      if (r.outcome == Outcome::kCrash || r.outcome == Outcome::kTimeout) {
        r.attempts = 3;
        r.attempt_outcomes = {r.outcome, r.outcome, r.outcome};
        r.max_rel_err.reset();
        r.max_abs_err.reset();
      }
    }
    if (i % 17 == 3) {
      r.outcome = Outcome::kMismatch;
      base.outcome = Outcome::kPass;
      c.change = Change::kNewFailure;
      r.error = "max abs error 0.031 over tolerance (atol 1e-05, rtol 1.3e-06)";
      r.max_rel_err = 4e-3;
      c.change_detail = "pass -> mismatch";
    } else if (i % 23 == 5) {
      c.change = Change::kDrift;
      base.max_abs_err = *r.max_abs_err / 200;
      c.change_detail = "max abs error grew 200x";
    } else if (i % 19 == 7) {
      c.change = Change::kPerfRegression;
      base.warm_us = *r.warm_us / 2.5;
      c.change_detail = "warm latency 2.5x the baseline's";
    } else if (i % 29 == 2) {
      r.outcome = Outcome::kPass;
      base.outcome = Outcome::kMismatch;
      c.change = Change::kFixed;
      c.change_detail = "mismatch -> pass";
      r.error.clear();
    } else if (i % 31 == 6) {
      c.change = Change::kPerfImprovement;
      base.warm_us = *r.warm_us * 3;
    } else if (i % 37 == 8) {
      c.change = Change::kCompileChange;
      c.extra_changes = {"perf_improvement"};
    } else if (i % 41 == 9) {
      c.change = Change::kNewCase;
      c.baseline.reset();
    }
    c.verdict = r.outcome;
    if (r.outcome == Outcome::kMismatch && c.dtypes == "bf16" && c.change != Change::kNewFailure) {
      c.verdict = Outcome::kExpectedFailure;
      c.expectation = "bf16 matmul numerics";
    }
    if (i % 43 == 10 && r.outcome == Outcome::kPass) {
      c.verdict = Outcome::kUnexpectedPass;
      c.expectation = "erf approximation differs";
    }
    if (i % 47 == 12) {
      r.outcome = Outcome::kSkipped;
      c.verdict = Outcome::kSkipped;
      r.error = "estimated cost above --max-case-flops";
      c.change = Change::kUnchanged;
      r.max_rel_err.reset();
      r.max_abs_err.reset();
      r.warm_us.reset();
    }
    if (i == 13) {
      r.error = kScriptEndError;
      r.outcome = Outcome::kCrash;
      c.verdict = Outcome::kCrash;
      c.change = Change::kNewFailure;
    }
    if (i == 14) r.error = kQuotesError;
    if (i == 15) r.error = kInvalidUtf8Error;
    if (i == 16) r.flaky = true, r.attempts = 2, r.attempt_outcomes = {Outcome::kCrash, Outcome::kPass};
    report.cases.push_back(std::move(c));
  }
  for (int i = 0; i < 3; ++i) {  // removed: in the baseline only
    reports::CaseEntry c;
    c.key = internal::CaseKey(cases + i);
    c.op = "aten::addmm";
    c.summary = "addmm f32[16x" + std::to_string(16 << i) + "]";
    c.baseline_run_id = "nightly-41-unit";
    c.baseline = internal::ResultOf(Outcome::kPass);
    c.change = Change::kRemoved;
    report.cases.push_back(std::move(c));
  }

  const char* items[][2] = {{"module", "Linear"}, {"module", "Attention"}, {"model", "forward"}, {"train", "train"}};
  int model_index = 0;
  for (const auto& [id, family] : all_models) {
    reports::ModelEntry model;
    model.model_id = id;
    model.family = family;
    const bool fails = model_index % 3 == 1;
    for (const auto& [stage, item_name] : items) {
      reports::ModelItemEntry item;
      const std::string profile = std::string(stage) == "train" ? "train" : "prefill";
      registry::ModelResultRecord& r =
          item.result.emplace(internal::ItemRecord("nightly-42-models", id, stage, item_name, profile, Outcome::kPass));
      r.result.seconds = 0.5 + unit();
      r.result.max_rel_err = std::pow(10.0, -3.0 - 4.0 * unit());
      item.change = std::string(stage) == "train" ? Change::kNoBaseline : Change::kUnchanged;
      if (fails && std::string(item_name) == "Attention") {
        r.result.outcome = model_index % 2 ? Outcome::kMismatch : Outcome::kCrash;
        r.result.error = model_index % 2 ? "max rel error 0.2 over tolerance" : kScriptEndError;
        item.change = model_index % 6 == 1 ? Change::kNewFailure : Change::kStillFailing;
        item.baseline = internal::ItemRecord("nightly-41-models", id, stage, item_name, profile,
                                             item.change == Change::kNewFailure ? Outcome::kPass : r.result.outcome);
        if (model_index % 2) {  // a mismatch: the replay located the call it first went wrong at
          reports::FirstDivergent divergent;
          divergent.call = 40 + model_index;
          divergent.op = "aten::bmm";
          divergent.case_key = report.cases.front().key;
          divergent.module = "model.layers.0.self_attn";
          divergent.phase = "forward";
          divergent.outcome = "mismatch";
          divergent.error_ratio = 12.0 + model_index;
          item.first_divergent = divergent;
        }
      }
      if (fails && std::string(stage) != "module") {
        r.result.outcome = Outcome::kSkipped;
        r.result.error = "gated: module:Attention failed";
        r.blocked_by = "module:Attention";
      }
      item.verdict = r.result.outcome;
      auto [at, first] = model.stage_verdict.try_emplace(stage, *item.verdict);
      Outcome& verdict = at->second;
      if (!first && (internal::FailsUnexpectedly(item.verdict) ||
                     (verdict == Outcome::kPass && item.verdict == Outcome::kSkipped))) {
        if (!internal::FailsUnexpectedly(verdict)) verdict = *item.verdict;
      }
      model.items.push_back(std::move(item));
    }
    model.failing = fails;
    report.models.push_back(std::move(model));
    ++model_index;
  }
  internal::Aggregate(report);
  return report;
}

}  // namespace coverage::testing
