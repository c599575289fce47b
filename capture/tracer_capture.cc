#include "capture/tracer_capture.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "capture/trace_reader.h"
#include "capture/tracer_process.h"
#include "core/progress.h"
#include "core/sha256.h"

namespace coverage::capture {
namespace {

constexpr int kTracerUsageExit = 2;
constexpr int kTracerErrorExit = 3;

struct Pair {
  size_t model = 0;
  const CaptureProfileRef* profile = nullptr;
  std::string config_sha;
};

struct PairResult {
  size_t pair = 0;
  registry::ProgramRecord record;
  std::optional<Program> program;
  bool interrupted = false;
  Status fatal;  // stops the whole capture
};

std::string OneLine(std::string text, size_t max = 2000) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  if (text.size() > max) text = text.substr(0, max) + "...";
  return text;
}

// A job's warm tracer (Note [Tracer server]): started when missing; one
// that never got ready is not started again by this job.
struct JobTracer {
  std::unique_ptr<TracerServer> server;
  bool server_failed = false;
};

// Runs the tracer on one pair, in the job's warm tracer (started when
// missing) or, when there is none or it failed, in a fresh interpreter;
// never touches the registry.
PairResult TracePair(const TracerCaptureOptions& options, const std::vector<Pair>& pairs, size_t index,
                     int threads, JobTracer* job) {
  const Pair& pair = pairs[index];
  const CaptureModel& model = options.models[pair.model];
  const TracerSettings& t = options.tracer;
  PairResult out;
  out.pair = index;
  registry::ProgramRecord& rec = out.record;
  rec.model_id = model.id;
  rec.profile = pair.profile->name;
  rec.tracer_version = kTracerVersion;
  rec.max_layers = t.max_layers;
  rec.max_experts = t.max_experts;
  rec.config_sha256 = pair.config_sha;
  rec.max_gb = t.max_gb;
  rec.device_option = t.device;
  rec.seed = t.seed;

  TracerCommand cmd;
  cmd.python = t.python;
  cmd.package_dir = t.package_dir;
  cmd.args = {"--config", "-", "--profile", pair.profile->name, "--model-id", model.id,
              "--max-layers", std::to_string(t.max_layers), "--max-experts", std::to_string(t.max_experts),
              "--device", t.device,
              "--max-gb", fmt::format("{}", t.max_gb), "--seed", std::to_string(t.seed)};
  if (!t.profiles_path.empty()) {
    cmd.args.push_back("--profiles");
    cmd.args.push_back(t.profiles_path);
  }
  cmd.stdin_text = model.config_json;
  cmd.timeout_s = t.timeout_s;
  cmd.memory_limit_bytes = (t.memory_limit_gb > 0 ? t.memory_limit_gb : t.max_gb + 3) * 1e9;
  cmd.threads = threads;
  cmd.stop = options.stop;
  std::optional<TraceReader> reader;
  const auto feed = [&](std::string_view line) { return reader->Feed(line); };
  Result<TracerExit> exit = Status::IoError("no tracer ran");
  std::unique_ptr<TracerServer>* server = job ? &job->server : nullptr;
  if (server && !*server && !job->server_failed) {
    // Its imports take seconds; a server not ready in 10-120 s (the pair's
    // deadline, bounded) is not coming.
    auto started = TracerServer::Start(t.python, t.package_dir, threads, std::clamp(t.timeout_s, 10.0, 120.0));
    if (started) {
      *server = std::move(*started);
    } else {
      job->server_failed = true;  // this job's pairs run in fresh interpreters from now on
    }
  }
  if (server && *server) {
    reader.emplace();
    exit = (*server)->Run(cmd, feed);
    if (!exit || !(*server)->usable()) server->reset();  // the next pair starts another
  }
  if (!exit) {
    reader.emplace();
    exit = RunTracerProcess(cmd, feed);
  }
  if (!exit) {
    out.fatal = exit.error().WithContext("the capture tracer (run bash scripts/setup.sh to make the project venv)");
    return out;
  }
  rec.seconds = exit->seconds;
  rec.peak_rss_mb = exit->peak_rss_bytes / 1e6;
  const auto fail = [&](const std::string& stage, std::string reason) {
    rec.status = "failed";
    rec.stage = stage;
    rec.reason = OneLine(std::move(reason));
  };
  using Kind = TracerExit::Kind;
  switch (exit->kind) {
    case Kind::kInterrupted:
      out.interrupted = true;
      return out;
    case Kind::kTimeout:
      fail("timeout", fmt::format("the tracer gave no result within {:.0f} s (--timeout)", t.timeout_s));
      return out;
    case Kind::kMemory:
      fail("memory", fmt::format("the tracer's resident memory went over {:.1f} GB (--tracer-memory-gb)",
                                 cmd.memory_limit_bytes / 1e9));
      return out;
    case Kind::kAborted:
      fail("output", "unreadable tracer output: " + exit->callback_error.message());
      return out;
    case Kind::kSignaled:
      fail("crash", fmt::format("the tracer was {}; its last output: {}", exit->Description(),
                                exit->stderr_tail.empty() ? "(none)" : exit->stderr_tail));
      return out;
    case Kind::kExited:
      break;
  }
  if (exit->exit_status == kTracerUsageExit) {
    out.fatal = Status::InvalidArgument("the capture tracer refused its command line: " + OneLine(exit->stderr_tail));
    return out;
  }
  auto outcome = reader->Finish();
  if (!outcome) {
    fail(exit->exit_status == 0 ? "output" : "crash",
         fmt::format("{} ({}); its last output: {}", outcome.error().message(), exit->Description(),
                     exit->stderr_tail.empty() ? "(none)" : exit->stderr_tail));
    return out;
  }
  if (outcome->error) {
    const TraceError& e = *outcome->error;
    rec.status = StatusForStage(e.stage);
    rec.stage = e.stage;
    rec.reason = OneLine(e.reason);
    rec.exception = e.exception;
    if (exit->exit_status != kTracerErrorExit) {
      fail("crash", fmt::format("an error record with {}: {}", exit->Description(), e.reason));
    }
    return out;
  }
  if (exit->exit_status != 0) {
    fail("crash", fmt::format("a complete trace but {}", exit->Description()));
    return out;
  }
  if (outcome->program->info.model_id != model.id || outcome->program->info.profile != pair.profile->name) {
    fail("output", fmt::format("the trace is of {} / {}", outcome->program->info.model_id,
                               outcome->program->info.profile));
    return out;
  }
  rec.status = "captured";
  rec.info = outcome->program->info;
  out.program = std::move(outcome->program);
  return out;
}

// A pair whose tracer process failed (crashed, hung, ran out of memory,
// printed no trace: a broken interpreter, a killed machine) says nothing
// about the model and is traced again by a plain rerun; what the library
// said about the model (not_built, refused, failed in the run) stands until
// the config, the tracer or the options change.
bool FailedOutsideTheModel(const registry::ProgramRecord& r) {
  return r.status == "failed" && (r.stage == "crash" || r.stage == "timeout" || r.stage == "memory" ||
                                  r.stage == "output");
}

// The kind a "profile does not apply" refusal names: the tracer writes
// "...; LlamaForCausalLM is a model of kind decoder".
std::string KindNamedIn(const std::string& reason) {
  static const std::string kMarker = " is a model of kind ";
  const auto at = reason.rfind(kMarker);
  if (at == std::string::npos) return "";
  std::string kind = reason.substr(at + kMarker.size());
  while (!kind.empty() && (kind.back() == '.' || kind.back() == ' ' || kind.back() == '\n')) kind.pop_back();
  return kind;
}

}  // namespace

std::string StatusForStage(const std::string& stage) {
  if (stage == "config" || stage == "build") return "not_built";
  if (stage == "profile") return "not_applicable";
  if (stage == "budget") return "refused";
  return "failed";
}

Result<TracerCaptureSummary> RunTracerCapture(registry::Registry& registry, const TracerCaptureOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  TracerCaptureSummary summary;
  const TracerSettings& t = options.tracer;
  if (!std::filesystem::exists(t.python)) {
    return Status::NotFound(fmt::format(
        "the capture tracer needs the project venv's Python, and '{}' does not exist: run bash scripts/setup.sh "
        "(or pass --python)",
        t.python));
  }
  if (!std::filesystem::exists(std::filesystem::path(t.package_dir) / "coverage_tracer" / "__main__.py")) {
    return Status::NotFound(fmt::format("the capture tracer package is not in '{}'", t.package_dir));
  }
  if (options.jobs < 1) return Status::InvalidArgument("--jobs must be at least 1");

  // Every pair, model by model; then what is already stored.
  std::vector<Pair> pairs;
  for (size_t m = 0; m < options.models.size(); ++m) {
    const CaptureModel& model = options.models[m];
    const std::string sha = Sha256Hex(model.config_json);
    for (const auto& p : options.profiles) {
      if (!model.structure.empty() &&
          std::find(p.families.begin(), p.families.end(), model.structure) == p.families.end()) {
        continue;
      }
      pairs.push_back({m, &p, sha});
    }
  }
  // Per model: kinds the tracer named when a profile did not apply, and
  // whether any pair had another outcome (Note [Kinds the tracer names]).
  std::vector<std::set<std::string>> named_kinds(options.models.size());
  std::vector<bool> applied(options.models.size(), false);
  auto note_outcome = [&](size_t model, const std::string& status, const std::string& reason) {
    if (status == "not_applicable") {
      if (std::string k = KindNamedIn(reason); !k.empty()) named_kinds[model].insert(k);
    } else {
      applied[model] = true;
    }
  };
  // The pairs [from, pairs.size()) not already stored from the same tracing.
  auto pending = [&](size_t from) -> Result<std::vector<size_t>> {
    std::vector<size_t> out;
    for (size_t i = from; i < pairs.size(); ++i) {
      if (!options.force) {
        COV_ASSIGN_OR_RETURN(auto stored, registry.GetProgramRecord(options.models[pairs[i].model].id,
                                                                    pairs[i].profile->name));
        // Done when traced the same way; a refusal is retried with a larger
        // budget, and a failure of the tracer process rather than of the
        // model (FailedOutsideTheModel) by any rerun.
        if (stored && !FailedOutsideTheModel(*stored) && stored->tracer_version == kTracerVersion &&
            stored->max_layers == t.max_layers &&
            stored->max_experts == t.max_experts &&
            stored->config_sha256 == pairs[i].config_sha && stored->device_option == t.device &&
            stored->seed == t.seed && !(stored->status == "refused" && t.max_gb > stored->max_gb)) {
          ++summary.skipped;
          note_outcome(pairs[i].model, stored->status, stored->reason);
          continue;
        }
      }
      out.push_back(i);
    }
    return out;
  };
  summary.pairs = static_cast<int64_t>(pairs.size());
  COV_ASSIGN_OR_RETURN(std::vector<size_t> todo, pending(0));
  COV_ASSIGN_OR_RETURN(int64_t cases_before, registry.CountCases());

  const int jobs = std::max(1, std::min<int>(options.jobs, static_cast<int>(std::max<size_t>(todo.size(), 1))));
  const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  const int threads = t.threads > 0 ? t.threads : std::max(1, static_cast<int>(cores / jobs));
  std::vector<bool> model_captured(options.models.size(), false);
  std::unordered_map<size_t, registry::ProgramRecord> unbuildable;  // model index -> its not_built record
  Status failure;
  std::unique_ptr<Progress> progress;

  // One round over `todo`. Workers trace; this thread stores. A model that
  // transformers cannot build is not built in every profile: later pairs of
  // it reuse the record.
  auto run_round = [&](const std::vector<size_t>& todo) {
    size_t received = 0;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<PairResult> done;
    size_t next = 0;
    bool abort = false;
    int active = 0;  // workers that have not returned
    const auto worker = [&]() {
      JobTracer tracer;
      for (;;) {
        size_t index;
        std::optional<registry::ProgramRecord> reuse;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (abort || next >= todo.size() || (options.stop && options.stop->load())) {
            --active;
            cv.notify_all();
            return;
          }
          index = todo[next++];
          auto it = unbuildable.find(pairs[index].model);
          if (it != unbuildable.end()) reuse = it->second;
        }
        PairResult r;
        if (reuse) {
          r.pair = index;
          r.record = *reuse;
          r.record.profile = pairs[index].profile->name;
          r.record.seconds = 0;
          r.record.peak_rss_mb = 0;
        } else {
          r = TracePair(options, pairs, index, threads, t.server ? &tracer : nullptr);
        }
        std::lock_guard<std::mutex> lock(mu);
        if (r.record.status == "not_built") unbuildable.emplace(pairs[index].model, r.record);
        if (!r.fatal.ok()) abort = true;
        done.push_back(std::move(r));
        cv.notify_all();
      }
    };
    std::vector<std::thread> workers;
    active = todo.empty() ? 0 : jobs;
    for (int i = 0; i < active; ++i) workers.emplace_back(worker);
    for (;;) {
      PairResult r;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return !done.empty() || active == 0; });
        if (done.empty()) break;  // every worker returned and everything is stored
        r = std::move(done.front());
        done.pop_front();
      }
      ++received;
      if (!r.fatal.ok()) {
        failure = r.fatal;
        break;
      }
      if (r.interrupted) {
        summary.interrupted = true;
        continue;
      }
      const Pair& pair = pairs[r.pair];
      const CaptureModel& model = options.models[pair.model];
      progress->Update(static_cast<int64_t>(received), model.id + " / " + pair.profile->name);
      registry::ModelRecord m{model.id, model.model_type, model.source, model.config_json};
      Status stored = registry.StoreProgram(m, &r.record, r.program ? &*r.program : nullptr);
      if (!stored.ok()) {
        failure = stored;
        std::lock_guard<std::mutex> lock(mu);
        abort = true;
        break;
      }
      const std::string& status = r.record.status;
      note_outcome(pair.model, status, r.record.reason);
      if (status == "captured") {
        ++summary.captured;
        (r.record.info.device == "meta" ? summary.on_meta : summary.on_cpu) += 1;
        summary.calls += r.record.calls;
        summary.unsupported_calls += r.record.unsupported_calls;
        summary.cases_seen += r.record.cases;
        model_captured[pair.model] = true;
      } else {
        if (status == "not_built") ++summary.not_built;
        if (status == "not_applicable") ++summary.not_applicable;
        if (status == "refused") ++summary.refused;
        if (status == "failed") ++summary.failed;
        if (status != "not_applicable") {
          ++summary.reasons[fmt::format("{} ({}): {}", status, r.record.stage, r.record.reason.substr(0, 300))];
        }
      }
      if (options.stop && options.stop->load()) summary.interrupted = true;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      abort = abort || !failure.ok();
    }
    for (auto& w : workers) w.join();
    if (received < todo.size()) summary.interrupted = true;
  };

  progress = std::make_unique<Progress>("capture", static_cast<int64_t>(todo.size()), options.progress);
  run_round(todo);
  // Note [Kinds the tracer names]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // Profiles are tried by the structure the feature extractor read from the
  // config, which can differ from the kind transformers builds (a CLIP image
  // classifier read as multimodal, a speech model as encoder-decoder). A
  // model whose every pair came back "does not apply" with a kind it was not
  // tried for gets a second round with that kind's profiles.
  if (failure.ok() && !summary.interrupted && !(options.stop && options.stop->load())) {
    const size_t first_new = pairs.size();
    for (size_t m = 0; m < options.models.size(); ++m) {
      if (applied[m] || options.models[m].structure.empty()) continue;
      for (const std::string& kind : named_kinds[m]) {
        if (kind == options.models[m].structure) continue;
        for (const auto& p : options.profiles) {
          if (std::find(p.families.begin(), p.families.end(), kind) == p.families.end()) continue;
          const bool queued = std::any_of(pairs.begin(), pairs.end(), [&](const Pair& q) {
            return q.model == m && q.profile->name == p.name;
          });
          if (!queued) pairs.push_back({m, &p, Sha256Hex(options.models[m].config_json)});
        }
      }
    }
    summary.pairs = static_cast<int64_t>(pairs.size());
    COV_ASSIGN_OR_RETURN(std::vector<size_t> again, pending(first_new));
    if (!again.empty()) {
      progress->Finish();
      progress = std::make_unique<Progress>("capture (the kinds the tracer named)", static_cast<int64_t>(again.size()),
                                            options.progress);
      run_round(again);
    }
  }
  progress->Finish();
  if (!failure.ok()) return failure;
  for (bool c : model_captured) summary.models_captured += c;
  // Recaptures can leave cases no program calls and no run used.
  COV_ASSIGN_OR_RETURN(int64_t pruned, registry.PruneOrphanCases());
  (void)pruned;
  COV_ASSIGN_OR_RETURN(summary.cases_total, registry.CountCases());
  summary.cases_new = summary.cases_total - cases_before;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return summary;
}

}  // namespace coverage::capture
