#include "isolation/isolation.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/json_double.h"
#include "isolation/protocol.h"

namespace coverage::isolation {
namespace {

using nlohmann::json;

// Note [Reruns]
// ~~~~~~~~~~~~~
// Like PyTorch's own test runner, a failure is run again before it is
// believed, and alone: each rerun gets a fresh worker (COVERAGE_ATTEMPT=k),
// so state an earlier case left behind (a poisoned cache, a leaked stream, a
// wedged device) cannot repeat the failure. Reruns stop at the first attempt
// that does not fail. The stored outcome stays the first attempt's (what a
// single run sees, so a nightly diff compares like with like); the attempts
// and their outcomes say whether the failure is consistent or flaky.
// Unsupported ops are not rerun (a missing kernel does not come and go).
// A wrong answer (a value verdict: mismatch, shape, dtype, non-finite) is
// rerun first in the same worker, which costs no process start and no
// backend set-up: when it reproduces exactly (the same outcome, message and
// error metrics) it is consistent, since the inputs are seeded and further
// reruns would only repeat it. A wrong answer that changed escalates to
// fresh workers for the remaining reruns, as crashes, hangs and errors do
// from the start; that is where flakiness lives. The same-worker rerun makes
// one backend call and no warm calls: the verdict and error metrics are what
// it must reproduce, the latency is the first run's (for sim's bf16 matmul
// mismatches the warm calls were three quarters of the rerun's backend time). On a device backend whose
// wrong answers are deterministic (sim's bf16 matmuls), this keeps reruns
// from costing a process start and a materialisation each.
bool ShouldRerunCase(Outcome o) { return IsUnexpectedFailure(o) && o != Outcome::kUnsupported; }

bool IsValueVerdict(Outcome o) {
  return o == Outcome::kMismatch || o == Outcome::kShapeMismatch || o == Outcome::kShapeDivergence ||
         o == Outcome::kDtypeMismatch ||
         o == Outcome::kNonFiniteMismatch;
}

// A rerun's time is the case's too: the run's share of op compute counts
// the backend calls of reruns as what they are.
void AddAttemptTiming(CaseTiming& into, const CaseTiming& attempt) {
  into.materialize_us += attempt.materialize_us;
  into.golden_us += attempt.golden_us;
  into.reference_us += attempt.reference_us;
  into.backend_us += attempt.backend_us;
  into.compare_us += attempt.compare_us;
  into.total_us += attempt.total_us;
}

bool SameMetric(const std::optional<double>& a, const std::optional<double>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || *a == *b || (std::isnan(*a) && std::isnan(*b));
}

bool ReproducedExactly(const CaseResult& a, const CaseResult& b) {
  return IsValueVerdict(a.outcome) && a.outcome == b.outcome && a.error == b.error &&
         SameMetric(a.max_abs_err, b.max_abs_err) && SameMetric(a.max_rel_err, b.max_rel_err) &&
         SameMetric(a.mismatch_frac, b.mismatch_frac) && SameMetric(a.cosine, b.cosine);
}

std::string Tail(const std::string& text, size_t max_lines) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    if (nl > start) lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  std::string out;
  for (size_t i = lines.size() > max_lines ? lines.size() - max_lines : 0; i < lines.size(); ++i) {
    out += (out.empty() ? "" : " | ") + lines[i];
  }
  return out;
}

// The outcome and message for a worker that did not answer.
// Note [Where a worker died]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A model-level request runs thousands of calls in one worker; when the
// backend crashes or hangs in one, the worker cannot say which. So before
// each backend call it prints a progress line (kProgressPrefix and {"call",
// "op", "module", "phase"}) on stderr; the parent keeps the last one apart
// from the worker's other output, and a crash or timeout names that call
// ("... while running the model stage, in call 41 (aten::topk, module
// 'model.layers.0.mlp')") with the line in detail "in_call".
std::string WhereItWas(const WorkerReply& reply, json* detail) {
  if (reply.progress.empty()) return "";
  json p = json::parse(reply.progress, nullptr, false);
  if (!p.is_object() || !p.contains("call") || !p["call"].is_number_integer()) return "";
  (*detail)["in_call"] = p;
  std::string where = fmt::format(", in call {}", p["call"].get<int64_t>());
  auto text = [&](const char* key) {  // a worker's line: any member may have any type
    auto it = p.find(key);
    return it != p.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const std::string op = text("op"), module = text("module");
  if (!op.empty()) where += fmt::format(" ({}{})", op, module.empty() ? "" : ", module '" + module + "'");
  return where;
}

std::pair<Outcome, std::string> Unanswered(const WorkerReply& reply, const std::string& what, double timeout_s,
                                           json* detail) {
  (*detail)["stderr_tail"] = reply.stderr_tail;
  (*detail)["seconds"] = reply.seconds;
  const std::string last = Tail(reply.stderr_tail, 3);
  const std::string where = WhereItWas(reply, detail);
  if (reply.kind == WorkerReply::Kind::kTimeout) {
    (*detail)["timeout_s"] = timeout_s;
    return {Outcome::kTimeout,
            fmt::format("no result from the worker within {:.3g} s while running {}{}; the worker was killed{}",
                        timeout_s, what, where, last.empty() ? "" : "; its last output: " + last)};
  }
  if (reply.kind == WorkerReply::Kind::kOverMemory) {  // Note [A memory ceiling] in worker.cc
    (*detail)["peak_rss_bytes"] = reply.peak_rss_bytes;
    (*detail)["memory_ceiling_bytes"] = reply.memory_ceiling_bytes;
    return {Outcome::kSkipped,
            fmt::format("over memory: peak {:.3g} GB > ceiling {:.3g} GB while running {}{}; the worker was killed",
                        reply.peak_rss_bytes / 1e9, reply.memory_ceiling_bytes / 1e9, what, where)};
  }
  if (reply.term_signal) (*detail)["signal"] = reply.term_signal;
  else (*detail)["exit_status"] = reply.exit_status;
  return {Outcome::kCrash, fmt::format("the worker died with {} while running {}{}{}", reply.DeathDescription(), what,
                                       where, last.empty() ? "" : "; its last output: " + last)};
}

Result<double> PositiveSeconds(const json& j, const std::string& where) {
  if (!j.is_number() || j.get<double>() <= 0) return Status::InvalidArgument(where + " must be a positive number of seconds");
  return j.get<double>();
}

}  // namespace

int64_t DefaultMemoryCeilingBytes() {
  double total = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    double limit = 0;
    if (in >> limit && limit > 0 && limit < total) total = limit;  // "max" reads as no number
  }
  const double reserve = std::max(3e9, total / 5);
  return static_cast<int64_t>(std::max(total - reserve, total / 2));
}

int64_t IsolationPolicy::MemoryCeilingBytes() const {
  if (!memory_ceiling_gb) return DefaultMemoryCeilingBytes();
  return static_cast<int64_t>(*memory_ceiling_gb * 1e9);
}

double IsolationPolicy::TimeoutFor(const OpCase& op_case) const {
  if (auto it = op_timeout_s.find(op_case.QualifiedName()); it != op_timeout_s.end()) return it->second;
  if (auto it = op_timeout_s.find(op_case.op); it != op_timeout_s.end()) return it->second;
  return unit_timeout_s;
}

double IsolationPolicy::TimeoutForStage(const std::string& stage) const {
  auto it = stage_timeout_s.find(stage);
  return it == stage_timeout_s.end() ? 1800 : it->second;
}

Result<IsolationPolicy> IsolationPolicy::FromJson(std::string_view text, std::string_view source,
                                                  const std::vector<std::string>& stages) {
  const std::string src(source);
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(src + ": not a JSON object");
  IsolationPolicy p;
  static const char* kKnown[] = {"comment", "timeout_s", "op_timeout_s", "stage_timeout_s", "startup_timeout_s",
                                 "reruns", "rerun_model_failures", "standby", "memory_ceiling_gb"};
  for (const auto& [key, value] : j.items()) {
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      return Status::InvalidArgument(src + ": unknown key '" + key + "'");
    }
  }
  if (j.contains("timeout_s")) {
    COV_ASSIGN_OR_RETURN(p.unit_timeout_s, PositiveSeconds(j["timeout_s"], src + ": 'timeout_s'"));
  }
  if (j.contains("startup_timeout_s")) {
    COV_ASSIGN_OR_RETURN(p.startup_timeout_s, PositiveSeconds(j["startup_timeout_s"], src + ": 'startup_timeout_s'"));
  }
  for (const char* map_key : {"op_timeout_s", "stage_timeout_s"}) {
    if (!j.contains(map_key)) continue;
    if (!j[map_key].is_object()) return Status::InvalidArgument(src + ": '" + map_key + "' must be an object");
    auto& target = std::string(map_key) == "op_timeout_s" ? p.op_timeout_s : p.stage_timeout_s;
    for (const auto& [name, value] : j[map_key].items()) {
      if (std::string(map_key) == "op_timeout_s" && name.find("::") == std::string::npos) {
        return Status::InvalidArgument(src + ": 'op_timeout_s' key '" + name + "' must name an op such as aten::mm");
      }
      if (std::string(map_key) == "stage_timeout_s" && std::find(stages.begin(), stages.end(), name) == stages.end()) {
        std::string known;
        for (const auto& s : stages) known += (known.empty() ? "" : ", ") + s;
        return Status::InvalidArgument(src + ": 'stage_timeout_s' key '" + name + "' is not a stage with its own timeout (" +
                                       known + ")");
      }
      COV_ASSIGN_OR_RETURN(target[name], PositiveSeconds(value, src + ": '" + map_key + "." + name + "'"));
    }
  }
  if (j.contains("reruns")) {
    if (!j["reruns"].is_number_integer() || j["reruns"].get<int64_t>() < 0 || j["reruns"].get<int64_t>() > 100) {
      return Status::InvalidArgument(src + ": 'reruns' must be an integer from 0 to 100");
    }
    p.reruns = j["reruns"].get<int>();
  }
  if (j.contains("rerun_model_failures")) {
    if (!j["rerun_model_failures"].is_boolean()) {
      return Status::InvalidArgument(src + ": 'rerun_model_failures' must be true or false");
    }
    p.rerun_model_failures = j["rerun_model_failures"].get<bool>();
  }
  if (j.contains("standby")) {
    if (!j["standby"].is_boolean()) return Status::InvalidArgument(src + ": 'standby' must be true or false");
    p.standby = j["standby"].get<bool>();
  }
  if (j.contains("memory_ceiling_gb")) {
    const json& m = j["memory_ceiling_gb"];
    if (m.is_string() && m.get<std::string>() == "auto") {
      p.memory_ceiling_gb.reset();
    } else if (m.is_number() && std::isfinite(m.get<double>()) && m.get<double>() >= 0 && m.get<double>() <= 1e6) {
      p.memory_ceiling_gb = m.get<double>();
    } else {
      return Status::InvalidArgument(src + ": 'memory_ceiling_gb' must be \"auto\" or a number of GB from 0 (no "
                                     "ceiling) to 1e6, got " + m.dump());
    }
  }
  return p;
}

// ---------------------------------------------------------------- parent side

void WorkerPool::SpawnStandby(int attempt) {
  auto& spare = standby_[attempt];
  if (!options_.policy.standby || (spare && spare->alive())) return;
  WorkerSpawnOptions spawn = options_.spawn;
  spawn.attempt = attempt;
  auto w = WorkerProcess::Spawn(spawn);
  spare = w ? std::move(*w) : nullptr;  // no spare is only slower
}

Result<std::unique_ptr<WorkerProcess>> WorkerPool::StartWorker(int attempt) {
  std::unique_ptr<WorkerProcess> worker;
  bool spare = false;
  if (auto it = standby_.find(attempt); it != standby_.end() && it->second && it->second->alive()) {
    worker = std::move(it->second);
    spare = true;
  } else {
    WorkerSpawnOptions spawn = options_.spawn;
    spawn.attempt = attempt;
    COV_ASSIGN_OR_RETURN(worker, WorkerProcess::Spawn(spawn));
  }
  ++stats_.workers_started;
  const std::string setup = DumpJson(json{{"setup", options_.setup.ToJson()}});
  WorkerReply reply = worker->Call(setup, options_.policy.startup_timeout_s, options_.stop);
  if (spare && reply.kind == WorkerReply::Kind::kDied) {
    // A spare that died while it waited (the OOM killer, say) says nothing
    // about the backend: start a fresh one instead.
    WorkerSpawnOptions spawn = options_.spawn;
    spawn.attempt = attempt;
    COV_ASSIGN_OR_RETURN(worker, WorkerProcess::Spawn(spawn));
    reply = worker->Call(setup, options_.policy.startup_timeout_s, options_.stop);
  }
  if (reply.kind == WorkerReply::Kind::kStopped) {
    return Status::Aborted(fmt::format("interrupted while the worker for backend '{}' was starting ({:.1f} s in)",
                                       options_.setup.backend, reply.seconds));
  }
  if (reply.kind != WorkerReply::Kind::kReply) {
    return Status::Aborted(fmt::format(
        "the worker for backend '{}' {} while starting{}", options_.setup.backend,
        reply.kind == WorkerReply::Kind::kTimeout
            ? fmt::format("did not become ready within {:.3g} s", options_.policy.startup_timeout_s)
            : "died with " + reply.DeathDescription(),
        reply.stderr_tail.empty() ? "" : "; its output:\n" + reply.stderr_tail));
  }
  auto ready = ParseSetupReply(reply.line);
  if (!ready) {
    return Status::InvalidArgument("the worker could not set up backend '" + options_.setup.backend +
                                   "': " + ready.error().message());
  }
  declared_numerics_ = ready->numerics;
  backend_name_ = ready->backend_name;
  backend_version_ = ready->backend_version;
  return worker;
}

Status WorkerPool::EnsureWorker() {
  if (worker_ && worker_->alive()) return Status::Ok();
  COV_ASSIGN_OR_RETURN(worker_, StartWorker(1));
  SpawnStandby(1);
  return Status::Ok();
}

Result<WorkerReply> WorkerPool::Call(const std::string& request, double timeout_s, int attempt, bool measure_peak) {
  ++stats_.requests;
  WorkerReply reply;
  if (attempt <= 1) {
    COV_RETURN_IF_ERROR(EnsureWorker());
    reply = worker_->Call(request, timeout_s, nullptr, measure_peak);
    if (!worker_->alive()) worker_.reset();  // replaced on the next request
  } else {
    COV_ASSIGN_OR_RETURN(auto fresh, StartWorker(attempt));
    SpawnStandby(attempt);  // the next rerun of this attempt number finds one ready
    reply = fresh->Call(request, timeout_s, nullptr, measure_peak);
  }
  if (reply.kind == WorkerReply::Kind::kDied) ++stats_.crashes;
  if (reply.kind == WorkerReply::Kind::kTimeout) ++stats_.timeouts;
  return reply;
}

Status WorkerPool::Send(const std::string& request) {
  ++stats_.requests;
  COV_RETURN_IF_ERROR(EnsureWorker());
  worker_->Send(request);
  return Status::Ok();
}

WorkerReply WorkerPool::Receive(double timeout_s) {
  WorkerReply reply = worker_->Receive(timeout_s);
  if (!worker_->alive()) worker_.reset();  // replaced on the next request
  if (reply.kind == WorkerReply::Kind::kDied) ++stats_.crashes;
  if (reply.kind == WorkerReply::Kind::kTimeout) ++stats_.timeouts;
  return reply;
}

CaseResult IsolatedCaseExecutor::RunOnce(const std::string& request, const OpCase& op_case, int attempt) {
  const double timeout = pool_.options().policy.TimeoutFor(op_case);
  return FromReply(pool_.Call(request, timeout, attempt), op_case, timeout);
}

CaseResult IsolatedCaseExecutor::FromReply(const Result<WorkerReply>& reply, const OpCase& op_case, double timeout) {
  CaseResult result;
  if (!reply) {
    harness_ = reply.error();
    result.outcome = Outcome::kError;
    result.error = reply.error().message();
    return result;
  }
  if (reply->kind != WorkerReply::Kind::kReply) {
    json detail;
    std::tie(result.outcome, result.error) = Unanswered(*reply, op_case.QualifiedName(), timeout, &detail);
    result.timing.total_us = reply->seconds * 1e6;
    result.detail_json = DumpJson(json{{"worker", detail}});
    return result;
  }
  auto parsed = ParseUnitReply(reply->line);
  if (parsed) return *parsed;
  harness_ = parsed.error();
  result.outcome = Outcome::kError;
  result.error = harness_.message();
  return result;
}

CaseResult IsolatedCaseExecutor::Run(const OpCase& op_case) {
  const std::string request = DumpJson(json{{"unit", op_case.ToJsonValue()}});
  CaseResult first = RunOnce(request, op_case, 1);
  if (!harness_.ok() || !ShouldRerunCase(first.outcome)) return first;
  return Settle(std::move(first), op_case, request);
}

void IsolatedCaseExecutor::RunMany(const std::vector<const OpCase*>& cases,
                                   const std::function<void(size_t, CaseResult)>& on_result) {
  if (cases.size() <= 1) {
    CaseExecutor::RunMany(cases, on_result);
    return;
  }
  std::vector<std::string> requests(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) requests[i] = DumpJson(json{{"unit", cases[i]->ToJsonValue()}});
  std::vector<CaseResult> firsts(cases.size());
  std::vector<size_t> again;  // first results that run again, after the rest
  size_t next = 0;            // the next case to send
  size_t queued = 0;          // cases [next - queued, next) are sent and unanswered, in order
  while (next < cases.size() || queued > 0) {
    // Stopped (SIGINT): nothing more is sent; what was sent is answered, the
    // rest stays unreported for the stage's resume.
    const bool stopping = pool_.options().stop != nullptr && pool_.options().stop->load();
    if (stopping && queued == 0) break;
    while (!stopping && next < cases.size() && queued < kWindow) {
      if (Status sent = pool_.Send(requests[next]); !sent.ok()) {
        harness_ = sent;
        return;
      }
      ++next;
      ++queued;
    }
    const size_t i = next - queued;
    const double timeout = pool_.options().policy.TimeoutFor(*cases[i]);
    const WorkerReply reply = pool_.Receive(timeout);
    --queued;
    CaseResult result = FromReply(reply, *cases[i], timeout);
    if (!harness_.ok()) return;
    if (reply.kind != WorkerReply::Kind::kReply) {
      // The worker is gone with the requests queued behind this one: they
      // go to the next worker.
      next = i + 1;
      queued = 0;
    }
    if (pool_.options().policy.reruns > 0 && ShouldRerunCase(result.outcome)) {
      firsts[i] = std::move(result);
      again.push_back(i);
    } else {
      on_result(i, std::move(result));
    }
  }
  for (size_t i : again) {
    CaseResult settled = Settle(std::move(firsts[i]), *cases[i], requests[i]);
    if (!harness_.ok()) return;
    on_result(i, std::move(settled));
  }
}

CaseResult IsolatedCaseExecutor::Settle(CaseResult first, const OpCase& op_case, const std::string& request) {
  std::vector<Outcome> outcomes = {first.outcome};
  const int reruns = pool_.options().policy.reruns;
  bool settled = false;
  if (IsValueVerdict(first.outcome) && reruns > 0) {
    // Note [Reruns]: a wrong answer runs again in the same worker first,
    // without warm calls (its latency is the first run's).
    const std::string request_again =
        DumpJson(json{{"unit", op_case.ToJsonValue()}, {"again", true}});
    CaseResult again = RunOnce(request_again, op_case, /*attempt=*/1);
    if (!harness_.ok()) return first;
    AddAttemptTiming(first.timing, again.timing);
    ++pool_.stats().reruns;
    ++pool_.stats().same_worker_reruns;
    outcomes.push_back(again.outcome);
    settled = !IsUnexpectedFailure(again.outcome) || ReproducedExactly(first, again);
  }
  for (int attempt = 2; !settled && static_cast<int>(outcomes.size()) <= reruns; ++attempt) {
    CaseResult again = RunOnce(request, op_case, attempt);
    if (!harness_.ok()) return first;
    AddAttemptTiming(first.timing, again.timing);
    ++pool_.stats().reruns;
    outcomes.push_back(again.outcome);
    settled = !IsUnexpectedFailure(again.outcome) || ReproducedExactly(first, again);
  }
  if (outcomes.size() > 1) {
    first.attempts = static_cast<int>(outcomes.size());
    first.attempt_outcomes = outcomes;
    first.flaky = std::any_of(outcomes.begin(), outcomes.end(), [&](Outcome o) { return o != outcomes[0]; });
    if (first.flaky) ++pool_.stats().flaky;
  }
  return first;
}

std::vector<ModelItemResult> IsolatedModelStageRunner::RunOnce(const std::string& request, const std::string& stage,
                                                               int attempt) {
  const double timeout = pool_.options().policy.TimeoutForStage(stage);
  auto fail = [&](Outcome o, std::string why, json detail) {
    ModelItemResult item;
    item.item = stage == "module" ? "*" : stage == "model" ? "forward" : "train";
    item.outcome = o;
    item.error = std::move(why);
    item.detail = {{"worker", std::move(detail)}};
    return std::vector<ModelItemResult>{item};
  };
  auto reply = pool_.Call(request, timeout, attempt, /*measure_peak=*/true);
  if (!reply) {
    harness_ = reply.error();
    return fail(Outcome::kError, harness_.message(), json::object());
  }
  if (reply->kind != WorkerReply::Kind::kReply) {
    json detail;
    auto [outcome, why] = Unanswered(*reply, "the " + stage + " stage", timeout, &detail);
    auto items = fail(outcome, why, detail);
    items[0].seconds = reply->seconds;
    return items;
  }
  auto items = ParseModelReply(reply->line);
  if (items) {
    if (reply->peak_rss_bytes > 0) {  // Note [A memory ceiling] in worker.cc: what the estimate is checked against
      for (auto& item : *items) {
        item.detail["worker_peak_rss_bytes"] = reply->peak_rss_bytes;
        item.detail["worker_start_rss_bytes"] = reply->start_rss_bytes;
      }
    }
    return std::move(*items);
  }
  harness_ = items.error();
  return fail(Outcome::kError, harness_.message(), json::object());
}

// Note [A module that kills its worker]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The module stage judges every module of a model in one worker request.
// When the backend crashes or hangs in one module's call, the worker cannot
// answer for any of them; the progress line names the call and its module
// (Note [Where a worker died]). That module gets the crash (or timeout) as
// its own item, and the stage runs again without it ("skip_modules"), so
// the other modules are still judged. Each module that kills a worker costs
// one more request, at most kMaxModulesKilled of them.
constexpr size_t kMaxModulesKilled = 16;

std::vector<ModelItemResult> IsolatedModelStageRunner::Run(const std::string& stage, const std::string& model_id,
                                                           const std::string& profile, const Program& /*program*/) {
  std::vector<ModelItemResult> killed;
  std::vector<std::string> skip;
  for (;;) {
    json body = {{"stage", stage}, {"model_id", model_id}, {"profile", profile}};
    if (!skip.empty()) body["skip_modules"] = skip;
    std::vector<ModelItemResult> items = RunWithReruns(DumpJson(json{{"model", std::move(body)}}), stage);
    std::string module;
    if (stage == "module" && harness_.ok() && items.size() == 1 && items[0].item == "*" &&
        (items[0].outcome == Outcome::kCrash || items[0].outcome == Outcome::kTimeout)) {
      const json& d = items[0].detail;
      if (d.contains("worker") && d["worker"].is_object() && d["worker"].contains("in_call") &&
          d["worker"]["in_call"].is_object() && d["worker"]["in_call"].contains("module") &&
          d["worker"]["in_call"]["module"].is_string()) {
        module = d["worker"]["in_call"]["module"].get<std::string>();
      }
    }
    if (module.empty() || std::find(skip.begin(), skip.end(), module) != skip.end() || skip.size() >= kMaxModulesKilled) {
      items.insert(items.end(), std::make_move_iterator(killed.begin()), std::make_move_iterator(killed.end()));
      return items;
    }
    items[0].item = module;
    killed.push_back(std::move(items[0]));
    skip.push_back(module);
  }
}

std::vector<ModelItemResult> IsolatedModelStageRunner::RunWithReruns(const std::string& request,
                                                                     const std::string& stage) {
  auto worst = [](const std::vector<ModelItemResult>& items) {
    for (const auto& i : items) {
      if (IsUnexpectedFailure(i.outcome)) return i.outcome;
    }
    return items.empty() ? Outcome::kPass : items.front().outcome;
  };
  std::vector<ModelItemResult> first = RunOnce(request, stage, 1);
  const Outcome first_outcome = worst(first);
  const bool process_fault = first_outcome == Outcome::kCrash || first_outcome == Outcome::kTimeout;
  if (!harness_.ok() || !ShouldRerunCase(first_outcome) ||
      !(process_fault || pool_.options().policy.rerun_model_failures)) {
    return first;
  }
  std::vector<Outcome> outcomes = {first_outcome};
  for (int attempt = 2; attempt <= 1 + pool_.options().policy.reruns; ++attempt) {
    auto again = RunOnce(request, stage, attempt);
    if (!harness_.ok()) return first;
    ++pool_.stats().reruns;
    outcomes.push_back(worst(again));
    if (!IsUnexpectedFailure(outcomes.back())) break;
  }
  const bool flaky = std::any_of(outcomes.begin(), outcomes.end(), [&](Outcome o) { return o != outcomes[0]; });
  if (flaky) ++pool_.stats().flaky;
  for (auto& item : first) {
    item.attempts = static_cast<int>(outcomes.size());
    item.attempt_outcomes = outcomes;
    item.flaky = flaky;
  }
  return first;
}

}  // namespace coverage::isolation
