// `coverage import opinfo`: stores the calls of PyTorch's OpInfo samples (the
// venv's torch) as op cases with source `opinfo` (capture/opinfo_import.h).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "apps/app.h"
#include "apps/flags.h"
#include "capture/opinfo_import.h"
#include "registry/registry.h"

namespace coverage::apps {
namespace {

struct ImportFlags {
  std::vector<std::string> dtypes;
  std::vector<std::string> opinfos;
  std::vector<std::string> ops;
  bool all_ops = false;
  bool force = false;
  uint64_t seed = 0;
  double timeout_s = 3600;
  std::string python;
};

int RunImportOpInfo(const GlobalOptions& global, const ImportFlags& flags) {
  auto reg = OpenRegistry(global, /*read_only=*/false, /*create=*/true);
  if (!reg) return ReportError(reg.error());
  capture::OpInfoImportOptions options;
  options.python = TracerPython(global, flags.python);
  options.package_dir = global.home + "/capture/tracer";
  options.dtypes = flags.dtypes;
  options.opinfos = flags.opinfos;
  options.ops = flags.ops;
  options.all_ops = flags.all_ops;
  options.force = flags.force;
  options.seed = flags.seed;
  options.timeout_s = flags.timeout_s;
  options.threads = global.threads > 0 ? global.threads : 1;
  options.progress = !global.quiet;
  options.stop = InstallStopHandler();

  auto summary = capture::ImportOpInfo(**reg, options);
  if (!summary) return ReportError(summary.error().WithContext("import opinfo"));
  const auto& s = *summary;
  std::printf("import opinfo: %lld (OpInfo, dtype) pairs imported, %lld without samples, %lld imported before, in "
              "%.0f s\n",
              static_cast<long long>(s.imported), static_cast<long long>(s.skipped),
              static_cast<long long>(s.done_before), s.seconds);
  const std::string kept =
      s.kept_ops ? fmt::format("{} op{}", s.kept_ops, s.kept_ops == 1 ? "" : "s") : std::string("every op");
  std::printf("  %lld samples (%lld raised on CPU), %lld calls, %lld kept (the calls of %s; %lld more with an "
              "argument no op case holds); %lld new cases, registry now holds %lld\n",
              static_cast<long long>(s.samples), static_cast<long long>(s.failed_samples),
              static_cast<long long>(s.calls), static_cast<long long>(s.calls_kept),
              kept.c_str(),
              static_cast<long long>(s.unsupported_calls), static_cast<long long>(s.cases_new),
              static_cast<long long>(s.cases_total));
  std::printf("registry: %s (coverage registry stats; run --source opinfo; table opinfo_samples)\n",
              global.registry_path.c_str());
  if (s.interrupted) {
    std::printf("interrupted: rerun the same command to import the remaining OpInfos\n");
    return kExitInterrupted;
  }
  return kExitOk;
}

}  // namespace

void AddImportCommand(CLI::App& app, GlobalOptions& global) {
  auto flags = std::make_shared<ImportFlags>();
  CLI::App* imp = app.add_subcommand("import", "Import op cases from elsewhere into the registry");
  imp->require_subcommand(1);
  CLI::App* cmd = imp->add_subcommand(
      "opinfo",
      "Run the samples of PyTorch's OpInfo database (the venv's torch, on CPU) and store the ATen calls they\n"
      "make as op cases with source 'opinfo': edge cases (empty, scalar, broadcast, non-contiguous, keyword\n"
      "options) beside the real shapes. By default only calls of ops the registry already holds are kept.\n"
      "Values enter as value domains, as for captured cases. Resumable: (OpInfo, dtype) pairs stored before\n"
      "are skipped.");
  cmd->add_option("--dtype", flags->dtypes, "Sample dtype: f32, f64, f16, bf16, i64, i32, i16, i8, u8, b8 (repeatable) "
                                            "[default: f32]")
      ->check(CLI::IsMember({"f32", "f64", "f16", "bf16", "i64", "i32", "i16", "i8", "u8", "b8"}));
  cmd->add_option("--opinfo", flags->opinfos,
                  "Only this OpInfo: NAME (every variant) or NAME.VARIANT, e.g. softmax, nn.functional.conv2d "
                  "(repeatable) [default: all]");
  cmd->add_option("--op", flags->ops,
                  "Keep the calls of this op, e.g. mm, aten::addmm, add.Tensor (repeatable) [default: the ops the "
                  "registry holds]");
  cmd->add_flag("--all-ops", flags->all_ops, "Keep the calls of every op");
  cmd->add_option("--seed", flags->seed, "Seed of the samples' values")->capture_default_str()
      ->check(SeedCheck());
  cmd->add_option("--timeout", flags->timeout_s, "Seconds the whole import may take")
      ->capture_default_str()
      ->check(FiniteRange(1, 86400));
  cmd->add_option("--python", flags->python,
                  "Python with torch [default: $COVERAGE_PYTHON, else <home>/.venv/bin/python]");
  cmd->add_flag("--force", flags->force, "Import (OpInfo, dtype) pairs again that were imported before");
  cmd->callback([&global, flags]() {
    if (flags->all_ops && !flags->ops.empty()) {
      global.exit_code = ReportError(Status::InvalidArgument("--all-ops and --op: give one of them"));
      return;
    }
    global.exit_code = RunImportOpInfo(global, *flags);
  });
}

}  // namespace coverage::apps
