// The test stages as one interface (Note [Test stages]): `coverage run`,
// `coverage nightly` and `coverage worker` loop over the registered stage
// families instead of naming stages.
//
// Note [Test stages]
// ~~~~~~~~~~~~~~~~~~
// A stage family is the stages that share one run, one kind of work item
// and one worker request:
//   cases     unit                  op cases (stages/unit_stage.h), worker request "unit"
//   programs  module, model, train  captured programs of the selection's
//                                   representatives (stages/model_stage.h),
//                                   worker request "model"
// Each family plans its items, runs them in this process or in workers
// (isolation/), records each result as it completes and prints its summary
// (Run); answers its worker request (Answer); and tells the nightly how to
// run it (its run id suffix, its extra arguments' key, whether the registry
// can run it yet). A new stage joins a family (its stage list), or a new
// family is one more TestStageFamily registered in TestStageFamilies(): no
// command names stages.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/app.h"
#include "apps/table.h"
#include "core/outcome.h"
#include "stages/stage_run.h"
#include "backends/backends.h"
#include "core/program.h"
#include "core/result.h"
#include "isolation/isolation.h"
#include "replay/compare_options.h"
#include "stages/shard.h"

namespace coverage::replay {
class ReplayExecutor;
}  // namespace coverage::replay

namespace coverage::apps {

// `coverage run`'s flags, shared by every family.
struct RunFlags {
  std::string stage = "unit";
  std::string backend = "cpu";
  std::string device_name;  // names a plugin's unnamed device (backends::NameDevice)
  std::vector<std::string> ops;
  std::vector<std::string> keys;
  std::string model;
  std::string dtype;
  std::vector<std::string> dims;
  std::string profile;
  std::string source;  // unit: captured, opinfo or "" (both)
  std::optional<double> max_case_flops;
  double max_case_gb = 0;  // 0: half the machine's memory
  std::string run_id;
  int warm = 3;
  std::string golden = "auto";
  uint64_t seed = 0;
  std::string tolerances;
  std::string numerics;  // "" (the backend's), "none", or a file
  bool list_backends = false;
  int show_failures = 10;
  // Program stages.
  int64_t selection_id = 0;
  std::string models_file;  // the user's own list (ids, or capture's JSONL)
  bool all_captured = false;
  std::string profiles;
  double max_gb = 8;
  double max_model_flops = 1e12;
  bool gate = false;
  int train_steps = 3;
  double min_cosine = 0.99;
  int64_t top_k = 5;
  double min_topk_agreement = 0.99;
  // Isolation and sharding.
  std::string isolation = "process";
  std::string isolation_config;
  std::optional<double> timeout;
  std::optional<int> reruns;
  std::string shard;
};

// What one `coverage run` hands the family it runs.
struct RunContext {
  const GlobalOptions& global;
  const RunFlags& flags;
  backends::BackendRegistry& backends;
  replay::ComparisonOptions comparison;  // configs/tolerances.json (or --tolerances), parsed; numerics from a file
  std::string tolerances_path, tolerances_text;
  // The declared numerics (--numerics, ResolveNumerics): a declaration's
  // text and its file, "none", or WorkerSetup::kAskBackend.
  std::string numerics_text, numerics_source;
  const std::atomic<bool>* stop = nullptr;
};

// What a worker keeps between requests.
struct WorkerState {
  isolation::WorkerSetup setup;
  std::shared_ptr<backends::Backend> backend;
  // A captured program from the registry the setup names (model id, profile).
  std::function<Result<Program>(const std::string& model_id, const std::string& profile)> load_program;
  // The cases family's executor, made on its first request.
  std::unique_ptr<replay::ReplayExecutor> replay;
  WorkerState();
  ~WorkerState();
};

// What a family is, as data.
struct TestStageFamilyInfo {
  std::string name;                 // "cases", "programs"
  std::string request;              // its worker request ("unit", "model")
  std::vector<std::string> stages;  // in the order they run
  bool timed = false;               // each stage has its own timeout in configs/isolation.json
                                    // (one worker request runs a whole model's stage)
  std::string run_suffix;           // nightly: its run id is "<nightly id><suffix>"
  std::string nightly_args;         // nightly: the config key of its extra `run` arguments
};

class TestStageFamily {
 public:
  explicit TestStageFamily(TestStageFamilyInfo info) : info_(std::move(info)) {}
  virtual ~TestStageFamily() = default;
  const std::string& name() const { return info_.name; }
  const std::string& request() const { return info_.request; }
  const std::vector<std::string>& stages() const { return info_.stages; }
  bool timed() const { return info_.timed; }
  const std::string& run_suffix() const { return info_.run_suffix; }
  const std::string& nightly_args() const { return info_.nightly_args; }
  // Nightly: OK when this registry can run the family now, else why not
  // (the stages are skipped with the reason).
  virtual Status Ready(registry::Registry& registry) const = 0;
  // `coverage run --stage=<stages>`: plans, runs, records, summarises;
  // returns the exit code.
  virtual int Run(const RunContext& context, const std::vector<std::string>& stages) const = 0;
  // The worker's answer to one request of this family (`request` is the
  // whole request object, `body` its member named request()).
  virtual nlohmann::json Answer(WorkerState& worker, const nlohmann::json& request, const nlohmann::json& body) const = 0;

 private:
  TestStageFamilyInfo info_;
};

// The families (apps/stage_cases.cc, apps/stage_programs.cc).
const TestStageFamily& CasesFamily();
const TestStageFamily& ProgramsFamily();

// Every family, in the order a nightly runs them.
const std::vector<const TestStageFamily*>& TestStageFamilies();
// "unit, module, model, train".
std::string KnownStages();
// Every stage with its own timeout, for configs/isolation.json.
std::vector<std::string> TimedStages();
// "module,model": one family's stages, deduplicated, in the order given.
// Errors name `what` (the flag or file) and the stage, and refuse stages of
// two families in one list.
Result<std::pair<const TestStageFamily*, std::vector<std::string>>> ParseStageList(const std::string& text,
                                                                                  const std::string& what);

// ---------------------------------------------------------------- shared by the families' Run

// What a stage run says at once, e.g. that it takes over a run whose writer died.
void PrintNotice(const std::string& message);
// --shard, else the environment (stages/shard.h); sharding needs --run.
Result<stages::Shard> ResolveShard(const RunFlags& flags);
// Worker processes for --isolation=process: the policy from
// configs/isolation.json, overridden by --timeout and --reruns.
Result<isolation::IsolationOptions> MakeIsolation(const GlobalOptions& global, const RunFlags& flags,
                                                  isolation::WorkerSetup setup, const std::atomic<bool>* stop);
// The first worker did not start: Ctrl-C while it loaded its backend is an
// interruption (130, nothing ran), anything else a harness error (2).
int StartFailed(const Status& started, const std::string& backend, const std::atomic<bool>* stop);
// Fills what every stage run is told (stages/stage_run.h): the run id,
// backend, where it runs, the shard, progress and the stop flag.
void FillStageRunOptions(const RunContext& context, const stages::Shard& shard, stages::StageRunOptions* options);
// A summary table of outcomes: `row_header` and `count_header` ("op",
// "cases"), then one column per outcome in `seen`.
Table OutcomeTable(const std::string& row_header, const std::string& count_header, const std::vector<Outcome>& seen);
// The end of a family's Run: where the results went (a query on `view` to
// paste), how to resume an interrupted run, and the exit code.
int FinishStageRun(const GlobalOptions& global, const std::string& run_id, const std::string& view, bool interrupted,
                   bool failed);
void PrintIsolationStats(const isolation::IsolationStats& stats, const std::string& tail);
// Where the results went, with a query to paste.
void PrintWhereResultsAre(const GlobalOptions& global, const std::string& run_id, const std::string& view);
// --golden's value as the replay option.
replay::GoldenMode GoldenModeOf(const std::string& flag);
// What every family's workers are set up with: the backend, the tolerances,
// the golden mode and the seed.
isolation::WorkerSetup BaseWorkerSetup(const RunContext& context);

// --numerics (Note [Declared numerics] in replay/numerics.cc): "none"; a
// file; or, by default, <home>/configs/numerics/<backend>.json when there is
// one, else what the backend declares itself (asked where it is made:
// source WorkerSetup::kAskBackend). A file is checked here; errors name it.
struct NumericsChoice {
  std::string text, source;
  replay::DeclaredNumerics declared;  // parsed (empty for "none" and for the backend's own, read later)
};
Result<NumericsChoice> ResolveNumerics(const GlobalOptions& global, const RunFlags& flags);
// What a run's config records of the numerics it is judged under (`declared`:
// the declaration's JSON text, "" for none; resuming under others is
// refused): {"source": ..., "declared": "<summary>", "sha256": ...}.
nlohmann::json NumericsRecord(const RunContext& context, const std::string& declared);

// The executor a family's stage loop talks to (Base: replay::CaseExecutor,
// replay::ProgramStageRunner). --isolation=process: `Isolated` over worker
// processes set up with `setup`, the first one started, so that a backend
// that cannot load is an error before anything runs (*isolated points at
// it); none: `in_process(backend)` in this process. Returns the executor,
// or the exit code of the failure, which is reported; *identity: the
// backend as the run records it (name and version).
template <typename Isolated, typename Base>
std::variant<std::unique_ptr<Base>, int> MakeExecutor(
    const RunContext& context, isolation::WorkerSetup setup,
    const std::function<Result<std::unique_ptr<Base>>(std::shared_ptr<backends::Backend>,
                                                      const isolation::WorkerSetup&)>& in_process,
    Isolated** isolated, backends::BackendIdentity* identity) {
  if (context.flags.isolation == "process") {
    // The parent never touches the backend: workers load it (Note [Worker processes]).
    auto options = MakeIsolation(context.global, context.flags, std::move(setup), context.stop);
    if (!options) return ReportError(options.error());
    auto e = std::make_unique<Isolated>(std::move(*options));
    Status started = e->Start();
    if (!started.ok()) return StartFailed(started, context.flags.backend, context.stop);
    *isolated = e.get();
    *identity = {e->backend_name(), e->backend_version()};
    return std::unique_ptr<Base>(std::move(e));
  }
  auto backend = context.backends.Create(context.flags.backend);
  if (!backend) return ReportError(backend.error().WithContext("--backend"));
  if (Status named = backends::NameDevice(**backend, context.flags.device_name); !named.ok()) {
    return ReportError(named.WithContext("--device-name"));
  }
  *identity = backends::IdentityOf(**backend);
  ApplyHostSettings(context.global);
  if (Status s = setup.UseBackendNumerics(context.flags.backend, backends::BackendNumericsOf(**backend)); !s.ok()) {
    return ReportError(s.WithContext("--numerics"));
  }
  auto made = in_process(*backend, setup);
  if (!made) return ReportError(made.error());
  return std::move(*made);
}

}  // namespace coverage::apps
