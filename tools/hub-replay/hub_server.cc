#include "tools/hub-replay/hub_server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/check.h"
#include "core/hash.h"
#include "core/sha256.h"
#include "tools/hub-replay/catalog.h"
#include "tools/hub-replay/cursor.h"
#include "tools/hub-replay/permutation.h"
#include "tools/hub-replay/real_catalog.h"
#include "tools/hub-replay/synthetic_catalog.h"

namespace coverage::hub_replay {
namespace {

constexpr char kJson[] = "application/json; charset=utf-8";
constexpr char kText[] = "text/plain; charset=utf-8";
constexpr int kThreads = 16;

enum class Fault { kNone, k429, k500, k502, k503, kReset, kTruncate, kMalformed, kSlow };

std::optional<Fault> ParseFault(const std::string& kind) {
  if (kind == "429") return Fault::k429;
  if (kind == "500") return Fault::k500;
  if (kind == "502") return Fault::k502;
  if (kind == "503") return Fault::k503;
  if (kind == "reset") return Fault::kReset;
  if (kind == "truncate") return Fault::kTruncate;
  if (kind == "malformed") return Fault::kMalformed;
  if (kind == "slow") return Fault::kSlow;
  return std::nullopt;
}

enum Bucket { kApiBucket = 0, kResolverBucket = 1 };
const char* BucketName(int bucket) { return bucket == kResolverBucket ? "resolvers" : "api"; }

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

std::vector<std::string> Split(std::string_view s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(sep, start);
    parts.emplace_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return parts;
}

// Query text taken from the request line, made safe to echo inside a header
// and a `<...>` link: anything outside the URL-safe set is percent-encoded.
std::string SafeQuery(std::string_view raw) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : raw) {
    const unsigned char u = static_cast<unsigned char>(c);
    const bool safe = std::isalnum(u) || std::string_view("-._~%=+&:,/@!$'()*;").find(c) != std::string_view::npos;
    if (safe) {
      out += c;
    } else {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

std::string RawQuery(const httplib::Request& req) {
  const size_t q = req.target.find('?');
  return q == std::string::npos ? "" : SafeQuery(std::string_view(req.target).substr(q + 1));
}

// The raw query without its `cursor` parameters, in the client's order and encoding.
std::string QueryWithoutCursor(const httplib::Request& req) {
  std::string out;
  for (const std::string& part : Split(RawQuery(req), '&')) {
    if (part.empty() || part.substr(0, part.find('=')) == "cursor") continue;
    if (!out.empty()) out += '&';
    out += part;
  }
  return out;
}

bool Truthy(const std::string& v) { return v != "false" && v != "False" && v != "0"; }

std::optional<int64_t> ParseCount(const std::string& s) {
  if (s.empty() || s.size() > 18 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoll(s);
}

void JsonError(httplib::Response& res, int status, const std::string& error_code, const std::string& message) {
  res.status = status;
  if (!error_code.empty()) {
    res.set_header("X-Error-Code", error_code);
    res.set_header("X-Error-Message", message);
  }
  res.set_content(nlohmann::json{{"error", message}}.dump(), kJson);
}

void Redirect(const httplib::Request& req, httplib::Response& res, const std::string& path) {
  const std::string query = RawQuery(req);
  const std::string location = query.empty() ? path : path + "?" + query;
  res.status = 307;
  res.set_header("Location", location);
  res.set_content("Temporary Redirect. Redirecting to " + location, kText);
}

}  // namespace

struct HubServer::Impl {
  HubOptions options;
  std::vector<Fault> fault_kinds;
  std::string host;
  int port = 0;
  std::unique_ptr<Catalog> catalog;
  httplib::Server server;
  std::thread thread;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  std::atomic<int64_t> requests{0};
  std::atomic<int64_t> faults{0};
  std::atomic<int64_t> quota_rejections{0};

  std::mutex quota_mutex;
  struct TargetFaults {
    uint32_t requests = 0;
    uint32_t in_a_row = 0;
  };
  std::mutex fault_mutex;
  std::unordered_map<uint64_t, TargetFaults> target_faults;  // by hash of method + target; only with faults on
  int64_t window_index[2] = {-1, -1};
  int64_t window_count[2] = {0, 0};

  std::mutex stop_mutex;
  std::condition_variable stop_cv;
  bool stopping = false;

  struct QuotaState {
    bool allowed;
    int64_t remaining;
    int64_t reset_s;
  };

  QuotaState TakeQuota(int bucket) {
    const int64_t window_ms = int64_t{options.quota.window_s} * 1000;
    const int64_t elapsed_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
    const int64_t index = elapsed_ms / window_ms;
    const int64_t reset_s = std::max<int64_t>(1, ((index + 1) * window_ms - elapsed_ms + 999) / 1000);
    std::lock_guard<std::mutex> lock(quota_mutex);
    if (window_index[bucket] != index) {
      window_index[bucket] = index;
      window_count[bucket] = 0;
    }
    const int64_t count = ++window_count[bucket];
    return {count <= options.quota.requests, std::max<int64_t>(0, options.quota.requests - count), reset_s};
  }

  // The fault of the k-th request (k = 0, 1, ...) for one method and target
  // (path and query) is a hash of (seed, target, k): the same for the same
  // seed however concurrent clients interleave. With max_in_a_row > 0, a
  // request that follows that many faulted ones for the same target is
  // answered normally.
  Fault DecideFault(const std::string& method, const std::string& target) {
    if (options.faults.rate <= 0 || fault_kinds.empty()) return Fault::kNone;
    const uint64_t key = Fnv1a64(method + " " + target);
    uint64_t k;
    {
      std::lock_guard<std::mutex> lock(fault_mutex);
      TargetFaults& t = target_faults[key];
      k = t.requests++;
      if (options.faults.max_in_a_row > 0 && t.in_a_row >= static_cast<uint32_t>(options.faults.max_in_a_row)) {
        t.in_a_row = 0;
        return Fault::kNone;
      }
      const uint64_t seed = options.faults.seed;
      if (UnitInterval(HashOf(seed ^ key, k, 0xfa17)) >= options.faults.rate) {
        t.in_a_row = 0;
        return Fault::kNone;
      }
      ++t.in_a_row;
      return fault_kinds[HashOf(seed ^ key, k, 0xfa18) % fault_kinds.size()];
    }
  }

  // Sleeps for `ms` unless Stop() comes first.
  void Sleep(int ms) {
    std::unique_lock<std::mutex> lock(stop_mutex);
    stop_cv.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stopping; });
  }

  std::string BaseUrl(const httplib::Request& req) const {
    const std::string h = req.get_header_value("Host");
    const bool ok = !h.empty() && h.size() <= 255 && std::all_of(h.begin(), h.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' || c == '[' || c == ']';
    });
    return "http://" + (ok ? h : EndpointHost() + ":" + std::to_string(port));
  }

  std::string EndpointHost() const {
    if (host.empty() || host == "0.0.0.0") return "127.0.0.1";
    if (host == "::") return "[::1]";
    if (host.find(':') != std::string::npos) return "[" + host + "]";
    return host;
  }

  void Handle(const httplib::Request& req, httplib::Response& res);
  void Route(const httplib::Request& req, httplib::Response& res);
  void ListModels(const httplib::Request& req, httplib::Response& res);
  void ModelInfo(const httplib::Request& req, httplib::Response& res, std::string_view rest);
  void Resolve(const httplib::Request& req, httplib::Response& res, const std::string& id, const std::string& rev,
               const std::string& file);
};

void HubServer::Impl::Handle(const httplib::Request& req, httplib::Response& res) {
  requests.fetch_add(1);
  const int bucket = req.path.find("/resolve/") != std::string::npos ? kResolverBucket : kApiBucket;
  std::optional<QuotaState> quota;
  if (options.quota.requests > 0) {
    quota = TakeQuota(bucket);
    res.set_header("RateLimit", "\"" + std::string(BucketName(bucket)) + "\";r=" + std::to_string(quota->remaining) +
                                    ";t=" + std::to_string(quota->reset_s));
    res.set_header("RateLimit-Policy", "\"fixed window\";\"" + std::string(BucketName(bucket)) +
                                           "\";q=" + std::to_string(options.quota.requests) +
                                           ";w=" + std::to_string(options.quota.window_s));
    if (!quota->allowed) {
      ++quota_rejections;
      res.set_header("Retry-After", std::to_string(quota->reset_s));
      JsonError(res, 429, "",
                "Too Many Requests: more than " + std::to_string(options.quota.requests) + " requests to '" +
                    BucketName(bucket) + "' in a " + std::to_string(options.quota.window_s) + "s window. Retry after " +
                    std::to_string(quota->reset_s) + " seconds.");
      return;
    }
  }

  const Fault fault = DecideFault(req.method, req.target);
  if (fault != Fault::kNone) ++faults;
  switch (fault) {
    case Fault::k429:
      res.set_header("Retry-After", "1");
      res.headers.erase("RateLimit");  // the quota's header, if any, would say r > 0
      res.set_header("RateLimit", "\"" + std::string(BucketName(bucket)) + "\";r=0;t=1");
      JsonError(res, 429, "", "Too Many Requests (injected fault)");
      return;
    case Fault::k500:
      JsonError(res, 500, "", "Internal Server Error (injected fault)");
      return;
    case Fault::k502:
      JsonError(res, 502, "", "Bad Gateway (injected fault)");
      return;
    case Fault::k503:
      JsonError(res, 503, "", "Service Unavailable (injected fault)");
      return;
    case Fault::kSlow:
      Sleep(options.faults.slow_ms);
      break;
    default:
      break;
  }

  try {
    Route(req, res);
  } catch (const std::exception& e) {
    JsonError(res, 500, "", std::string("internal error: ") + e.what());
  }

  if (fault == Fault::kMalformed) {
    // A proper prefix of a JSON object or array is never valid JSON.
    const bool json = StartsWith(res.get_header_value("Content-Type"), "application/json") && res.body.size() >= 2;
    const std::string body = json ? res.body.substr(0, res.body.size() / 2) : "{\"error\": ";
    res.status = 200;
    res.headers.erase("Location");
    res.set_content(body, kJson);
  } else if (fault == Fault::kReset || fault == Fault::kTruncate) {
    auto body = std::make_shared<std::string>(std::move(res.body));
    res.body.clear();
    const std::string type = res.get_header_value("Content-Type");
    res.headers.erase("Content-Type");
    const size_t cut = fault == Fault::kReset ? 0 : body->size() / 2;
    // Promises the whole body, sends `cut` bytes, then fails the write so
    // the server drops the connection.
    res.set_content_provider(std::max<size_t>(body->size(), 1), type.empty() ? kJson : type,
                             [body, cut](size_t offset, size_t length, httplib::DataSink& sink) {
                               if (offset >= cut) return false;
                               return sink.write(body->data() + offset, std::min(length, cut - offset));
                             });
  }
}

void HubServer::Impl::Route(const httplib::Request& req, httplib::Response& res) {
  const std::string& path = req.path;
  if (path == "/api/models" || path == "/api/models/") return ListModels(req, res);
  if (StartsWith(path, "/api/models/")) return ModelInfo(req, res, std::string_view(path).substr(12));
  if (path.size() > 1) {
    const std::vector<std::string> seg = Split(std::string_view(path).substr(1), '/');
    auto join_from = [&](size_t first) {
      std::string file;
      for (size_t i = first; i < seg.size(); ++i) file += (i > first ? "/" : "") + seg[i];
      return file;
    };
    if (seg.size() >= 5 && seg[2] == "resolve") return Resolve(req, res, seg[0] + "/" + seg[1], seg[3], join_from(4));
    if (seg.size() >= 4 && seg[1] == "resolve") return Resolve(req, res, seg[0], seg[2], join_from(3));
  }
  JsonError(res, 404, "", "Not Found");
}

void HubServer::Impl::ListModels(const httplib::Request& req, httplib::Response& res) {
  ListQuery q;
  for (size_t i = 0; i < req.get_param_value_count("search"); ++i) {
    const std::string s = ToLower(req.get_param_value("search", i));
    if (!s.empty()) q.search.push_back(s);
  }
  q.author = ToLower(req.get_param_value("author"));
  for (size_t i = 0; i < req.get_param_value_count("filter"); ++i) {
    const std::string f = req.get_param_value("filter", i);
    if (!f.empty()) q.filters.push_back(f);
  }
  q.pipeline_tag = req.get_param_value("pipeline_tag");
  q.library = req.get_param_value("library");
  if (req.has_param("gated")) {
    const std::string g = req.get_param_value("gated");
    if (g == "true" || g == "True" || g == "1") {
      q.gated = true;
    } else if (g == "false" || g == "False" || g == "0") {
      q.gated = false;
    } else {
      return JsonError(res, 400, "", "Invalid gated value: expected true or false");
    }
  }
  if (req.has_param("sort")) {
    const std::optional<SortKey> key = ParseSortKey(req.get_param_value("sort"));
    if (!key) return JsonError(res, 400, "", "Invalid sort: expected downloads, likes, createdAt, lastModified or id");
    q.sort = *key;
  }
  q.descending = !req.has_param("direction") || req.get_param_value("direction") == "-1";
  q.limit = std::min(1000, options.max_page);
  if (req.has_param("limit")) {
    const std::optional<int64_t> limit = ParseCount(req.get_param_value("limit"));
    if (!limit || *limit < 1) return JsonError(res, 400, "", "Invalid limit: expected a positive integer");
    q.limit = std::min<int64_t>(*limit, options.max_page);
  }
  const bool full = req.has_param("full") && Truthy(req.get_param_value("full"));
  const bool config = req.has_param("config") && Truthy(req.get_param_value("config"));
  if (req.has_param("cursor")) {
    q.cursor = DecodeCursor(req.get_param_value("cursor"));
    if (!q.cursor) return JsonError(res, 400, "", "Invalid cursor");
  }
  Result<ListPage> page = RunListQuery(*catalog, q);
  if (!page) return JsonError(res, 400, "", "Invalid cursor: " + page.error().message());

  nlohmann::ordered_json body = nlohmann::ordered_json::array();
  for (const ModelRecord& m : page->models) body.push_back(EntryJson(m, full, config));
  if (page->next) {
    const std::string query = QueryWithoutCursor(req);
    res.set_header("Link", "<" + BaseUrl(req) + "/api/models?" + query + (query.empty() ? "" : "&") +
                               "cursor=" + EncodeCursor(*page->next) + ">; rel=\"next\"");
  }
  res.set_content(body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace), kJson);
}

void HubServer::Impl::ModelInfo(const httplib::Request& req, httplib::Response& res, std::string_view rest) {
  const std::vector<std::string> seg = Split(rest, '/');
  std::string id, revision;
  if (seg.size() == 1 || seg.size() == 2) {
    id = std::string(rest);
  } else if (seg.size() == 3 && seg[1] == "revision") {
    id = seg[0];
    revision = seg[2];
  } else if (seg.size() == 4 && seg[2] == "revision") {
    id = seg[0] + "/" + seg[1];
    revision = seg[3];
  } else {
    return JsonError(res, 404, "", "Not Found");
  }
  if (!IsPlausibleModelId(id)) return JsonError(res, 400, "", "Invalid model id");
  if (!revision.empty() && !IsPlausibleModelId(revision)) return JsonError(res, 400, "", "Invalid revision");
  const std::optional<int64_t> index = catalog->Find(id);
  if (!index) {
    if (const std::optional<std::string> target = catalog->RedirectTarget(id)) {
      return Redirect(req, res, "/api/models/" + *target + (revision.empty() ? "" : "/revision/" + revision));
    }
    return JsonError(res, 404, "RepoNotFound", "Repository not found");
  }
  const ModelRecord model = catalog->Record(*index);
  if (!revision.empty() && revision != "main" && revision != "HEAD" && revision != model.sha) {
    return JsonError(res, 404, "RevisionNotFound", "Invalid rev id");
  }
  res.set_content(EntryJson(model, /*full=*/true, /*config=*/true)
                      .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace),
                  kJson);
}

void HubServer::Impl::Resolve(const httplib::Request& req, httplib::Response& res, const std::string& id,
                              const std::string& revision, const std::string& file) {
  if (!IsPlausibleModelId(id)) return JsonError(res, 400, "", "Invalid model id");
  if (!revision.empty() && !IsPlausibleModelId(revision)) return JsonError(res, 400, "", "Invalid revision");
  const std::optional<int64_t> index = catalog->Find(id);
  if (!index) {
    if (const std::optional<std::string> target = catalog->RedirectTarget(id)) {
      if (IsPlausibleModelId(revision) && !file.empty() && file.size() < 256 &&
          std::none_of(file.begin(), file.end(), [](char c) { return static_cast<unsigned char>(c) < 0x21; })) {
        return Redirect(req, res, "/" + *target + "/resolve/" + revision + "/" + SafeQuery(file));
      }
    }
    return JsonError(res, 404, "RepoNotFound", "Repository not found");
  }
  const ModelRecord model = catalog->Record(*index);
  if (revision != "main" && revision != model.sha) return JsonError(res, 404, "RevisionNotFound", "Invalid rev id");
  if (!model.gated.empty()) {
    const std::string& token = options.gated_token;
    if (token.empty() || req.get_header_value("Authorization") != "Bearer " + token) {
      return JsonError(res, 401, "GatedRepo",
                       "Access to model " + model.id +
                           " is restricted. You must have access to it and be authenticated to access it. "
                           "Please log in.");
    }
  }
  if (file != "config.json") return JsonError(res, 404, "EntryNotFound", "Entry not found");
  const std::optional<std::string> bytes = catalog->ConfigBytes(*index);
  if (!bytes) return JsonError(res, 404, "EntryNotFound", "Entry not found");
  res.set_header("X-Repo-Commit", model.sha);
  res.set_header("ETag", "\"" + Sha256Hex(*bytes).substr(0, 40) + "\"");
  res.set_content(*bytes, kJson);
}

namespace {

Status ValidateOptions(const HubOptions& o, std::vector<Fault>* kinds) {
  if (o.synthetic < 0 || o.synthetic > kMaxSyntheticModels) {
    return Status::InvalidArgument("HubOptions.synthetic must be 0 (real data) or 1.." +
                                   std::to_string(kMaxSyntheticModels));
  }
  if (!(o.faults.rate >= 0 && o.faults.rate <= 1)) {
    return Status::InvalidArgument("FaultOptions.rate must lie in [0, 1], not " + std::to_string(o.faults.rate));
  }
  for (const std::string& k : o.faults.kinds) {
    const std::optional<Fault> f = ParseFault(k);
    if (!f) {
      return Status::InvalidArgument("FaultOptions.kinds: unknown fault '" + k +
                                     "' (expected 429, 500, 502, 503, reset, truncate, malformed or slow)");
    }
    kinds->push_back(*f);
  }
  if (o.faults.rate > 0 && kinds->empty()) return Status::InvalidArgument("FaultOptions.kinds is empty");
  if (o.faults.max_in_a_row < 0) {
    return Status::InvalidArgument("FaultOptions.max_in_a_row must be >= 0 (0: no cap), not " +
                                   std::to_string(o.faults.max_in_a_row));
  }
  if (o.faults.slow_ms < 0 || o.faults.slow_ms > 600000) {
    return Status::InvalidArgument("FaultOptions.slow_ms must lie in [0, 600000]");
  }
  if (o.quota.requests < 0) return Status::InvalidArgument("QuotaOptions.requests must be >= 0");
  if (o.quota.window_s < 1) return Status::InvalidArgument("QuotaOptions.window_s must be >= 1");
  if (o.max_page < 1) return Status::InvalidArgument("HubOptions.max_page must be >= 1");
  return Status::Ok();
}

}  // namespace

HubServer::HubServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HubServer::~HubServer() { Stop(); }

Result<std::unique_ptr<HubServer>> HubServer::Start(const HubOptions& options, const std::string& host, int port) {
  auto impl = std::make_unique<Impl>();
  COV_RETURN_IF_ERROR(ValidateOptions(options, &impl->fault_kinds));
  if (port < 0 || port > 65535) return Status::InvalidArgument("port must lie in [0, 65535]");
  impl->options = options;
  if (impl->options.data_dir.empty()) impl->options.data_dir = COVERAGE_HUB_DATA_DIR;
  impl->host = host;
  const std::string& data_dir = impl->options.data_dir;
  if (options.synthetic > 0) {
    COV_ASSIGN_OR_RETURN(const std::vector<ConfigEntry> configs, LoadConfigsJsonl(data_dir + "/configs.jsonl"));
    COV_ASSIGN_OR_RETURN(impl->catalog, MakeSyntheticCatalog(configs, options.synthetic, options.seed));
  } else {
    COV_ASSIGN_OR_RETURN(impl->catalog, LoadRealCatalog(data_dir));
  }

  Impl* raw = impl.get();
  raw->server.new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
  raw->server.set_tcp_nodelay(true);  // headers and body go out in separate writes; no Nagle delay between them
  raw->server.set_keep_alive_max_count(1000);
  raw->server.set_keep_alive_timeout(1);  // bounds how long Stop waits for idle keep-alive connections
  raw->server.Get(R"(/[\s\S]*)", [raw](const httplib::Request& req, httplib::Response& res) { raw->Handle(req, res); });
  if (port == 0) {
    raw->port = raw->server.bind_to_any_port(host);
    if (raw->port <= 0) return Status::IoError("cannot bind " + host + " to a free port");
  } else {
    if (!raw->server.bind_to_port(host, port))
      return Status::IoError("cannot bind " + host + ":" + std::to_string(port));
    raw->port = port;
  }
  raw->thread = std::thread([raw] { raw->server.listen_after_bind(); });
  for (int i = 0; i < 2000 && !raw->server.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return std::unique_ptr<HubServer>(new HubServer(std::move(impl)));
}

void HubServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->stop_mutex);
    impl_->stopping = true;
  }
  impl_->stop_cv.notify_all();
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int HubServer::port() const { return impl_->port; }

std::string HubServer::endpoint() const {
  return "http://" + impl_->EndpointHost() + ":" + std::to_string(impl_->port);
}

HubStats HubServer::stats() const {
  return HubStats{impl_->requests.load(), impl_->faults.load(), impl_->quota_rejections.load()};
}

int64_t HubServer::model_count() const { return impl_->catalog->size(); }

std::string HubServer::ModelIdAt(int64_t i) const {
  COV_CHECK(i >= 0 && i < impl_->catalog->size(), "ModelIdAt: index out of range");
  return impl_->catalog->IdAt(i);
}

int64_t HubServer::DownloadsAt(int64_t i) const {
  COV_CHECK(i >= 0 && i < impl_->catalog->size(), "DownloadsAt: index out of range");
  return impl_->catalog->Record(i).downloads;
}

std::optional<std::string> HubServer::ConfigBytes(const std::string& id) const {
  const std::optional<int64_t> index = impl_->catalog->Find(id);
  if (!index) return std::nullopt;
  return impl_->catalog->ConfigBytes(*index);
}

}  // namespace coverage::hub_replay
