// Capture at scale: every real config shipped in data/hub/configs.jsonl goes
// through the select step (features, one representative per distinct
// point), then capture with the default input profiles, in a scratch
// registry, and every stored config is traced with the capture tracer
// (capture/tracer_capture.h), the loop `coverage capture` runs. Reports
// capture throughput (models and
// (model, profile) pairs per minute), the registry's growth curve as models
// are added, and the distinct op cases by op and by model structure.
//
//   build/bin/bench_capture_scale [--jobs 2] [--limit N] [--max-layers 2]
//                                 [--max-gb 8] [--batch 10] [--defaults 1] [--profile NAME]... [--db PATH]
// --db keeps the registry in PATH (default: a scratch file): a second run
// on it resumes, skipping (model, profile) pairs already captured.
// --defaults 1 also stores the default config of every model type in
// data/transformers_defaults.jsonl (as "defaults/<model_type>") before
// selecting, --real 0 leaves out the real configs; --profile keeps only the named profiles.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "capture/tracer_capture.h"
#include "core/json_capped.h"
#include "registry/registry.h"
#include "capture/profiles.h"
#include "selection/features.h"
#include "selection/registry_select.h"
#include "tests/support/temp_dir.h"

int main(int argc, char** argv) {
  using namespace coverage;
  int64_t limit = 0, max_layers = 2, max_experts = 8, batch = 10, with_defaults = 0, with_real = 1;
  double max_gb = 8;
  std::vector<std::string> only_profiles;
  std::string db_path;
  int jobs = 2;
  for (int i = 1; i < argc; i += 2) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::printf(
          "usage: bench_capture_scale [--jobs 2] [--limit N] [--max-layers 2] [--max-experts 8] [--max-gb 8] [--batch 10]\n"
          "                           [--defaults 0|1] [--real 0|1] [--profile NAME]... [--db PATH]\n"
          "Traces every real config of data/hub/configs.jsonl (bench/README.md, bench_capture_scale).\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "argument '%s' needs a value\n", argv[i]);
      return 2;
    }
    if (!std::strcmp(argv[i], "--limit")) limit = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--max-layers")) max_layers = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--max-experts")) max_experts = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--max-gb")) max_gb = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch")) batch = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--defaults")) with_defaults = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--real")) with_real = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--profile")) only_profiles.push_back(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--db")) db_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--jobs")) jobs = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines as they come, also into a file
  const std::string home = COVERAGE_SOURCE_DIR;
  testing::TempDir dir;
  auto reg = registry::Registry::Open(db_path.empty() ? dir.File("capture.db") : db_path);
  if (!reg) return 2;
  auto existing = (*reg)->Query("SELECT COUNT(*) FROM selections");
  const bool resume = existing && existing->rows[0][0] != "0";
  // Every shipped config, stored as a crawl stores it.
  std::vector<registry::HubModelRecord> models;
  std::vector<std::pair<std::string, std::string>> configs;
  std::ifstream in(home + "/data/hub/configs.jsonl");
  std::string line;
  while (with_real && std::getline(in, line)) {
    auto j = ParseJsonCapped(line, {.python_literals = true});
    if (!j) continue;
    registry::HubModelRecord m;
    m.id = (*j)["id"];
    m.model_type = (*j)["config"].value("model_type", "");
    models.push_back(m);
    configs.emplace_back(m.id, std::string(RawJsonMember(line, "config").value_or((*j)["config"].dump())));
  }
  const size_t real_configs = configs.size();
  if (with_defaults) {
    std::ifstream din(home + "/data/transformers_defaults.jsonl");
    while (std::getline(din, line)) {
      auto j = ParseJsonCapped(line, {.python_literals = true});
      if (!j || !j->contains("model_type") || !(*j)["model_type"].is_string() || !j->contains("defaults")) continue;
      nlohmann::json config = (*j)["defaults"];
      if (!config.is_object()) continue;
      config["model_type"] = (*j)["model_type"];
      for (auto it = config.begin(); it != config.end();) it = it->is_null() ? config.erase(it) : std::next(it);
      registry::HubModelRecord m;
      m.id = "defaults/" + (*j)["model_type"].get<std::string>();
      m.model_type = (*j)["model_type"];
      models.push_back(m);
      configs.emplace_back(m.id, config.dump());
    }
  }
  if (!resume) {
    if (!(*reg)->StartCrawl("bench").ok() || !(*reg)->StoreCrawlPage("bench", models, {}, std::nullopt).ok()) return 2;
    for (const auto& [id, config] : configs) (void)(*reg)->StoreConfig(id, "fetched", "", config);
    auto defaults = selection::FamilyDefaults::Load(home + "/data/transformers_defaults.jsonl");
    if (!defaults || !selection::DeriveFeatures(**reg, **defaults).has_value()) return 2;
    selection::SelectOptions select;
    select.k = 100000;  // every distinct point
    if (!selection::RunSelect(**reg, select)) return 2;
  }
  auto reps = (*reg)->SelectionModels(0);
  if (!reps) return 2;
  std::printf("%zu shipped configs (%zu real, %zu transformers defaults), %zu representatives (one per distinct "
              "point)\n",
              configs.size(), real_configs, configs.size() - real_configs, reps->size());

  std::ifstream profiles_in(home + "/configs/capture_profiles.json");
  nlohmann::json profiles_doc = nlohmann::json::parse(profiles_in, nullptr, false);
  auto profiles = capture::ParseCaptureProfiles(profiles_doc);
  if (!profiles) return 2;
  if (!only_profiles.empty()) {
    std::vector<capture::CaptureProfile> kept;
    for (const auto& p : *profiles) {
      if (std::find(only_profiles.begin(), only_profiles.end(), p.name) != only_profiles.end()) kept.push_back(p);
    }
    *profiles = kept;
  }

  {
    // Every stored config (not only the representatives), with the structure
    // its features name.
    capture::TracerCaptureOptions t;
    for (const auto& p : *profiles) t.profiles.push_back({p.name, p.families});
    auto rows = (*reg)->Query(
        "SELECT m.id, COALESCE(m.model_type, ''), m.config_json, "
        "COALESCE(json_extract(f.features_json, '$.structure'), '') FROM models m "
        "LEFT JOIN features f ON f.model_id = m.id WHERE m.config_status = 'fetched' ORDER BY m.rowid");
    if (!rows) return 2;
    for (const auto& r : rows->rows) t.models.push_back({r[0], r[1], "bench", r[2], r[3]});
    if (limit > 0 && static_cast<int64_t>(t.models.size()) > limit) t.models.resize(static_cast<size_t>(limit));
    t.tracer.python = home + "/.venv/bin/python";
    t.tracer.package_dir = home + "/capture/tracer";
    t.tracer.profiles_path = home + "/configs/capture_profiles.json";
    t.tracer.max_layers = max_layers;
    t.tracer.max_experts = max_experts;
    t.tracer.max_gb = max_gb;
    t.jobs = jobs;
    t.progress = false;
    const auto start = std::chrono::steady_clock::now();
    std::printf("tracer: %zu configs, %d jobs\n%8s %8s %10s %10s %10s\n", t.models.size(), jobs, "models", "seconds",
                "captured", "not", "cases");
    const std::vector<capture::CaptureModel> all = t.models;
    int64_t captured = 0, not_captured = 0, meta = 0, cpu = 0;
    for (size_t done = 0; done < all.size();) {
      const size_t next = std::min(all.size(), done + static_cast<size_t>(batch));
      t.models.assign(all.begin() + static_cast<std::ptrdiff_t>(done), all.begin() + static_cast<std::ptrdiff_t>(next));
      auto s = capture::RunTracerCapture(**reg, t);
      if (!s) {
        std::fprintf(stderr, "%s\n", s.error().ToString().c_str());
        return 2;
      }
      captured += s->captured;
      meta += s->on_meta;
      cpu += s->on_cpu;
      not_captured += s->not_built + s->refused + s->failed;
      done = next;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("%8zu %8.1f %10lld %10lld %10lld\n", done, secs, static_cast<long long>(captured),
                  static_cast<long long>(not_captured), static_cast<long long>(s->cases_total));
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    auto models_captured = (*reg)->Query("SELECT COUNT(DISTINCT model_id) FROM programs WHERE status = 'captured'");
    const double m = std::stod(models_captured->rows[0][0]);
    std::printf("captured %.0f models in %lld pairs (%lld on meta, %lld on cpu) in %.1f s: %.1f models/min, %.1f "
                "pairs/min\n",
                m, static_cast<long long>(captured), static_cast<long long>(meta), static_cast<long long>(cpu), secs,
                60.0 * m / secs, 60.0 * static_cast<double>(captured) / secs);
    auto by_device = (*reg)->Query(
        "SELECT device, COUNT(*), SUM(seconds), SUM(calls) FROM programs WHERE status = 'captured' GROUP BY device");
    for (const auto& r : by_device->rows) {
      std::printf("  on %s: %s pairs, %.1f s of tracer time each, %s calls\n", r[0].c_str(), r[1].c_str(),
                  std::stod(r[2]) / std::stod(r[1]), r[3].c_str());
    }
    auto status = (*reg)->Query("SELECT status, stage, COUNT(*) FROM programs GROUP BY status, stage ORDER BY 3 DESC");
    for (const auto& r : status->rows) std::printf("  %s %s: %s pairs\n", r[0].c_str(), r[1].c_str(), r[2].c_str());
    auto reasons = (*reg)->Query("SELECT status, stage, pairs, example, substr(reason, 1, 160) FROM v_capture_failures LIMIT 25");
    std::printf("not captured, by reason:\n");
    for (const auto& r : reasons->rows) {
      std::printf("  %3s pairs %s/%s (e.g. %s): %s\n", r[2].c_str(), r[0].c_str(), r[1].c_str(), r[3].c_str(),
                  r[4].c_str());
    }
  }
  auto by_op = (*reg)->Query("SELECT op, COUNT(*) AS cases FROM op_cases GROUP BY op ORDER BY cases DESC LIMIT 15");
  std::printf("distinct cases by op (top 15):\n");
  for (const auto& row : by_op->rows) std::printf("  %-28s %s\n", row[0].c_str(), row[1].c_str());
  auto by_structure = (*reg)->Query(
      "SELECT json_extract(f.features_json, '$.structure') AS structure, COUNT(DISTINCT s.case_id) AS cases, "
      "COUNT(DISTINCT s.model_id) AS models FROM case_sources s JOIN features f ON f.model_id = s.model_id "
      "GROUP BY structure ORDER BY cases DESC");
  std::printf("distinct cases by model structure:\n");
  for (const auto& row : by_structure->rows) {
    std::printf("  %-16s %8s cases from %s models\n", row[0].c_str(), row[1].c_str(), row[2].c_str());
  }
  auto by_profile = (*reg)->Query(
      "SELECT profile, COUNT(DISTINCT case_id) AS cases FROM case_sources GROUP BY profile ORDER BY cases DESC");
  std::printf("distinct cases by profile:\n");
  for (const auto& row : by_profile->rows) std::printf("  %-16s %8s\n", row[0].c_str(), row[1].c_str());
  auto cases = (*reg)->Query("SELECT COUNT(*), COUNT(DISTINCT op) FROM op_cases");
  std::printf("distinct op cases: %s of %s ops\n", cases->rows[0][0].c_str(), cases->rows[0][1].c_str());
  return 0;
}
