// bench_program_replay: a whole model's captured program replayed on the
// `cpu` backend against the same model run eagerly in PyTorch from Python,
// side by side in one run, same thread count (bench/README.md).
//
// The model is a real config from data/hub/configs.jsonl (--model, default
// TinyLlama) cut to --max-layers (2), traced once with the capture tracer
// (prefill, 1 x --seq-len tokens). Then, alternating, --repeats times each:
//   eager   bench/eager_forward.py: the model's forward under inference mode
//           (median of its runs after a warm-up);
//   replay  ReplayProgram on cpu: the backend side (every call through
//           Backend::Execute) and the CPU reference side, each timed, with
//           the peak of live values.
// Prints the medians and the ratio replay-backend / eager.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "capture/trace_reader.h"
#include "core/json_capped.h"
#include "backends/backend.h"
#include "backends/backends.h"
#include "backends/host.h"
#include "replay/program_replay.h"
#include "tests/support/temp_dir.h"

namespace {

using namespace coverage;

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `command` through the shell; its stdout, or nullopt on failure.
std::optional<std::string> Output(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  if (!p) return std::nullopt;
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) return std::nullopt;
  return out;
}

// The cpu backend, timing each op (synchronous: the call's own time).
class TimedCpu final : public backends::Backend {
 public:
  std::map<std::string, std::pair<double, int>> per_op;  // seconds, calls
  std::string name() const override { return "cpu"; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  bool RespectsReadOnlyInputs() const override { return true; }
  void Execute(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    const auto t0 = std::chrono::steady_clock::now();
    op.callBoxed(stack);
    auto& e = per_op[op.operator_name().name];
    e.first += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++e.second;
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
  int max_layers = 2, seq_len = 512, repeats = 3, threads = 2;
  const std::string home = COVERAGE_SOURCE_DIR;
  std::string python = home + "/.venv/bin/python";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") model = value;
    else if (flag == "--max-layers") max_layers = std::stoi(value);
    else if (flag == "--seq-len") seq_len = std::stoi(value);
    else if (flag == "--repeats") repeats = std::stoi(value);
    else if (flag == "--threads") threads = std::stoi(value);
    else if (flag == "--python") python = value;
    else {
      std::fprintf(stderr, "usage: bench_program_replay [--model ID] [--max-layers 2] [--seq-len 512] [--repeats 3] "
                           "[--threads 2] [--python PATH]\n");
      return 2;
    }
  }
  if (max_layers < 1 || seq_len < 1 || repeats < 1 || threads < 1) {
    std::fprintf(stderr, "bench_program_replay: --max-layers, --seq-len, --repeats and --threads must be positive\n");
    return 2;
  }
  // The config, as written in the shipped data.
  std::string config;
  {
    std::ifstream in(home + "/data/hub/configs.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      auto j = ParseJsonCapped(line, {.python_literals = true});
      if (j && j->value("id", "") == model) config = std::string(RawJsonMember(line, "config").value_or(""));
    }
  }
  if (config.empty()) {
    std::fprintf(stderr, "bench_program_replay: no config for '%s' in data/hub/configs.jsonl\n", model.c_str());
    return 2;
  }
  testing::TempDir dir;
  const std::string config_path = dir.File("config.json"), profiles_path = dir.File("profiles.json");
  std::ofstream(config_path) << config;
  std::ofstream(profiles_path) << fmt::format(
      R"({{"profiles": [{{"name": "prefill", "families": ["decoder", "encoder", "encoder-decoder", "hybrid", "ssm", "multimodal"], "batch": 1, "seq_len": {}}}]}})",
      seq_len);
  const std::string env = "HF_HUB_OFFLINE=1 OMP_NUM_THREADS=" + std::to_string(threads) + " PYTHONPATH=" +
                          Quote(home + "/capture/tracer") + " ";

  // 1. The program.
  const auto t_trace = std::chrono::steady_clock::now();
  auto trace = Output(env + Quote(python) + " -m coverage_tracer --config " + Quote(config_path) +
                      " --profile prefill --profiles " + Quote(profiles_path) + " --max-layers " +
                      std::to_string(max_layers) + " --model-id " + Quote(model) + " 2>/dev/null");
  if (!trace) {
    std::fprintf(stderr, "bench_program_replay: the tracer failed on %s\n", model.c_str());
    return 1;
  }
  capture::TraceReader reader;
  std::istringstream lines(*trace);
  std::string line;
  while (std::getline(lines, line)) {
    if (Status s = reader.Feed(line); !s.ok()) {
      std::fprintf(stderr, "bench_program_replay: %s\n", s.message().c_str());
      return 1;
    }
  }
  auto outcome = reader.Finish();
  if (!outcome || !outcome->program) {
    std::fprintf(stderr, "bench_program_replay: no program (%s)\n",
                 outcome && outcome->error ? outcome->error->reason.c_str() : "unreadable trace");
    return 1;
  }
  const Program& program = *outcome->program;
  const ProgramFootprint fp = EstimateFootprint(program);
  const replay::MemoryEstimate memory = replay::EstimateMemory(program, "model", {}, /*backend_copies=*/false);
  std::printf("%s, %d of its layers, prefill 1x%d: %zu calls, %zu leaves (%.2f GB), model stage estimated at %.2f GB "
              "(Note [Memory estimate]); traced in %.1f s\n",
              model.c_str(), max_layers, seq_len, program.calls.size(), program.values.size(), fp.leaf_bytes / 1e9,
              memory.bytes / 1e9,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_trace).count());

  // 2. Side by side.
  backends::SetIntraOpThreads(threads);
  TimedCpu cpu;
  std::vector<double> eager, eager_rss, wall, backend, reference;
  int64_t peak_live = 0;
  for (int r = 0; r < repeats; ++r) {
    auto e = Output(env + Quote(python) + " " + Quote(home + "/bench/eager_forward.py") + " --config " +
                    Quote(config_path) + " --max-layers " + std::to_string(max_layers) + " --seq-len " +
                    std::to_string(seq_len) + " --repeats 3 --threads " + std::to_string(threads) + " 2>/dev/null");
    if (!e) {
      std::fprintf(stderr, "bench_program_replay: bench/eager_forward.py failed\n");
      return 1;
    }
    const auto j = nlohmann::json::parse(*e);
    eager.push_back(j["median"].get<double>());
    eager_rss.push_back(j["peak_rss_mb"].get<double>());

    replay::ProgramReplayOptions o;
    o.locate_first_divergent = false;
    const auto t0 = std::chrono::steady_clock::now();
    cpu.per_op.clear();
    const auto item = replay::ReplayProgram(program, cpu, o);
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (item.outcome != Outcome::kPass) {
      std::fprintf(stderr, "bench_program_replay: the replay did not pass: %s\n", item.error.c_str());
      return 1;
    }
    backend.push_back(item.detail["replay"]["backend_seconds"].get<double>());
    reference.push_back(item.detail["replay"]["reference_seconds"].get<double>());
    peak_live = item.detail["replay"]["peak_live_bytes"].get<int64_t>();
  }
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const double e = Median(eager), b = Median(backend), w = Median(wall), ref = Median(reference);
  std::printf("\n%d threads, %d alternating repeats (medians):\n", threads, repeats);
  std::printf("  eager forward (Python, inference mode)     %8.3f s   peak RSS %.0f MB\n", e, Median(eager_rss));
  std::printf("  replay, backend side (Backend::Execute)    %8.3f s   ratio to eager %.2fx\n", b, b / e);
  std::printf("  replay, reference side                     %8.3f s\n", ref);
  std::printf("  replay, whole (both sides, making leaves)  %8.3f s   per side %.2fx eager\n", w, w / 2 / e);
  std::printf("  replay peak of live values (both sides)    %8.0f MB  (the replay's estimate %.0f MB); process peak "
              "RSS %.0f MB\n",
              peak_live / 1e6, memory.replay_bytes / 1e6, ru.ru_maxrss / 1024.0);
  std::vector<std::pair<double, std::string>> ops;
  for (const auto& [name, e] : cpu.per_op) ops.emplace_back(e.first, fmt::format("{} x{}", name, e.second));
  std::sort(ops.rbegin(), ops.rend());
  std::printf("  backend time by op (last repeat):");
  for (size_t i = 0; i < ops.size() && i < 6; ++i) std::printf(" %s %.3f s;", ops[i].second.c_str(), ops[i].first);
  std::printf("\n");
  return 0;
}
