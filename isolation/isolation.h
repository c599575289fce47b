// Isolation: running cases and model stages in worker processes (worker.h),
// so that a backend that crashes, hangs or corrupts its process costs one
// case, never the run.
//
// Parent side: IsolatedCaseExecutor (the unit stage's CaseExecutor) and
// IsolatedModelStageRunner (the model stages' ProgramStageRunner) send one
// request per case to a long-lived worker and turn what happens into the
// same CaseResult / ModelItemResults an in-process run gives:
//   - the worker dies (signal, exit)  -> kCrash, with the signal and the last
//                                        lines the worker printed;
//   - no reply before the deadline    -> kTimeout; the worker is killed;
// in both cases the next request gets a fresh worker and the run goes on.
// Reruns (Note [Reruns]): a case that failed is run again alone, each time in
// a fresh worker, up to `reruns` times or until an attempt passes; the
// result is the first attempt's, with the number of attempts, each
// attempt's outcome and whether they disagreed (flaky) recorded.
//
// Worker side: apps/worker_service.h answers the requests (`coverage
// worker`), each test stage family its own (apps/test_stages.h). Messages
// are JSON lines, each one object; records travel as JSON values, never as
// JSON text inside a string:
//   {"setup": {...WorkerSetup}}       -> {"ready": true, "backend_name": "...", "backend_version": "...",
//                                         "numerics": "..."} | {"error": "..."}
//   {"unit": {...OpCase}, "again": b}  -> {"result": {...CaseResult}}
//   {"model": {stage, model_id, profile}} -> {"items": [...]}   (the worker loads the
//                                        program from the setup's registry)
//
// Thread safety: each object is used by one thread.
#pragma once

#include <map>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/case_result.h"
#include "core/op_case.h"
#include "core/result.h"
#include "core/program.h"
#include "replay/model_check.h"
#include "replay/program_replay.h"
#include "replay/replay.h"
#include "isolation/worker.h"

namespace coverage::isolation {

using replay::CaseExecutor;
using replay::GoldenMode;
using replay::ModelCheckOptions;
using replay::ProgramStageRunner;
using replay::ReplayOptions;

// Per-case deadlines and reruns (configs/isolation.json, see configs/README.md).
// The memory a worker may hold when isolation.json says "auto": the
// machine's physical memory, or its cgroup's limit when lower, less a fifth
// of it and at least 3 GB for the parent and everything else.
int64_t DefaultMemoryCeilingBytes();

struct IsolationPolicy {
  double unit_timeout_s = 60;                   // one op case, all its backend and reference runs
  std::map<std::string, double> op_timeout_s;   // "aten::op" or "aten::op.overload": replaces unit_timeout_s
  std::map<std::string, double> stage_timeout_s = {{"module", 900}, {"model", 900}, {"train", 1800}};
  double startup_timeout_s = 300;               // a worker loading its backend
  int reruns = 3;                               // failed cases run again alone in fresh workers, at most this often
  // Model stages are rerun only after a crash or timeout: their verdicts are
  // deterministic (seeded inputs and weights) and a rerun costs a whole model.
  bool rerun_model_failures = false;
  // Keep spare workers started (their libraries loaded): one to replace a
  // crashed or hung worker, and, once reruns happen, one for each attempt
  // number in use, so neither waits for a process start. Off by default: a
  // spare starting while a case is timed takes a core from it, and on a
  // small machine a parallel kernel then waits a scheduler time slice
  // (measured: warm latencies of 8 and 16 ms instead of 0.2 ms).
  bool standby = false;
  // Note [A memory ceiling] in worker.cc: a worker past this much resident
  // memory is killed and what it ran is skipped as over memory. Unset
  // ("auto"): the machine's memory (or its cgroup's limit) less a reserve
  // for the parent and the rest of the machine, DefaultMemoryCeilingBytes();
  // 0: no ceiling.
  std::optional<double> memory_ceiling_gb;

  int64_t MemoryCeilingBytes() const;
  double TimeoutFor(const OpCase& op_case) const;
  double TimeoutForStage(const std::string& stage) const;
  // Parses configs/isolation.json; errors name `source` and the key.
  // `stages`: the stages stage_timeout_s may name (the test stages that run
  // one model per request, apps/test_stages.h).
  static Result<IsolationPolicy> FromJson(std::string_view json, std::string_view source,
                                          const std::vector<std::string>& stages);
};

// Everything a worker needs before its first request.
struct WorkerSetup {
  std::string backend;             // a name BackendRegistry knows
  std::string device_name;         // --device-name: names a plugin's unnamed device ("" keeps it)
  std::string tolerances_json;     // configs/tolerances.json text
  std::string tolerances_source;   // its path, for errors
  std::string registry;            // model stages: where the worker loads programs from
  int warm_iterations = 3;
  GoldenMode golden = GoldenMode::kWhenNeeded;
  uint64_t seed = 0;
  ModelCheckOptions checks;        // comparison is filled from tolerances_json and the numerics
  // The backend's declared numerics (Note [Declared numerics] in
  // replay/numerics.cc): a declaration's text and where it came from, or
  // source kAskBackend: what the backend itself declares, once it is made.
  std::string numerics_json;
  std::string numerics_source;
  static constexpr std::string_view kAskBackend = "backend";

  nlohmann::json ToJson() const;
  static Result<WorkerSetup> FromJson(const nlohmann::json& j);
  // With source kAskBackend: takes the backend's own declaration
  // (Backend::Numerics(), a plugin's coverage_backend_numerics()) into the
  // checks. Errors name the backend's declaration.
  Status UseBackendNumerics(const std::string& backend_name, const std::string& declared);
  // The replay options it describes.
  ReplayOptions Replay() const;
};

struct IsolationOptions {
  WorkerSpawnOptions spawn;  // how to start `coverage worker` (args); attempt is set per worker
  WorkerSetup setup;
  IsolationPolicy policy;
  // Set (by SIGINT) while a worker starts: the start ends at once with
  // Aborted instead of waiting up to startup_timeout_s for a backend that
  // hangs while loading. A running case still finishes (or meets its deadline).
  const std::atomic<bool>* stop = nullptr;
};

// Counts over one executor's life.
struct IsolationStats {
  int64_t requests = 0;
  int64_t workers_started = 0;
  int64_t crashes = 0;
  int64_t timeouts = 0;
  int64_t reruns = 0;
  int64_t same_worker_reruns = 0;  // of the reruns: wrong answers run again in the long-lived worker
  int64_t flaky = 0;
};

// Shared by both executors: a current worker, fresh ones for reruns.
class WorkerPool {
 public:
  explicit WorkerPool(IsolationOptions options) : options_(std::move(options)) {}
  // Starts the long-lived worker (attempt 1) unless one is running.
  Status EnsureWorker();
  // Sends `request` to the long-lived worker (started when needed) or, with
  // attempt > 1, to a fresh worker used for this request only.
  Result<WorkerReply> Call(const std::string& request, double timeout_s, int attempt, bool measure_peak = false);
  // Note [Pipelined requests] (worker.h) on the long-lived worker: Send
  // queues a request (starting the worker when needed), Receive waits for
  // the oldest one's reply; after any reply but a kReply the worker is gone
  // and the requests queued behind it unanswered.
  Status Send(const std::string& request);
  WorkerReply Receive(double timeout_s);
  const IsolationOptions& options() const { return options_; }
  IsolationStats& stats() { return stats_; }
  // The declared numerics the last worker set up judges under (JSON text, ""
  // for none; Note [Declared numerics] in replay/numerics.cc).
  const std::string& declared_numerics() const { return declared_numerics_; }
  // The backend as the last worker set up reports it (backends::IdentityOf).
  const std::string& backend_name() const { return backend_name_; }
  const std::string& backend_version() const { return backend_version_; }

 private:
  Result<std::unique_ptr<WorkerProcess>> StartWorker(int attempt);
  void SpawnStandby(int attempt);
  IsolationOptions options_;
  std::unique_ptr<WorkerProcess> worker_;
  std::map<int, std::unique_ptr<WorkerProcess>> standby_;  // by attempt; spawned, not yet set up
  IsolationStats stats_;
  std::string declared_numerics_;
  std::string backend_name_, backend_version_;
};

class IsolatedCaseExecutor final : public CaseExecutor {
 public:
  explicit IsolatedCaseExecutor(IsolationOptions options) : pool_(std::move(options)) {}
  // Starts the first worker, so that a backend that cannot load is an error
  // before any case runs.
  Status Start() { return pool_.EnsureWorker(); }
  CaseResult Run(const OpCase& op_case) override;
  // Up to kWindow requests queued in the worker at a time (Note [Pipelined
  // requests]): it goes from one case to the next while this process stores
  // results. A crash or timeout costs its case alone (judged and rerun as
  // in Run); the cases queued behind it go to the next worker.
  void RunMany(const std::vector<const OpCase*>& cases,
               const std::function<void(size_t, CaseResult)>& on_result) override;
  static constexpr size_t kWindow = 8;
  bool Pipelines() const override { return true; }
  Status HarnessStatus() const override { return harness_; }
  const IsolationStats& stats() { return pool_.stats(); }
  const std::string& declared_numerics() const { return pool_.declared_numerics(); }
  const std::string& backend_name() const { return pool_.backend_name(); }
  const std::string& backend_version() const { return pool_.backend_version(); }

 private:
  CaseResult RunOnce(const std::string& request, const OpCase& op_case, int attempt);
  // A reply (or its absence) as the case's result.
  CaseResult FromReply(const Result<WorkerReply>& reply, const OpCase& op_case, double timeout);
  // Run's reruns of a first result that asks for them (Note [Reruns]).
  CaseResult Settle(CaseResult first, const OpCase& op_case, const std::string& request);
  WorkerPool pool_;
  Status harness_;
};

class IsolatedModelStageRunner final : public ProgramStageRunner {
 public:
  explicit IsolatedModelStageRunner(IsolationOptions options) : pool_(std::move(options)) {}
  Status Start() { return pool_.EnsureWorker(); }
  // The worker loads (model_id, profile)'s program from the registry named
  // in the setup; `program` is not sent.
  std::vector<ModelItemResult> Run(const std::string& stage, const std::string& model_id, const std::string& profile,
                                   const Program& program) override;
  Status HarnessStatus() const override { return harness_; }
  const IsolationStats& stats() { return pool_.stats(); }
  const std::string& declared_numerics() const { return pool_.declared_numerics(); }
  const std::string& backend_name() const { return pool_.backend_name(); }
  const std::string& backend_version() const { return pool_.backend_version(); }

 private:
  std::vector<ModelItemResult> RunOnce(const std::string& request, const std::string& stage, int attempt);
  // RunOnce, rerun on a crash or timeout (and value failures where the
  // policy says so), the attempts recorded in the first attempt's items.
  std::vector<ModelItemResult> RunWithReruns(const std::string& request, const std::string& stage);
  WorkerPool pool_;
  Status harness_;
};

}  // namespace coverage::isolation
