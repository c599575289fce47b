#include "stages/stage_run.h"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <fstream>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/text_safety.h"
#include "core/utc_time.h"
#include "registry/registry.h"

namespace coverage::stages {
namespace {

nlohmann::json Member(const std::string& config_json, const std::string& name) {
  nlohmann::json j = nlohmann::json::parse(config_json, nullptr, false);
  return j.is_object() && j.contains(name) ? j[name] : nlohmann::json();
}

// Note [Run leases]
// Two processes writing one run id both run every case and store each result
// twice over. So a stage run holds a lease row (run_leases, schema v9) for
// its run, or its shard, from Open to its end. The holder is named by host,
// pid and the pid's start time: on the same host a holder is alive while a
// process with that pid and start time exists and has not exited (a reused
// pid has another start time), so a lease left by a SIGKILL is taken over at
// once, and the taker says so. A holder on another host (a registry on a
// shared disk) cannot be looked at: its lease is alive while renewed within
// kRunLeaseLifeSeconds; Begin renews it every kRunLeaseRenewSeconds, and a
// holder that finds its lease taken over stops with an error rather than
// write alongside the new one. Shards of one split hold separate leases, so
// `--shard i/N` is how several processes write one run together.

std::string Who(const registry::RunLease& l) {
  return fmt::format("process {} on host '{}' (since {}, last renewed {})", l.pid, l.host, l.acquired_at,
                     l.renewed_at);
}

std::string Part(const registry::RunLease& l) {
  return l.shard_count == 0 ? std::string("run") : fmt::format("shard {}/{} of run", l.shard_index, l.shard_count);
}

}  // namespace

std::optional<int64_t> ProcessStartTicks(int64_t pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return std::nullopt;
  // "pid (comm) state ppid ... starttime ...": comm may hold spaces and
  // parentheses, so the fields are counted from the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(close + 1));
  std::string state;
  fields >> state;
  if (state == "Z" || state == "X" || state == "x") return std::nullopt;
  std::string field;
  for (int i = 4; i <= 22; ++i) {  // field 3 was the state; starttime is field 22
    if (!(fields >> field)) return std::nullopt;
  }
  try {
    return std::stoll(field);
  } catch (...) {
    return std::nullopt;
  }
}

bool RunLeaseHolderIsLive(const registry::RunLease& lease, const std::string& host) {
  if (lease.host != host) return lease.age_seconds < kRunLeaseLifeSeconds;
  const auto started = ProcessStartTicks(lease.pid);
  return started && *started == lease.process_start;
}

std::string NowIso8601() { return UtcNowIso8601Ms(); }

std::string NewRunId(const std::string& backend, const std::string& stage) {
  std::string safe;
  for (char c : backend) safe.push_back(std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  // Milliseconds and the process id keep two runs started in one second apart.
  return UtcNowCompactMs() + fmt::format("-{}-{}-{}", safe, stage, getpid());
}

Result<StageRun> StageRun::Open(registry::Registry& registry, const std::string& stage, const std::string& id_stage,
                                const std::string& judging, const StageRunOptions& options) {
  StageRun run(registry, options);
  run.id_ = options.run_id.empty() ? NewRunId(options.backend, id_stage) : options.run_id;
  COV_RETURN_IF_ERROR(CheckRunId(run.id_, "--run"));
  registry::RunRecord record;
  record.run_id = run.id_;
  record.stage = stage;
  record.backend = options.backend;
  record.backend_name = options.backend_name;
  record.backend_version = options.backend_version;
  record.started_at = NowIso8601();
  record.libtorch_version = options.libtorch_version;
  record.host = options.host;
  record.git_revision = options.git_revision;
  record.config_json = options.config_json;
  COV_ASSIGN_OR_RETURN(auto stored, registry.CreateOrResumeRun(record, &run.resumed_));
  if (run.resumed_) {
    const nlohmann::json before = Member(stored.config_json, judging), now = Member(options.config_json, judging);
    if (before != now) {
      return Status::InvalidArgument("run '" + stored.run_id + "' was started with " + judging + " options " +
                                     before.dump() + "; resuming it with " + now.dump() +
                                     " would mix results judged differently (pass the same options or a new --run id)");
    }
  }
  registry::RunLease mine;
  mine.run_id = run.id_;
  if (options.shard.active()) {
    mine.shard_index = options.shard.index;
    mine.shard_count = options.shard.count;
  }
  mine.host = options.host;
  mine.pid = getpid();
  mine.process_start = ProcessStartTicks(mine.pid).value_or(0);
  COV_ASSIGN_OR_RETURN(
      auto holder, registry.AcquireRunLease(
                       mine, [&](const registry::RunLease& l) { return RunLeaseHolderIsLive(l, options.host); },
                       &run.taken_over_));
  if (holder) {
    return Status::AlreadyExists(fmt::format(
        "{} '{}' is being written by {}: one run id has one writer at a time. Wait for it to end and resume with the "
        "same --run, choose another --run id, or split the run with --shard i/N (each shard its own writer); "
        "nothing was written",
        Part(*holder), run.id_, Who(*holder)));
  }
  run.lease_ = mine;
  if (options.notice) {
    for (const auto& gone : run.taken_over_) {
      options.notice(fmt::format("{} '{}': taking over from {}, which is no longer running", Part(gone), run.id_,
                                 Who(gone)));
    }
  }
  run.renewed_ = std::chrono::steady_clock::now();
  COV_ASSIGN_OR_RETURN(auto marks, registry.InFlight(run.id_));
  run.in_flight_.insert(marks.begin(), marks.end());
  if (options.shard.active()) {
    COV_RETURN_IF_ERROR(
        registry.StartShard(run.id_, options.shard.index, options.shard.count, options.host, NowIso8601()));
  }
  return run;
}

StageRun& StageRun::operator=(StageRun&& other) noexcept {
  if (this == &other) return *this;
  Release();
  registry_ = other.registry_;
  options_ = other.options_;
  id_ = std::move(other.id_);
  resumed_ = other.resumed_;
  in_flight_ = std::move(other.in_flight_);
  lease_ = std::exchange(other.lease_, std::nullopt);
  renewed_ = other.renewed_;
  taken_over_ = std::move(other.taken_over_);
  return *this;
}

StageRun::~StageRun() { Release(); }

void StageRun::Release() {
  if (!lease_) return;
  // A failure leaves a lease whose holder is gone: the next run takes it over.
  (void)registry_->ReleaseRunLease(*lease_);
  lease_.reset();
}

Status StageRun::Begin(const std::string& mark) {
  const auto now = std::chrono::steady_clock::now();
  if (lease_ && now - renewed_ >= std::chrono::seconds(kRunLeaseRenewSeconds)) {
    COV_RETURN_IF_ERROR(registry_->RenewRunLease(*lease_));
    renewed_ = now;
  }
  return registry_->MarkInFlight(id_, mark, options_->host, getpid());
}

Status StageRun::Finish(bool interrupted) {
  if (interrupted) return Status::Ok();
  // A shard finishes its part; the run is finished when `coverage merge` has
  // every shard (Registry::MergeFrom).
  return options_->shard.active()
             ? registry_->FinishShard(id_, options_->shard.index, options_->shard.count, NowIso8601())
             : registry_->FinishRun(id_, NowIso8601());
}

}  // namespace coverage::stages
