#include "stages/stage_run.h"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <ctime>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/text_safety.h"
#include "registry/registry.h"

namespace coverage::stages {
namespace {

std::string FormatTime(const char* format) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

nlohmann::json Member(const std::string& config_json, const std::string& name) {
  nlohmann::json j = nlohmann::json::parse(config_json, nullptr, false);
  return j.is_object() && j.contains(name) ? j[name] : nlohmann::json();
}

}  // namespace

std::string NowIso8601() { return FormatTime("%Y-%m-%dT%H:%M:%SZ"); }

std::string NewRunId(const std::string& backend, const std::string& stage) {
  std::string safe;
  for (char c : backend) safe.push_back(std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  // Milliseconds and the process id keep two runs started in one second apart.
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count() % 1000;
  return FormatTime("%Y%m%dT%H%M%S") + fmt::format("{:03d}Z-{}-{}-{}", ms, safe, stage, getpid());
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
  COV_ASSIGN_OR_RETURN(auto marks, registry.InFlight(run.id_));
  run.in_flight_.insert(marks.begin(), marks.end());
  if (options.shard.active()) {
    COV_RETURN_IF_ERROR(
        registry.StartShard(run.id_, options.shard.index, options.shard.count, options.host, NowIso8601()));
  }
  return run;
}

Status StageRun::Begin(const std::string& mark) {
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
