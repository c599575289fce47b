// The skeleton every test stage shares (unit, module, model, train): the run
// record, the resume check of the options that judge results, in-flight
// marks, shards, stopping and finishing. A stage loop plans its work, asks
// Owns() which items are its shard's, calls Begin(mark) before handing an
// item to its executor, stores the result with the mark cleared in the same
// transaction (the registry's Record* calls do), and calls Finish().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/result.h"
#include "registry/registry.h"
#include "stages/shard.h"

namespace coverage::stages {

// What every stage run is told; the stages' options derive from it.
struct StageRunOptions {
  std::string run_id;                   // empty: a new id from the time (NewRunId)
  std::string backend = "cpu";          // stored with the run
  std::string backend_name;             // stored with the run: backends::BackendIdentity
  std::string backend_version;
  std::string libtorch_version;
  std::string host;
  std::string git_revision;
  std::string config_json;              // effective options, stored with the run; the member that
                                        // judges results must match when the run is resumed
  Shard shard;                          // run only this shard's items (stages/shard.h)
  bool progress = true;
  const std::atomic<bool>* stop = nullptr;  // set (e.g. by SIGINT) to stop after the current item
  std::function<void(const std::string&)> notice;  // told what the user should know at once (a takeover)
};

class StageRun {
 public:
  // Creates run `options.run_id` (a new id made from `id_stage` when empty)
  // as stage `stage`, or resumes it. A resumed run must have been started
  // for the same stage and with the same `judging` member of config_json
  // ("replay" for the unit stage, "checks" for the model stages): results
  // judged two ways never mix. Loads the run's in-flight marks and, for a
  // shard, records its start.
  //
  // One process writes a run (or one shard of it) at a time: Open takes the
  // run's lease and refuses, writing nothing, while another live process
  // holds it; a lease whose holder is gone is taken over (taken_over()).
  // The lease is renewed as items begin and given back when the StageRun is
  // destroyed. Note [Run leases].
  static Result<StageRun> Open(registry::Registry& registry, const std::string& stage, const std::string& id_stage,
                               const std::string& judging, const StageRunOptions& options);

  const std::string& id() const { return id_; }
  bool resumed() const { return resumed_; }
  // This invocation's shard runs the item with this key (a case key, a model id).
  bool Owns(const std::string& key) const { return options_->shard.Contains(key); }
  // An earlier invocation sent this item to its executor and stopped before
  // its result ("case:<id>", "model:<id>:<stage>").
  bool WasInFlight(const std::string& mark) const { return in_flight_.count(mark) > 0; }
  bool StopRequested() const { return options_->stop != nullptr && options_->stop->load(); }
  // Leases of processes that were gone, taken over by this one.
  const std::vector<registry::RunLease>& taken_over() const { return taken_over_; }
  // Marks the item in flight before it is handed to an executor (and
  // renews the lease when it is due; an error when another process has
  // taken the run over).
  Status Begin(const std::string& mark);
  // A shard finishes its part, a whole run the run; an interrupted
  // invocation finishes nothing.
  Status Finish(bool interrupted);

  StageRun(StageRun&& other) noexcept { *this = std::move(other); }
  StageRun& operator=(StageRun&& other) noexcept;
  StageRun(const StageRun&) = delete;
  StageRun& operator=(const StageRun&) = delete;
  ~StageRun();

 private:
  StageRun(registry::Registry& registry, const StageRunOptions& options) : registry_(&registry), options_(&options) {}
  void Release();
  registry::Registry* registry_ = nullptr;
  const StageRunOptions* options_ = nullptr;
  std::string id_;
  bool resumed_ = false;
  std::set<std::string> in_flight_;
  std::optional<registry::RunLease> lease_;
  std::chrono::steady_clock::time_point renewed_;
  std::vector<registry::RunLease> taken_over_;
};

// A lease held on another host is the holder's as long as it was renewed
// within this many seconds; on this host the holder's process is looked at.
inline constexpr int64_t kRunLeaseLifeSeconds = 600;
inline constexpr int64_t kRunLeaseRenewSeconds = 60;

// When process `pid` of this machine started (clock ticks after boot, as
// /proc/<pid>/stat says); nullopt when there is no such process or it has
// exited (a zombie). A pid with another start time is another process.
std::optional<int64_t> ProcessStartTicks(int64_t pid);
// Whether the lease's holder still runs, seen from `host` (Note [Run leases]).
bool RunLeaseHolderIsLive(const registry::RunLease& lease, const std::string& host);

// "20261130T014233512Z-cpu-unit-4242" style ids (UTC time to the
// millisecond, backend, stage, process id).
std::string NewRunId(const std::string& backend, const std::string& stage);
std::string NowIso8601();

}  // namespace coverage::stages
