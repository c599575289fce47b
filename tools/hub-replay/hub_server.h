// HubServer: a local HTTP server that speaks the subset of the Hugging Face
// Hub API the crawler uses (shared/data/hub/API.md §1-6), for tests, demos and
// benchmarks. It serves either the real recorded data of data/hub/ or a
// synthetic hub of any size, and can inject faults and enforce a quota.
//
// Endpoints (JSON bodies, `Content-Type: application/json; charset=utf-8`):
//   GET /api/models                      list: search, author, filter (repeatable), pipeline_tag, library,
//                                        gated, sort, direction, limit, full, config, cursor; next page in
//                                        `Link: <absolute URL>; rel="next"`
//   GET /api/models/{id}[/revision/{r}]  one model, all fields and the trimmed config
//   GET /{id}/resolve/{r}/config.json    the exact config.json bytes (gated models need the token)
// Legacy ids answer a relative 307 like the Hub; errors carry `X-Error-Code`
// (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) and
// `X-Error-Message`; ids that break the Hub's id rules get 400 and are never
// used for anything else. tools/hub-replay/README.md has every detail.
//
// Faults (FaultOptions) are decided by a hash of (seed, method and target,
// how many times that target was requested before), so the same seed gives
// the same faults however concurrent clients interleave.
//
// Thread safety: Start returns a running server that answers requests on its
// own threads; all const methods may be called from any thread at any time.
// Stop (and the destructor) must not race with each other.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"

namespace coverage::hub_replay {

struct FaultOptions {
  double rate = 0;    // probability in [0, 1] that a request gets a fault
  uint64_t seed = 1;  // deterministic: same seed + same request sequence -> same faults
  // Kinds drawn uniformly for a faulted request:
  //   "429"        429 with `Retry-After: 1` and `RateLimit: "api";r=0;t=1`
  //   "500" "502" "503"  that status with a JSON error body
  //   "reset"      status line and headers, then the connection closes before any body byte
  //   "truncate"   the real response with the body cut in the middle, then the connection closes
  //   "malformed"  200 with an invalid JSON body (a proper prefix of the real one)
  //   "slow"       the real response after slow_ms
  std::vector<std::string> kinds = {"429", "500", "502", "503", "reset", "truncate", "malformed"};  // also "slow"
  int slow_ms = 2000;                                                                               // delay for "slow"
  // 0: no cap. Otherwise a request that follows this many faulted requests
  // in a row for the same target is answered normally (transient faults).
  int max_in_a_row = 0;
};

// Like the Hub's quotas: fixed windows of window_s seconds from the start,
// counted per bucket ("api" for /api/..., "resolvers" for .../resolve/...),
// each allowing `requests` requests. Past the quota: 429 with
// `RateLimit: "<bucket>";r=0;t=<seconds to reset>`, `Retry-After: <the same>` and
// `RateLimit-Policy: "fixed window";"<bucket>";q=<requests>;w=<window_s>`;
// other responses carry both headers with the remaining count.
struct QuotaOptions {
  int64_t requests = 0;  // 0 = off
  int window_s = 300;
};

struct HubOptions {
  std::string data_dir;   // folder with configs.jsonl, models.jsonl (trimmed metadata), redirects.json;
                          // "" = the project's data/hub (path compiled in)
  int64_t synthetic = 0;  // 0: serve the real data; N > 0: a synthetic hub of N models (needs configs.jsonl only)
  uint64_t seed = 1;      // synthetic generation seed
  FaultOptions faults;
  QuotaOptions quota;
  int max_page = 1000;      // `limit` is capped at this; also the default limit (at most 1000)
  std::string gated_token;  // token that unlocks gated configs ("" = none does)
};

struct HubStats {
  int64_t requests = 0;          // every request received
  int64_t faults = 0;            // requests answered with an injected fault
  int64_t quota_rejections = 0;  // requests answered 429 by the quota
};

class HubServer {
 public:
  // Loads data, binds host:port (0 = any free port), serves in a background
  // thread. Errors: InvalidArgument for bad options (names the field),
  // IoError / Corruption for data files that cannot be read or parsed (names
  // the file and line), IoError when the address cannot be bound.
  static Result<std::unique_ptr<HubServer>> Start(const HubOptions& options, const std::string& host = "127.0.0.1",
                                                  int port = 0);
  ~HubServer();  // stops
  HubServer(const HubServer&) = delete;
  HubServer& operator=(const HubServer&) = delete;

  // Stops serving and joins the server threads; requests sleeping in a "slow"
  // fault wake up at once. Takes up to 1 s while a client still holds an idle
  // keep-alive connection (close clients first to stop at once). Idempotent.
  void Stop();

  int port() const;
  std::string endpoint() const;  // "http://127.0.0.1:PORT" (the bound host; a wildcard host shows as loopback)
  HubStats stats() const;

  // The full served set, for tests that compare a crawl against it:
  int64_t model_count() const;
  std::string ModelIdAt(int64_t i) const;  // i in [0, model_count()); aborts otherwise
  int64_t DownloadsAt(int64_t i) const;    // likewise
  // Exact bytes served for {id}/resolve/main/config.json; nullopt if the id is
  // not a served model (legacy ids included) or the model has no config.json.
  std::optional<std::string> ConfigBytes(const std::string& id) const;

 private:
  struct Impl;
  explicit HubServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace coverage::hub_replay
