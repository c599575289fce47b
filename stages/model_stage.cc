#include "stages/model_stage.h"

#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/json_double.h"
#include "core/progress.h"
#include "registry/registry.h"
#include "capture/selection_models.h"

namespace coverage::stages {
namespace {

constexpr const char* kNoProfile = "(none)";

bool IsModelStage(const std::string& s) {
  return std::find(std::begin(kModelStages), std::end(kModelStages), s) != std::end(kModelStages);
}

bool Matches(const std::vector<std::string>& globs, const std::string& id) {
  if (globs.empty()) return true;
  for (const auto& g : globs) {
    if (fnmatch(g.c_str(), id.c_str(), 0) == 0) return true;
  }
  return false;
}

bool Applies(const capture::CaptureProfile& p, const std::string& structure) {
  return std::find(p.families.begin(), p.families.end(), structure) != p.families.end();
}

// Module and model: the named profile, else the first inference profile
// without a KV cache; train: the first training profile, else the same.
const capture::CaptureProfile* ChooseProfile(const ModelStageOptions& o, const std::string& stage,
                                             const std::string& structure, std::string* why) {
  if (!o.profile.empty()) {
    for (const auto& p : o.profiles) {
      if (p.name != o.profile) continue;
      if (Applies(p, structure)) return &p;
      *why = "profile '" + o.profile + "' does not apply to the " + structure + " structure";
      return nullptr;
    }
    *why = "no profile named '" + o.profile + "'";
    return nullptr;
  }
  if (stage == "train") {
    for (const auto& p : o.profiles) {
      if (p.training && Applies(p, structure)) return &p;
    }
  }
  for (const auto& p : o.profiles) {
    if (!p.training && p.past_len == 0 && Applies(p, structure)) return &p;
  }
  *why = "no input profile without a KV cache applies to the " + (structure.empty() ? "unknown" : structure) +
         " structure";
  return nullptr;
}

// Replays of the program (in units of its FLOPs) a stage costs.
double RunsOf(const std::string& stage, const replay::ModelCheckOptions& checks) {
  if (stage == "module") return 2.0;  // the reference, and the backend for the modules' own calls
  if (stage == "model") return 2.0;   // the reference and the backend (a golden, when needed, is extra)
  return 2.0 * std::max(1, checks.train_steps);  // the step program on both sides, per step
}

// The outcome that stands for a stage of a model: the first unexpected
// failure among its items, else skipped when any item was, else pass.
std::pair<Outcome, std::string> WorstOf(const std::vector<registry::ModelResultRecord>& items) {
  std::pair<Outcome, std::string> out{Outcome::kPass, ""};
  for (const auto& record : items) {
    const ModelItemResult& r = record.result;
    if (IsUnexpectedFailure(r.outcome)) return {r.outcome, r.item};
    if (r.outcome == Outcome::kSkipped) out = {Outcome::kSkipped, r.item};
  }
  return out;
}

registry::ModelResultRecord Skipped(const std::string& why, const std::string& family) {
  registry::ModelResultRecord r;
  r.result.item = "*";
  r.result.outcome = Outcome::kSkipped;
  r.result.error = why;
  r.family = family;
  return r;
}

}  // namespace

bool ModelStageSummary::Failed() const {
  for (const auto& [stage, counts] : per_stage) {
    for (const auto& [o, n] : counts) {
      if (n > 0 && IsUnexpectedFailure(o)) return true;
    }
  }
  return false;
}

Result<ModelStageSummary> RunModelStages(registry::Registry& registry, backends::Backend& backend,
                                         const ModelStageOptions& options) {
  replay::ProgramReplayOptions replay;
  replay.check = options.checks;
  replay::InProcessProgramStageRunner runner(backend, replay);
  return RunModelStages(registry, runner, options);
}

Result<ModelStageSummary> RunModelStages(registry::Registry& registry, replay::ProgramStageRunner& runner,
                                         const ModelStageOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> stages;
  for (const char* s : kModelStages) {
    if (std::find(options.stages.begin(), options.stages.end(), s) != options.stages.end()) stages.push_back(s);
  }
  for (const auto& s : options.stages) {
    if (!IsModelStage(s)) return Status::InvalidArgument("'" + s + "' is not a model-level stage (module, model, train)");
  }
  if (stages.empty()) return Status::InvalidArgument("no stage to run (module, model, train)");
  std::string label;
  for (const auto& s : stages) label += (label.empty() ? "" : ",") + s;

  ModelStageSummary summary;
  std::vector<registry::SelectedModel> models;
  std::string source;   // where the models came from, for the error below
  std::string capture = "coverage capture --selection";  // how a missing program is captured
  if (!options.model_ids.empty()) {
    COV_ASSIGN_OR_RETURN(models, registry.ModelsById(options.model_ids));
    source = "the --models list";
    capture = "coverage capture --models FILE";
  } else if (options.all_captured) {
    COV_ASSIGN_OR_RETURN(auto ids, registry.CapturedModelIds());
    if (ids.empty()) return Status::NotFound("the registry holds no captured program yet: run coverage capture first");
    COV_ASSIGN_OR_RETURN(models, registry.ModelsById(ids));
    source = "the captured models";
    capture = "coverage capture --models FILE";
  } else {
    int64_t selection_id = 0;
    COV_ASSIGN_OR_RETURN(models, registry.SelectionModels(options.selection_id, &selection_id));
    source = fmt::format("the representatives of selection {}", selection_id);
  }
  std::vector<registry::SelectedModel> chosen;
  for (auto& m : models) {
    if (Matches(options.models, m.model_id)) chosen.push_back(std::move(m));
  }
  if (chosen.empty()) return Status::NotFound("no model of " + source + " matches the --model patterns");

  COV_ASSIGN_OR_RETURN(StageRun run, StageRun::Open(registry, label, stages.size() == 1 ? stages[0] : "models",
                                                    "checks", options));
  summary.run_id = run.id();
  summary.resumed = run.resumed();
  std::erase_if(chosen, [&](const registry::SelectedModel& m) {
    const bool other = !run.Owns(m.model_id);
    summary.outside_shard += other;
    return other;
  });
  for (const auto& m : chosen) {
    for (const auto& s : stages) summary.was_in_flight += run.WasInFlight("model:" + m.model_id + ":" + s);
  }

  // What earlier invocations of this run stored: (model, stage) -> rows.
  std::map<std::pair<std::string, std::string>, std::vector<registry::ModelResultRecord>> stored;
  {
    COV_ASSIGN_OR_RETURN(auto rows, registry.ModelResultsForRun(summary.run_id));
    for (auto& r : rows) stored[{r.model_id, r.stage}].push_back(std::move(r));
  }

  replay::ProgramReplayOptions replay_options;  // for the memory estimate: the declared numerics
  replay_options.check = options.checks;
  Progress progress(fmt::format("{} {} on {}", label, summary.run_id, options.backend),
                    static_cast<int64_t>(chosen.size()), options.progress);
  int64_t failing = 0;
  for (size_t i = 0; i < chosen.size() && !summary.interrupted; ++i) {
    const registry::SelectedModel& model = chosen[i];
    progress.Update(static_cast<int64_t>(i), fmt::format("{} failing | {}", failing, model.model_id));
    ++summary.models;
    const Result<std::string> structure = capture::StoredStructure(model);
    std::map<std::string, std::pair<Outcome, std::string>> earlier;  // stage -> its outcome and item
    // The module and model stages share a profile: its program is read once per model.
    std::map<std::string, Program> programs;  // profile -> program
    for (const std::string& stage : stages) {
      if (run.StopRequested()) {
        summary.interrupted = true;
        break;
      }
      auto done = stored.find({model.model_id, stage});
      if (done != stored.end() && WorstOf(done->second).first != Outcome::kSkipped) {
        earlier[stage] = WorstOf(done->second);
        ++summary.already_done;
        continue;
      }
      std::vector<registry::ModelResultRecord> rows;
      std::string profile_name = kNoProfile;
      auto record = [&]() -> Status {
        earlier[stage] = WorstOf(rows);
        if (IsUnexpectedFailure(earlier[stage].first)) ++failing;
        return registry.RecordModelStage(summary.run_id, model.model_id, profile_name, stage, rows);
      };
      if (!structure) {
        rows.push_back(Skipped("no structure: " + structure.error().message(), ""));
        COV_RETURN_IF_ERROR(record());
        continue;
      }
      const std::string& family = *structure;
      std::string why;
      const capture::CaptureProfile* profile = ChooseProfile(options, stage, *structure, &why);
      if (!profile) {
        rows.push_back(Skipped(why, family));
        COV_RETURN_IF_ERROR(record());
        continue;
      }
      profile_name = profile->name;
      // The captured program, or the capture's reason for not having one.
      COV_ASSIGN_OR_RETURN(auto captured, registry.GetProgramRecord(model.model_id, profile->name));
      if (!captured || captured->status != "captured") {
        const std::string reason =
            !captured ? fmt::format("no program captured for profile '{}' ({} --profile '{}')",
                                    profile->name, capture, profile->name)
                      : fmt::format("not captured ({}{}): {}", captured->status,
                                    captured->stage.empty() ? "" : ", " + captured->stage, captured->reason);
        rows.push_back(Skipped(reason, family));
        ++summary.not_captured;
        ++summary.not_captured_reasons[!captured ? "never traced" : captured->status];
        COV_RETURN_IF_ERROR(record());
        continue;
      }
      if (!programs.count(profile->name)) {
        COV_ASSIGN_OR_RETURN(auto loaded, registry.LoadProgram(model.model_id, profile->name));
        if (!loaded) return Status::Internal("program of " + model.model_id + " / " + profile->name + " vanished");
        programs.emplace(profile->name, std::move(*loaded));
      }
      const Program& program = programs.at(profile->name);
      if (options.gate) {
        std::string blocker;
        for (const auto& [s, o] : earlier) {
          if (IsUnexpectedFailure(o.first)) {
            blocker = s + ":" + o.second;
            break;
          }
        }
        if (!blocker.empty()) {
          registry::ModelResultRecord r = Skipped(
              fmt::format("blocked by {} ({})", blocker, OutcomeName(earlier[blocker.substr(0, blocker.find(':'))].first)),
              family);
          r.blocked_by = blocker;
          rows.push_back(std::move(r));
          ++summary.blocked;
          // A blocked stage blocks the next ones for the same reason, not as a failure of its own.
          COV_RETURN_IF_ERROR(registry.RecordModelStage(summary.run_id, model.model_id, profile_name, stage, rows));
          continue;
        }
      }
      // Memory: the replay on both sides and the fp64 golden, whichever
      // holds more (Note [Memory estimate] in replay/program_replay.cc).
      const replay::MemoryEstimate memory =
          replay::EstimateMemory(program, stage, replay_options, /*backend_copies=*/options.backend != "cpu");
      const double bytes = memory.bytes;
      if (bytes > options.max_bytes) {
        rows.push_back(Skipped(fmt::format("needs about {:.3g} GB to judge ({}: the replay on the backend and the "
                                           "reference {:.3g} GB, the fp64 golden {:.3g} GB), over the --max-gb {:.3g} "
                                           "budget",
                                           bytes / 1e9, memory.replay_bytes >= memory.golden_bytes ? "the replay" : "the golden",
                                           memory.replay_bytes / 1e9, memory.golden_bytes / 1e9, options.max_bytes / 1e9),
                               family));
        rows.back().result.detail = {{"estimated_bytes", bytes}};
        ++summary.skipped_by_cost;
        COV_RETURN_IF_ERROR(record());
        continue;
      }
      const double cost = EstimateFootprint(program).flops * RunsOf(stage, options.checks);
      if (options.max_model_flops && cost > *options.max_model_flops) {
        rows.push_back(Skipped(fmt::format("estimated {:.3g} FLOPs exceeds --max-model-flops {:.3g}", cost,
                                           *options.max_model_flops),
                               family));
        rows.back().result.detail = {{"estimated_flops", cost}};
        ++summary.skipped_by_cost;
        COV_RETURN_IF_ERROR(record());
        continue;
      }
      progress.Update(static_cast<int64_t>(i), fmt::format("{} failing | {} {}", failing, stage, model.model_id));
      COV_RETURN_IF_ERROR(run.Begin("model:" + model.model_id + ":" + stage));
      std::vector<ModelItemResult> items = runner.Run(stage, model.model_id, profile->name, program);
      if (Status harness = runner.HarnessStatus(); !harness.ok()) {
        if (harness.code() == StatusCode::kAborted && run.StopRequested()) {  // stopped while a worker started
          summary.interrupted = true;
          break;
        }
        return harness;
      }
      for (auto& item : items) {
        nlohmann::json& d = item.detail;
        d["program"] = {{"calls", program.calls.size()},
                        {"layers", nlohmann::json::parse(program.info.layers_json.empty() ? "{}" : program.info.layers_json,
                                                         nullptr, false)},
                        {"captured_on", program.info.device}};
        d["estimated_flops"] = cost;
        d["estimated_bytes"] = bytes;
        d["estimated_replay_bytes"] = memory.replay_bytes;
        d["estimated_golden_bytes"] = memory.golden_bytes;
        if (memory.calls_without_shapes > 0) d["calls_without_shapes"] = memory.calls_without_shapes;
        rows.push_back({.family = family, .result = std::move(item)});
      }
      if (rows.empty()) rows.push_back(Skipped("the program has no module of its own to check", family));
      ++summary.executed;
      COV_RETURN_IF_ERROR(record());
    }
  }
  progress.Update(static_cast<int64_t>(chosen.size()));
  progress.Finish();

  // Summarise the whole run, including earlier invocations.
  COV_ASSIGN_OR_RETURN(auto rows, registry.ModelResultsForRun(summary.run_id));
  std::map<std::tuple<std::string, std::string, std::string>, std::vector<registry::ModelResultRecord>> by_triple;
  for (auto& r : rows) by_triple[{r.stage, r.model_id, r.profile}].push_back(std::move(r));
  for (const auto& [key, items] : by_triple) {
    const auto& [stage, model_id, profile] = key;
    const auto [outcome, item] = WorstOf(items);
    ++summary.per_stage[stage][outcome];
    for (const auto& record : items) {
      const ModelItemResult& r = record.result;
      if (!IsUnexpectedFailure(r.outcome)) continue;
      ++summary.failing_items[stage][r.item];
      ++summary.failing_total;
      if (summary.failures.size() < 100) {
        summary.failures.push_back(fmt::format("{} {} ({}) {}: {}: {}", stage, model_id, profile, r.item,
                                               OutcomeName(r.outcome), r.error));
      }
    }
  }
  COV_RETURN_IF_ERROR(run.Finish(summary.interrupted));
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace coverage::stages
