#include "capture/opinfo_import.h"
#include "core/text_safety.h"

#include <chrono>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "capture/trace_reader.h"
#include "capture/tracer_process.h"
#include "core/cost.h"
#include "core/progress.h"
#include "registry/case_query.h"

namespace coverage::capture {
namespace {

using json = nlohmann::json;

std::string FullName(const std::string& name, const std::string& variant) {
  return variant.empty() ? name : name + "." + variant;
}

Result<std::string> Field(const json& j, const char* key, const std::string& what) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return Status::Corruption(fmt::format("{}: '{}' must be a string", what, key));
  return it->get<std::string>();
}

Result<int64_t> IntField(const json& j, const char* key, const std::string& what) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 0) {
    return Status::Corruption(fmt::format("{}: '{}' must be a non-negative integer", what, key));
  }
  return it->get<int64_t>();
}

// Reads the tracer's lines: sample traces grouped by (OpInfo, dtype), each
// group stored when its `opinfo_done` (or `opinfo_skip`) record arrives.
class Importer {
 public:
  Importer(registry::Registry& registry, std::set<std::string> kept, OpInfoImportSummary* summary,
           Progress* progress)
      : registry_(registry), kept_(std::move(kept)), s_(*summary), progress_(*progress) {}

  Status Line(std::string_view line) {
    ++line_no_;
    const std::string what = fmt::format("opinfo tracer output line {}", line_no_);
    // Parsed here for the type and the sample header; sample records then
    // go to the TraceReader as they are.
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return Status::Corruption(fmt::format("{}: not a JSON record: {}", what, TerminalSafe(line, 120)));
    }
    COV_ASSIGN_OR_RETURN(std::string type, Field(j, "type", what));
    if (type == "start") {
      if (reader_) return Status::Corruption(what + ": a sample starts before the previous one ended");
      auto header = j.find("opinfo");
      if (header == j.end() || !header->is_object()) return Status::Corruption(what + ": 'opinfo' must be an object");
      COV_ASSIGN_OR_RETURN(std::string name, Field(*header, "name", what + ".opinfo"));
      COV_ASSIGN_OR_RETURN(std::string variant, Field(*header, "variant", what + ".opinfo"));
      COV_ASSIGN_OR_RETURN(std::string dtype, Field(*header, "dtype", what + ".opinfo"));
      COV_ASSIGN_OR_RETURN(sample_, IntField(*header, "sample", what + ".opinfo"));
      COV_ASSIGN_OR_RETURN(sample_name_, Field(*header, "sample_name", what + ".opinfo"));
      COV_RETURN_IF_ERROR(Group(name, variant, dtype, what));
      if (auto t = j.find("torch"); t != j.end() && t->is_string()) torch_version_ = t->get<std::string>();
      reader_.emplace();
      return reader_->Feed(line);
    }
    if (type == "opinfo_before") {  // stored by an earlier import: not run
      if (reader_ || group_) return Status::Corruption(what + ": 'opinfo_before' inside a sample");
      ++s_.done_before;
      return Status::Ok();
    }
    if (type == "opinfo_done" || type == "opinfo_skip") {
      if (reader_) return Status::Corruption(what + ": '" + type + "' inside a sample");
      COV_ASSIGN_OR_RETURN(std::string name, Field(j, "name", what));
      COV_ASSIGN_OR_RETURN(std::string variant, Field(j, "variant", what));
      COV_ASSIGN_OR_RETURN(std::string dtype, Field(j, "dtype", what));
      COV_RETURN_IF_ERROR(Group(name, variant, dtype, what));
      group_->torch_version = torch_version_;
      if (type == "opinfo_skip") {
        group_->status = "skipped";
        COV_ASSIGN_OR_RETURN(group_->reason, Field(j, "reason", what));
        calls_.clear();
      } else {
        group_->status = "imported";
        COV_ASSIGN_OR_RETURN(group_->samples, IntField(j, "samples", what));
        if (group_->samples != samples_seen_) {
          return Status::Corruption(fmt::format("{}: {} counts {} samples but {} were read", what,
                                                FullName(name, variant), group_->samples, samples_seen_));
        }
      }
      COV_RETURN_IF_ERROR(Store());
      return Status::Ok();
    }
    if (!reader_) return Status::Corruption(fmt::format("{}: a '{}' record outside a sample", what, type));
    COV_RETURN_IF_ERROR(reader_->Feed(line).WithContext(fmt::format("{} sample {}", GroupName(), sample_)));
    if (type == "end" || type == "error") COV_RETURN_IF_ERROR(EndSample(what));
    return Status::Ok();
  }

  // After the last line: a group or sample left open means the tracer was cut off.
  Status Finish() const {
    if (reader_) return Status::Corruption(fmt::format("the output ends inside sample {} of {}", sample_, GroupName()));
    if (group_) return Status::Corruption(fmt::format("the output ends before {} was complete", GroupName()));
    return Status::Ok();
  }

 private:
  std::string GroupName() const {
    return group_ ? fmt::format("{} ({})", FullName(group_->opinfo, group_->variant), group_->dtype) : "?";
  }

  // Opens the group (OpInfo, dtype) or checks that the open one is it.
  Status Group(const std::string& name, const std::string& variant, const std::string& dtype,
               const std::string& what) {
    if (group_) {
      if (group_->opinfo == name && group_->variant == variant && group_->dtype == dtype) return Status::Ok();
      return Status::Corruption(
          fmt::format("{}: {} ({}) begins before {} ended", what, FullName(name, variant), dtype, GroupName()));
    }
    group_.emplace();
    group_->opinfo = name;
    group_->variant = variant;
    group_->dtype = dtype;
    samples_seen_ = 0;
    calls_.clear();
    return Status::Ok();
  }

  Status EndSample(const std::string& what) {
    auto finished = reader_->Finish();
    reader_.reset();
    if (!finished) return finished.error().WithContext(fmt::format("{} sample {}", GroupName(), sample_));
    TraceOutcome outcome = std::move(*finished);
    if (sample_ != samples_seen_) {
      return Status::Corruption(fmt::format("{}: sample {} where {} was expected", what, sample_, samples_seen_));
    }
    ++samples_seen_;
    ++s_.samples;
    if (outcome.error) {
      ++group_->failed;
      ++s_.failed_samples;
      return Status::Ok();
    }
    for (ProgramCall& c : outcome.program->calls) {
      ++s_.calls;
      if (!kept_.empty() && !kept_.count(c.op) && !kept_.count(c.overload.empty() ? c.op : c.op + "." + c.overload)) {
        continue;
      }
      if (!c.op_case) {
        ++s_.unsupported_calls;
        continue;
      }
      ++s_.calls_kept;
      const CostEstimate cost = EstimateCost(*c.op_case, c.output_specs);
      calls_.push_back({sample_, sample_name_, c.index, std::move(*c.op_case), {cost.flops, cost.bytes}});
    }
    return Status::Ok();
  }

  Status Store() {
    COV_RETURN_IF_ERROR(registry_.StoreOpInfo(&*group_, calls_));
    if (group_->status == "skipped") {
      ++s_.skipped;
    } else {
      ++s_.imported;
    }
    progress_.Update(s_.imported + s_.skipped,
                     fmt::format("{}, {} samples, {} calls kept", GroupName(), s_.samples, s_.calls_kept));
    group_.reset();
    calls_.clear();
    return Status::Ok();
  }

  registry::Registry& registry_;
  std::set<std::string> kept_;  // "aten::mm" and "aten::add.Tensor" forms; empty: every op
  OpInfoImportSummary& s_;
  Progress& progress_;
  int64_t line_no_ = 0;
  std::optional<registry::OpInfoImportRecord> group_;
  std::vector<registry::OpInfoSampleCall> calls_;
  int64_t samples_seen_ = 0;
  std::optional<TraceReader> reader_;
  int64_t sample_ = 0;
  std::string sample_name_;
  std::string torch_version_;
};

}  // namespace

Result<OpInfoImportSummary> ImportOpInfo(registry::Registry& registry, const OpInfoImportOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  OpInfoImportSummary summary;
  COV_ASSIGN_OR_RETURN(int64_t cases_before, registry.CountCases());

  std::set<std::string> kept;
  if (!options.all_ops) {
    if (options.ops.empty()) {
      COV_ASSIGN_OR_RETURN(std::vector<std::string> held, registry.DistinctOps());
      if (held.empty()) {
        return Status::InvalidArgument(
            "the registry holds no op cases, so no op is kept: capture models first, name ops with --op, or "
            "import every op with --all-ops");
      }
      kept.insert(held.begin(), held.end());
    } else {
      for (const std::string& op : options.ops) kept.insert(registry::NormaliseOpName(op));
    }
    summary.kept_ops = static_cast<int64_t>(kept.size());
  }

  std::vector<std::string> dtypes = options.dtypes.empty() ? std::vector<std::string>{"f32"} : options.dtypes;
  json done = json::array();
  if (!options.force) {
    COV_ASSIGN_OR_RETURN(auto stored, registry.ListOpInfoImports());
    for (const auto& r : stored) {
      done.push_back({r.opinfo, r.variant, r.dtype});
    }
  }

  TracerCommand cmd;
  cmd.python = options.python;
  cmd.package_dir = options.package_dir;
  cmd.args = {"opinfo", "--seed", std::to_string(options.seed), "--done", "-"};
  for (const std::string& d : dtypes) {
    cmd.args.push_back("--dtype");
    cmd.args.push_back(d);
  }
  for (const std::string& o : options.opinfos) {
    cmd.args.push_back("--opinfo");
    cmd.args.push_back(o);
  }
  cmd.stdin_text = done.dump();
  cmd.timeout_s = options.timeout_s;
  cmd.threads = options.threads;
  cmd.stop = options.stop;

  Progress progress("import opinfo", 0, options.progress);
  Importer importer(registry, std::move(kept), &summary, &progress);
  auto exit = RunTracerProcess(cmd, [&](std::string_view line) { return importer.Line(line); });
  progress.Finish();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!exit) return exit.error().WithContext("starting " + options.python);
  COV_ASSIGN_OR_RETURN(int64_t cases_after, registry.CountCases());
  summary.cases_new = cases_after - cases_before;
  summary.cases_total = cases_after;
  if (exit->kind == TracerExit::Kind::kInterrupted) {
    summary.interrupted = true;
    return summary;
  }
  if (exit->kind == TracerExit::Kind::kAborted) return exit->callback_error;
  if (exit->kind != TracerExit::Kind::kExited || exit->exit_status != 0) {
    return Status::IoError(fmt::format("the OpInfo tracer {}; its last output:\n{}", exit->Description(),
                                       exit->stderr_tail));
  }
  COV_RETURN_IF_ERROR(importer.Finish());
  return summary;
}

}  // namespace coverage::capture
