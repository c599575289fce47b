// How fast a crawl ingests Hub listings, next to a bare baseline on the same
// bytes, and how its memory grows with the hub's size.
//
//   build/bin/bench_crawl_ingest [--models 1000000] [--page-limit 1000]
//
// Starts an in-process hub-replay serving a synthetic hub of N models, crawls
// its listing over real HTTP into a scratch registry (coverage's crawler:
// libcurl, retries, validation, the registry sink with a page and its cursor
// per transaction; config.json fetches off), recording every page body. Then
// the baseline parses the same recorded bytes with nlohmann::json and inserts
// (id, downloads, likes, tags, model_type) with one prepared statement per
// page transaction into another scratch database. Reports records/s for both,
// their ratio, and the process's peak RSS.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>
#include <cstdint>

#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include "crawler/crawl.h"
#include "crawler/curl_http_client.h"
#include "registry/registry.h"
#include "crawler/registry_sink.h"
#include "tools/hub-replay/hub_server.h"

using namespace coverage;

namespace {

using Clock = std::chrono::steady_clock;

// Peak resident set size of this process, in MiB (VmHWM).
double PeakRssMb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

// Forwards to libcurl and appends the body of every list page to a file
// (length-prefixed), so the baseline can replay the same bytes without
// holding them in memory.
class RecordingClient final : public crawler::HttpClient {
 public:
  RecordingClient(std::ofstream* out, int64_t* bytes) : out_(out), bytes_(bytes) {}
  Result<crawler::HttpResponse> Get(const crawler::HttpRequest& request) override {
    auto r = inner_.Get(request);
    if (r && r->status == 200 && request.url.find("/api/models?") != std::string::npos) {
      const uint64_t n = r->body.size();
      out_->write(reinterpret_cast<const char*>(&n), sizeof(n));
      out_->write(r->body.data(), static_cast<std::streamsize>(n));
      *bytes_ += static_cast<int64_t>(n);
    }
    return r;
  }

 private:
  crawler::CurlHttpClient inner_;
  std::ofstream* out_;
  int64_t* bytes_;
};

// The bare baseline: parse each page and insert its rows, nothing else.
int64_t BareIngest(const std::string& recorded, const std::string& path) {
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                   "CREATE TABLE m(id TEXT PRIMARY KEY, downloads INTEGER, likes INTEGER, tags TEXT, model_type TEXT)",
               nullptr, nullptr, nullptr);
  sqlite3_stmt* stmt = nullptr;
  sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO m VALUES (?1, ?2, ?3, ?4, ?5)", -1, &stmt, nullptr);
  int64_t rows = 0;
  std::ifstream in(recorded, std::ios::binary);
  std::string body;
  for (uint64_t n = 0; in.read(reinterpret_cast<char*>(&n), sizeof(n));) {
    body.resize(n);
    in.read(body.data(), static_cast<std::streamsize>(n));
    nlohmann::json page = nlohmann::json::parse(body, nullptr, false);
    if (!page.is_array()) continue;
    sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
    for (const auto& e : page) {
      const std::string id = e.value("id", "");
      const std::string tags = e.contains("tags") ? e["tags"].dump() : "[]";
      const std::string type = e.contains("config") ? e["config"].value("model_type", "") : "";
      sqlite3_bind_text(stmt, 1, id.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(stmt, 2, e.value("downloads", int64_t{0}));
      sqlite3_bind_int64(stmt, 3, e.value("likes", int64_t{0}));
      sqlite3_bind_text(stmt, 4, tags.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(stmt, 5, type.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_step(stmt);
      sqlite3_reset(stmt);
      ++rows;
    }
    sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t models = 1000000;
  int page_limit = 1000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--models") models = std::stoll(argv[i + 1]);
    else if (flag == "--page-limit") page_limit = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  hub_replay::HubOptions hub;
  hub.synthetic = models;
  hub.max_page = page_limit;
  auto server = hub_replay::HubServer::Start(hub);
  if (!server) {
    std::fprintf(stderr, "%s\n", server.error().ToString().c_str());
    return 2;
  }
  const auto dir = std::filesystem::temp_directory_path() / "bench_crawl_ingest";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto reg = registry::Registry::Open((dir / "crawl.db").string());
  if (!reg) {
    std::fprintf(stderr, "%s\n", reg.error().ToString().c_str());
    return 2;
  }
  const double rss_before = PeakRssMb();

  const std::string recorded = (dir / "pages.bin").string();
  std::ofstream record(recorded, std::ios::binary);
  int64_t bytes = 0;
  crawler::CrawlOptions options;
  options.endpoint = (*server)->endpoint();
  options.page_limit = page_limit;
  options.fetch_configs = false;
  options.rate_per_s = 0;
  crawler::RegistryCrawlSink sink(reg->get());
  const auto t0 = Clock::now();
  auto summary = crawler::RunCrawl(options, sink, [&] { return std::make_unique<RecordingClient>(&record, &bytes); });
  record.close();
  const double crawl_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!summary) {
    std::fprintf(stderr, "%s\n", summary.error().ToString().c_str());
    return 2;
  }
  const double rss_crawl = PeakRssMb();

  const auto t1 = Clock::now();
  const int64_t rows = BareIngest(recorded, (dir / "bare.db").string());
  const double bare_s = std::chrono::duration<double>(Clock::now() - t1).count();

  std::printf("synthetic hub of %lld models, %d per page, %lld pages, %.0f MB of listing JSON\n",
              static_cast<long long>(models), page_limit, static_cast<long long>(summary->pages), bytes / 1e6);
  std::printf("%-44s %10s %10s %12s\n", "", "records", "seconds", "records/s");
  std::printf("%-44s %10lld %10.2f %12.0f\n", "coverage crawl (HTTP + validation + registry)",
              static_cast<long long>(summary->models), crawl_s, summary->models / crawl_s);
  std::printf("%-44s %10lld %10.2f %12.0f\n", "bare parse-and-insert of the same bytes", static_cast<long long>(rows),
              bare_s, rows / bare_s);
  std::printf("crawl / baseline: %.0f%%\n", 100.0 * (summary->models / crawl_s) / (rows / bare_s));
  std::printf("peak RSS: %.0f MiB before the crawl (hub-replay loaded), %.0f MiB after it\n", rss_before, rss_crawl);
  std::filesystem::remove_all(dir);
  return 0;
}
