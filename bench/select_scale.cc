// Selection of 841 representatives from a large population, next to one
// plain farthest-point pass over the same features, in the same run.
//
// The population is a synthetic hub of N models (hub-replay's generator:
// real configs with fine-tunes, merges, quantized variants and adapters),
// read in process: every model's config.json is classified into Features
// (cached by body: the hub repeats the same bytes), then added to a
// selection::Population with its downloads. Adapters have no config and are
// left out, as a crawl leaves them.
//
// Reports for Select(k) and PlainFarthestPoint(k): wall time (best of
// --repeat) and the peak RSS the call adds (VmHWM, reset before each call
// through /proc/self/clear_refs), and their ratio.
//
//   build/bin/bench_select_scale [--models 1000000] [--k 841] [--repeat 3]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <unordered_map>

#include "selection/features.h"
#include "selection/selection.h"
#include "tools/hub-replay/hub_server.h"

namespace {

using namespace coverage;

double ProcMiB(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::strlen(field))) / 1024.0;
  }
  return 0;
}

void ResetPeak() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
}

template <typename Fn>
std::pair<double, double> Measure(int repeat, Fn fn) {
  double best = 1e300, peak = 0;
  for (int i = 0; i < repeat; ++i) {
    ResetPeak();
    const double before = ProcMiB("VmRSS:");
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    peak = std::max(peak, ProcMiB("VmHWM:") - before);
  }
  return {best, peak};
}

}  // namespace

int main(int argc, char** argv) {
  int64_t models = 1000000;
  int k = 841, repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--models")) models = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--k")) k = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeat")) repeat = std::atoi(argv[i + 1]);
  }
  auto defaults = selection::FamilyDefaults::Load(std::string(COVERAGE_SOURCE_DIR) + "/data/transformers_defaults.jsonl");
  if (!defaults) {
    std::fprintf(stderr, "%s\n", defaults.error().ToString().c_str());
    return 2;
  }
  hub_replay::HubOptions options;
  options.synthetic = models;
  options.seed = 3;
  auto hub = hub_replay::HubServer::Start(options);
  if (!hub) {
    std::fprintf(stderr, "%s\n", hub.error().ToString().c_str());
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  selection::Population population;
  std::unordered_map<size_t, std::optional<selection::Features>> cache;
  int64_t unreadable = 0;
  for (int64_t i = 0; i < models; ++i) {
    const std::string id = (*hub)->ModelIdAt(i);
    auto bytes = (*hub)->ConfigBytes(id);
    if (!bytes) continue;
    const size_t key = std::hash<std::string>()(*bytes);
    auto it = cache.find(key);
    if (it == cache.end()) {
      auto f = selection::ExtractFeatures(std::string_view(*bytes), **defaults);
      it = cache.emplace(key, f ? std::optional<selection::Features>(*f) : std::nullopt).first;
    }
    if (!it->second) {
      ++unreadable;
      continue;
    }
    population.Add(id, (*hub)->DownloadsAt(i), *it->second);
  }
  const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("population: %zu models with a readable config (of %lld; %lld unreadable), %zu distinct points, "
              "%zu coarse and %zu fine signatures; built in %.1fs, RSS %.0f MiB\n",
              population.size(), static_cast<long long>(models), static_cast<long long>(unreadable),
              population.distinct_points(), population.coarse_signatures(), population.fine_signatures(), build_s,
              ProcMiB("VmRSS:"));

  auto compare = [&](const char* name, const selection::Population& p) {
    std::printf("%s: %zu models, %zu distinct points, %zu coarse and %zu fine signatures\n", name, p.size(),
                p.distinct_points(), p.coarse_signatures(), p.fine_signatures());
    selection::Selection selected;
    auto [select_s, select_mib] = Measure(repeat, [&] { selected = *selection::Select(p, k, 0); });
    std::vector<size_t> plain;
    auto [plain_s, plain_mib] = Measure(repeat, [&] { plain = selection::PlainFarthestPoint(p, k); });
    const auto& c = selected.coverage;
    std::printf("  select k=%d:           %8.3fs  +%6.0f MiB peak  (coarse %lld/%lld, fine %lld/%lld, downloads %.1f%%, "
                "mean distance %.4f, max %.4f)\n",
                k, select_s, select_mib, static_cast<long long>(c.coarse_covered),
                static_cast<long long>(c.coarse_total), static_cast<long long>(c.fine_covered),
                static_cast<long long>(c.fine_total),
                100.0 * static_cast<double>(c.downloads_equivalent) /
                    static_cast<double>(std::max<int64_t>(1, c.downloads_total)),
                c.mean_distance, c.max_distance);
    std::printf("  plain farthest point:  %8.3fs  +%6.0f MiB peak  (%zu chosen)\n", plain_s, plain_mib, plain.size());
    std::printf("  ratio select / plain:  time %.3f, peak memory %.2f (target: time <= 2)\n", select_s / plain_s,
                plain_mib > 0 ? select_mib / plain_mib : 0.0);
  };
  compare("hub population", population);

  // The worst case for merging identical points: every model's dimensions
  // moved by a few percent (a deterministic hash of its index), so nearly
  // every model is a distinct point.
  selection::Population jittered;
  int64_t index = 0;
  for (int64_t i = 0; i < models; ++i) {
    const std::string id = (*hub)->ModelIdAt(i);
    auto bytes = (*hub)->ConfigBytes(id);
    if (!bytes) continue;
    auto it = cache.find(std::hash<std::string>()(*bytes));
    if (it == cache.end() || !it->second) continue;
    selection::Features f = *it->second;
    uint64_t h = static_cast<uint64_t>(++index) * 0x9e3779b97f4a7c15ull;
    auto jitter = [&](int64_t& v) {
      h ^= h >> 31;
      h *= 0xbf58476d1ce4e5b9ull;
      if (v > 8) v += static_cast<int64_t>(static_cast<double>(v) * (static_cast<double>(h % 1000) / 1000.0 - 0.5) * 0.1);
    };
    for (int64_t* v : {&f.hidden, &f.intermediate, &f.layers, &f.vocab, &f.context}) jitter(*v);
    jittered.Add(id, (*hub)->DownloadsAt(i), f);
  }
  compare("jittered population", jittered);
  return 0;
}
