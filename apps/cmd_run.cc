// `coverage run --stage=...`: one family of test stages (apps/test_stages.h)
// on a backend: unit replays registry cases; module, model and train run the
// representatives' modules, forward passes and training steps.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "apps/app.h"
#include "apps/flags.h"
#include "apps/test_stages.h"
#include "backends/backends.h"
#include "replay/compare_options.h"

namespace coverage::apps {
namespace {

int RunStage(const GlobalOptions& global, const RunFlags& flags) {
  // Before anything slow (starting workers): a Ctrl-C from then on stops
  // the run cleanly after its current case.
  const std::atomic<bool>* stop = InstallStopHandler();
  backends::BackendRegistry backends;
  RegisterBackends(global, backends);
  if (flags.list_backends) {
    for (const auto& b : backends.Describe()) {
      std::printf("%-18s %-11s %s%s\n", b.name.c_str(), b.available ? "available" : "unavailable", b.description.c_str(),
                  b.available ? "" : (" (" + b.reason + ")").c_str());
    }
    return kExitOk;
  }
  auto stages = ParseStageList(flags.stage, "--stage");
  if (!stages) return ReportError(stages.error());
  const std::string tol_path = flags.tolerances.empty() ? global.home + "/configs/tolerances.json" : flags.tolerances;
  auto tol_text = ReadFile(tol_path);
  if (!tol_text) return ReportError(tol_text.error().WithContext("--tolerances"));
  auto comparison = replay::ComparisonOptions::FromJson(*tol_text, tol_path);
  if (!comparison) return ReportError(comparison.error());
  auto numerics = ResolveNumerics(global, flags);
  if (!numerics) return ReportError(numerics.error().WithContext("--numerics"));
  comparison->numerics = numerics->declared;
  const RunContext context{.global = global,
                           .flags = flags,
                           .backends = backends,
                           .comparison = std::move(*comparison),
                           .tolerances_path = tol_path,
                           .tolerances_text = std::move(*tol_text),
                           .numerics_text = numerics->text,
                           .numerics_source = numerics->source,
                           .stop = stop};
  return stages->first->Run(context, stages->second);
}

}  // namespace

void AddRunCommand(CLI::App& app, GlobalOptions& global) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Run a test stage on a backend against the CPU reference and store each result as it completes.\n"
      "Exit code: 0 nothing failed unexpectedly, 1 failures, 2 bad input or harness error, 130 interrupted.");
  cmd->add_option("--stage", flags->stage,
                  "Stages of one family, comma-separated (" + KnownStages() +
                      "): unit replays op cases from the registry; module, model and train the selection's "
                      "representatives, built from their configs")
      ->capture_default_str();
  cmd->add_option("--backend", flags->backend, "Backend under test (--list-backends shows them)")->capture_default_str();
  cmd->add_option("--device-name", flags->device_name,
                  "Name a PrivateUse1 plugin's device that the plugin leaves unnamed (one that renames itself only "
                  "from Python), e.g. neuron: its tensors are <name>:0 and the run's backend is privateuse1:<name>")
      ->check(DeviceNameCheck());
  cmd->add_flag("--list-backends", flags->list_backends, "List the backends of this build and exit");
  cmd->add_option("--op", flags->ops, "Only cases of this op (repeatable), e.g. mm or aten::addmm");
  cmd->add_option("--case", flags->keys, "Only this case, by key (repeatable; `coverage repro KEY` prints one)");
  cmd->add_option("--model", flags->model,
                  "unit: only cases captured from this model; module/model/train: only these representatives; * and "
                  "? are wildcards");
  cmd->add_option("--dtype", flags->dtype, "Only cases with a tensor of this dtype");
  cmd->add_option("--dim", flags->dims, "Dimension predicate as in `registry query` (repeatable)");
  cmd->add_option("--profile", flags->profile,
                  "unit: only cases captured under this input profile; module/model/train: run under this profile "
                  "[default: the first that applies, see configs/capture_profiles.json]");
  cmd->add_option("--source", flags->source,
                  "unit: only cases captured from a model (captured) or from an OpInfo sample (opinfo, `coverage "
                  "import opinfo`) [default: both]")
      ->check(CLI::IsMember({"captured", "opinfo"}));
  cmd->add_option("--max-case-flops", flags->max_case_flops,
                  "Record costlier cases as skipped instead of running them")
      ->check(FiniteRange(0, 1e30));
  cmd->add_option("--max-case-gb", flags->max_case_gb,
                  "unit: record a case as skipped when replaying it would hold more memory than this (its inputs and "
                  "outputs on the reference and the backend, and the fp64 golden) [default: half the machine's memory]")
      ->check(FiniteRange(0.001, 1e6));
  cmd->add_option("--run", flags->run_id,
                  "Run id (letters, digits, '.', '_', '-'; it names the report folder); an existing id resumes that "
                  "run, skipping finished cases")
      ->check(RunIdCheck())
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            return s == "latest" ? "'latest' names the newest run in `coverage report --run latest`; give this run "
                                   "another id"
                                 : std::string();
          },
          ""));
  cmd->add_option("--warm", flags->warm, "Warm backend calls after the first (latency = their median)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--golden", flags->golden,
                  "fp64 golden run: auto (only when an output misses the reference tolerance), always (error ratio "
                  "for every case), never")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "always", "never"}));
  cmd->add_option("--seed", flags->seed, "Mixed into every case's input seed")->capture_default_str()
      ->check(SeedCheck());
  cmd->add_option("--tolerances", flags->tolerances, "Tolerance config [default: <home>/configs/tolerances.json]");
  cmd->add_option("--numerics", flags->numerics,
                  "How the backend declares it computes, so it is judged against that (fp32 matmul operands in bf16 "
                  "or TF32): a file, or none for exact fp32 everywhere [default: <home>/configs/numerics/<backend>.json "
                  "when it exists, else the backend's own declaration]");
  cmd->add_option("--show-failures", flags->show_failures, "Failing cases to print")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  // Model-level stages.
  auto* selection_id = cmd->add_option("--selection-id", flags->selection_id,
                                       "module/model/train: representatives of this selection [default: the latest]");
  auto* models_file = cmd->add_option(
      "--models", flags->models_file,
      "module/model/train: the models of this file instead of a selection: one id per line, or the JSONL file given "
      "to `coverage capture --models` (its \"id\" members)");
  auto* all_captured = cmd->add_flag("--all-captured", flags->all_captured,
                                     "module/model/train: every model with a captured program instead of a selection");
  models_file->excludes(all_captured)->excludes(selection_id);
  all_captured->excludes(selection_id);
  cmd->add_option("--profiles", flags->profiles,
                  "module/model/train: input profiles [default: <home>/configs/capture_profiles.json]");
  cmd->add_option("--max-gb", flags->max_gb,
                  "module/model/train: skip a model's stage whose program needs more memory than this to replay "
                  "(its largest live set, on the backend and the reference)")
      ->capture_default_str()
      ->check(FiniteRange(0.001, 1e6));
  cmd->add_option("--max-model-flops", flags->max_model_flops,
                  "module/model/train: skip a model's stage estimated above this many FLOPs (0: no cap)")
      ->capture_default_str()
      ->check(FiniteRange(0, 1e30));
  cmd->add_flag("--gate", flags->gate,
                "module/model/train: skip a model's later stages once an earlier one failed, recording what blocked them");
  cmd->add_option("--train-steps", flags->train_steps,
                  "train: replays of the captured step program (forward, loss, backward, optimizer), parameters "
                  "carried over")->capture_default_str()->check(
      CLI::Range(1, 1000));
  cmd->add_option("--min-cosine", flags->min_cosine, "module/model: minimum cosine similarity of the outputs")
      ->capture_default_str()
      ->check(FiniteRange(-1.0, 1.0));
  cmd->add_option("--top-k", flags->top_k, "model: the backend's top-1 token must be in the reference's top-k")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  cmd->add_option("--min-topk-agreement", flags->min_topk_agreement,
                  "model: share of positions where it must be")
      ->capture_default_str()
      ->check(FiniteRange(0.0, 1.0));
  // Isolation and sharding.
  cmd->add_option("--isolation", flags->isolation,
                  "process: each case runs in a worker process (a crash or hang costs that case, which is rerun "
                  "alone in a fresh worker); none: in this process (faster, but a crash ends the run)")
      ->capture_default_str()
      ->check(CLI::IsMember({"process", "none"}));
  cmd->add_option("--isolation-config", flags->isolation_config,
                  "Timeouts and reruns [default: <home>/configs/isolation.json]");
  cmd->add_option("--timeout", flags->timeout,
                  "Seconds one case (or one model stage) may take before it is killed as a timeout; overrides "
                  "the config")
      ->check(FiniteRange(0.1, 7 * 86400.0));
  cmd->add_option("--reruns", flags->reruns, "Reruns of a failing case (a wrong answer first in the same worker, then in fresh workers); overrides the config")
      ->check(CLI::Range(0, 100));
  cmd->add_option("--shard", flags->shard,
                  "Run shard i of N (\"i/N\"): the cases (unit) or models whose key hashes to i; default from "
                  "COVERAGE_SHARD_INDEX/COVERAGE_TOTAL_SHARDS. \"auto\": from those or the engine's, "
                  "JOB_COMPLETION_INDEX (with COVERAGE_TOTAL_SHARDS) or SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT. "
                  "Needs --run; join shards with `coverage merge`");
  cmd->callback([&global, flags]() { global.exit_code = RunStage(global, *flags); });
}

}  // namespace coverage::apps
