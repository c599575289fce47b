// The report's header (title, verdict, where the models came from, the nav)
// and its last section, the runs and their baselines.
#include <fmt/core.h>

#include <string>
#include <string_view>
#include <vector>

#include "reports/html_parts.h"

namespace coverage::reports::html {
namespace {

// The backend as given, and as baselines know it when that differs (a
// plugin's device name for its path), with its version.
std::string BackendCell(const RunInfo& run) {
  std::string cell = E(run.backend);
  if (!run.backend_name.empty() && run.backend_name != run.backend) cell += " <code>" + E(run.backend_name) + "</code>";
  if (!run.backend_version.empty()) cell += "<br><small>" + E(run.backend_version) + "</small>";
  return cell;
}

void WriteRunTable(Out& out, std::string_view id, const std::vector<RunInfo>& runs) {
  Put(out,
      "<table id=\"{}\"><thead><tr><th>Run</th><th>Stage</th><th>Backend</th><th>Host</th><th>Git revision</th>"
      "<th>libtorch</th><th>Numerics</th><th>Started</th><th>Finished</th><th class=\"num\">Results</th>"
      "<th>Shards</th></tr></thead>"
      "<tbody>\n",
      id);
  for (const RunInfo& run : runs) {
    Put(out,
        "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td></tr>\n",
        E(run.run_id), E(run.stage), BackendCell(run), E(run.host), E(run.git_revision), E(run.libtorch_version),
        E(run.numerics), E(run.started_at), run.finished_at.empty() ? "<em>not finished</em>" : E(run.finished_at), run.results,
        E(run.shards));
  }
  out += "</tbody></table>\n";
}

// Where the models came from: crawl, selection, capture, and the stages run.
void WritePipeline(Out& out, const Report& report) {
  const PipelineInfo& p = report.pipeline;
  out += "<ol id=\"pipeline\" class=\"pipeline\">\n";
  if (p.models_listed > 0 || p.crawls > 0) {
    Put(out, "<li><b>Crawl</b> {} models listed, {} configs fetched</li>\n", p.models_listed, p.configs_fetched);
  } else {
    out += "<li><b>Crawl</b> <span class=\"empty\">none in this registry</span></li>\n";
  }
  if (p.selection_id > 0) {
    Put(out, "<li><b>Selection {}</b> {} representatives of {} models; families covered {} of {}</li>\n",
        p.selection_id, p.representatives, p.selection_models, p.families_covered, p.families);
  } else {
    out += "<li><b>Selection</b> <span class=\"empty\">none in this registry</span></li>\n";
  }
  std::string statuses;
  for (const auto& [status, n] : p.capture_statuses) {
    if (status == "captured") continue;
    statuses += fmt::format("{}{} {}", statuses.empty() ? "" : ", ", n, status);
  }
  Put(out, "<li><b>Capture</b> {} (model, profile) pairs of {} models captured{}; {} op cases</li>\n",
      p.pairs_captured, p.models_captured, statuses.empty() ? "" : " (" + E(statuses) + ")", p.op_cases);
  std::string stages;
  for (const StageSummary& stage : report.stages) {
    stages += fmt::format("{}{} {}", stages.empty() ? "" : ", ", E(stage.stage), stage.total);
  }
  Put(out, "<li><b>Stages</b> {}</li>\n</ol>\n", stages.empty() ? "none" : stages);
}

}  // namespace

void WriteHeader(Out& out, const Report& report) {
  Put(out, "<header id=\"top\">\n<h1>{}</h1>\n<p class=\"meta\">Generated {}", E(report.title), E(report.generated_at));
  if (!report.registry_path.empty()) Put(out, " from <code>{}</code>", E(report.registry_path));
  out += "</p>\n";
  const int64_t regressions = ChangeCount(report, Change::kNewFailure) + ChangeCount(report, Change::kDrift) +
                              ChangeCount(report, Change::kPerfRegression);
  if (regressions > 0) {
    Put(out, "<p class=\"verdict bad\">Regressed: {} new failure(s), {} drift, {} performance regression(s).</p>\n",
        ChangeCount(report, Change::kNewFailure), ChangeCount(report, Change::kDrift),
        ChangeCount(report, Change::kPerfRegression));
  } else if (report.baselines.empty()) {
    out += "<p class=\"verdict\">First run: no baseline to compare with.</p>\n";
  } else {
    out += "<p class=\"verdict good\">No regressions.</p>\n";
  }
  WritePipeline(out, report);
  out +=
      "<nav><a href=\"#broken\">What is broken</a> <a href=\"#lacks\">What it lacks</a> <a href=\"#summary\">Summary</a> <a href=\"#regressions\">"
      "Regressions</a> <a href=\"#matrix\">Stages by family</a> <a href=\"#charts\">Charts</a> <a href=\"#models\">"
      "Models</a> <a href=\"#blockers\">Blockers</a> <a href=\"#cases\">Cases</a> <a href=\"#runs\">Runs</a></nav>\n";
  out += "</header>\n";
}

void WriteRuns(Out& out, const Report& report) {
  out += "<section id=\"runs\">\n<h2>Runs</h2>\n";
  WriteRunTable(out, "runs", report.runs);
  out += "<h2>Baselines</h2>\n";
  if (report.baselines.empty()) {
    out += "<p class=\"empty\">First run: no earlier run of the same stages, backend and options to compare with.</p>\n";
  } else {
    WriteRunTable(out, "baselines", report.baselines);
  }
  if (!report.warnings.empty()) {
    out += "<h2>Warnings</h2>\n<ul id=\"warnings\">\n";
    for (const std::string& warning : report.warnings) Put(out, "<li>{}</li>\n", E(warning));
    out += "</ul>\n";
  }
  out += "</section>\n";
}

}  // namespace coverage::reports::html
