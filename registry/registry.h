// Registry: the SQLite database every step of coverage reads and writes.
//
// Owns the schema (numbered migrations, see schema.cc and README.md) and the
// typed reads and writes of op cases, their provenance, models, runs and
// results. It knows no torch and no HTTP.
//
// Writes are UPSERTs: recording the same case twice keeps one row; recording
// a result for a (run, case) pair that already has one replaces it. Failures
// are Statuses that name the database file.
//
// Thread safety: one Registry per thread. Several processes may open the same
// file (WAL mode); writers serialise on SQLite's lock with a busy timeout.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/case_result.h"
#include "core/model_item.h"
#include "core/op_case.h"
#include "core/outcome.h"
#include "core/program.h"
#include "core/result.h"
#include "registry/case_query.h"

namespace coverage::registry {

class Database;

struct RegistryOptions {
  bool read_only = false;      // open without migrating or writing
  int busy_timeout_ms = 60000;  // how long a writer waits for another one (Note [Busy registry])
};

// Estimated cost of running a case once (see core/cost.cc for formulas).
struct CaseCost {
  double flops = 0;  // floating-point operations
  double bytes = 0;  // bytes read and written by the op's inputs and outputs
};

// Where a case came from: one (model, module, profile) that made the call.
struct CaseSource {
  std::string model_id;     // e.g. "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
  std::string module_path;  // e.g. "layers.0.self_attn"
  std::string call_site;    // the parent op for nested calls, else empty
  std::string profile;      // input profile, e.g. "prefill"
  int depth = 0;            // 0 = top-level call while the module ran
  int64_t call_count = 1;   // identical calls merged into this source
};

struct ModelRecord {
  std::string id;
  std::string model_type;
  std::string source;       // where the config came from
  std::string config_json;  // may be empty
};

// A model as the Hub lists it (crawler/hub_model.h, in registry terms).
struct HubModelRecord {
  std::string id;
  std::string author;
  std::string sha;
  int64_t downloads = 0;
  int64_t likes = 0;
  std::string tags_json = "[]";
  std::string pipeline_tag;
  std::string library_name;
  std::string created_at;
  std::string last_modified;
  std::string gated = "false";
  bool is_private = false;
  std::string model_type;
  std::string architectures_json = "[]";
};

struct CrawlState {
  std::string crawl_id;
  std::optional<std::string> next_url;  // nullopt: listing exhausted
  int64_t pages = 0;
  int64_t models = 0;
  int64_t rejects = 0;
};

struct StoredCase {
  int64_t case_id = 0;
  std::string key;
  OpCase op_case;
  CaseCost cost;
  int64_t num_sources = 0;   // filled by FindCases
  int64_t total_calls = 0;   // filled by FindCases
  std::string models;        // comma-separated source models, filled by FindCases
  int64_t opinfo_samples = 0;  // OpInfo samples that make this call, filled by FindCases
};

// One (OpInfo, dtype) of `coverage import opinfo`: imported with its
// samples' calls, or skipped with the reason.
struct OpInfoImportRecord {
  std::string opinfo;   // the OpInfo's name
  std::string variant;  // its variant_test_name, "" for none
  std::string dtype;    // f32, bf16, ...
  std::string status;   // imported, skipped
  std::string reason;   // skipped: why
  int64_t samples = 0, failed = 0;
  int64_t calls = 0;    // calls stored (of the kept ops)
  int64_t cases = 0;    // distinct op cases among them (filled by StoreOpInfo)
  std::string torch_version;
  std::string imported_at;
};

// One call of one OpInfo sample.
struct OpInfoSampleCall {
  int64_t sample = 0;
  std::string sample_name;
  int64_t call_index = 0;
  OpCase op_case;
  CaseCost cost;
};

struct RunRecord {
  std::string run_id;
  std::string stage;    // "unit", later "module", "model", "train"
  std::string backend;  // e.g. "cpu"
  std::string started_at;   // ISO-8601 UTC to the millisecond: 2026-12-07T02:24:01.123Z
  std::string finished_at;  // empty while running
  std::string libtorch_version;
  std::string host;
  std::string git_revision;
  std::string config_json;  // the effective options of the run
  // The backend as baselines know it (schema v14): "cpu", "sim",
  // "privateuse1:<device name>" (not the plugin's path); "" for a run stored
  // before, whose `backend` is its identity. Identity() gives either.
  std::string backend_name;
  std::string backend_version;  // the plugin's coverage_backend_version, "" for none
  const std::string& Identity() const { return backend_name.empty() ? backend : backend_name; }
};

// Who writes a run (or one shard of it) now: see Registry::AcquireRunLease.
struct RunLease {
  std::string run_id;
  int shard_index = 0;  // 0 of 0: the whole run
  int shard_count = 0;
  std::string host;
  int64_t pid = 0;
  int64_t process_start = 0;  // the holder's start time, to tell a reused pid apart
  std::string acquired_at;    // read back: ISO-8601 UTC
  std::string renewed_at;
  int64_t age_seconds = 0;    // read back: seconds since renewed_at
};

// A unit result as stored: the CaseResult (core/case_result.h) the stage
// recorded, bound to and read from its row directly (Note [Stored results]
// in runs.cc). The timing breakdown travels inside the row's detail_json.
struct StoredResult {
  int64_t case_id = 0;
  CaseResult result;
};

// A run as a report shows it (Registry::GetRunOverview).
struct RunOverview {
  RunRecord run;
  int64_t unit_results = 0;     // rows of results
  int64_t model_results = 0;    // rows of model_results
  int64_t shard_count = 0;      // 0: not sharded
  int64_t shards_finished = 0;
};

// What the crawl, the newest selection and the capture put in the registry
// (Registry::GetPipelineCounts).
struct PipelineCounts {
  int64_t crawls = 0, models = 0, configs_fetched = 0;
  int64_t selection_id = 0, selection_k = 0, selection_models = 0, representatives = 0;
  int64_t coarse_total = 0, coarse_covered = 0;  // families in the population, and with a representative
  std::map<std::string, int64_t> program_statuses;  // captured, not_built, refused, ... -> (model, profile) pairs
  int64_t models_captured = 0, op_cases = 0;
};

// A unit result with what identifies its case (Registry::CaseResultsForRun).
struct CaseResultRow {
  std::string key;
  std::string op;       // qualified: "aten::add.Tensor"
  std::string summary;
  std::string dtypes;   // "f32 i64"
  int64_t case_id = 0;
  CaseResult result;
};

struct CaseSourceRow {
  std::string model_id, module_path, profile;
  int64_t call_count = 0;
};

struct CaseRunResult {
  std::string run_id, backend;
  Outcome outcome = Outcome::kPass;
  std::string error;
};

struct CaseModelRow {
  int64_t case_id = 0;
  std::string model_id;
  std::string model_type;  // "" when unknown
};

// A model's config as stored, for feature extraction.
struct ConfigRow {
  std::string model_id;
  std::string config_json;
};

// The features derived from one model's config (registry table `features`).
struct FeatureRecord {
  std::string model_id;
  int version = 0;
  bool ok = false;
  std::string reason;  // why extraction failed
  bool understood = false;
  std::string features_json;
  std::string coarse, fine;
  int64_t downloads = 0;  // models.downloads, filled by ForEachFeature
  // StoreFeatures: the config text the row was derived from; the row is
  // stored only while the model's config_json is still exactly this.
  std::string derived_from;
};

struct SelectionRecord {
  int k = 0;
  uint64_t seed = 0;
  int feature_version = 0;
  int64_t models = 0;
  std::string coverage_json;
  std::string warnings_json = "[]";
};

struct RepresentativeRecord {
  int rank = 0;
  std::string model_id;
  std::string reason;
  double distance_when_chosen = 0;
  int64_t stands_for = 0;
  int64_t downloads_represented = 0;
};

struct MemberRecord {
  std::string model_id;
  int representative_rank = 0;
  double distance = 0;
};

// What the capture tracer did with one (model, profile) (table programs).
struct ProgramRecord {
  int64_t program_id = 0;  // filled when stored or read
  std::string model_id;
  std::string profile;
  int tracer_version = 0;
  int64_t max_layers = 0;
  int64_t max_experts = 0;    // the tracer's --max-experts (0: every expert)
  std::string config_sha256;  // of the config text traced
  double max_gb = 0;          // the tracer's CPU-run budget
  std::string device_option = "auto";
  uint64_t seed = 0;
  std::string status;         // captured, not_built, not_applicable, refused, failed
  std::string stage;          // not captured: config, build, profile, budget, run, timeout, memory, crash, output
  std::string reason;
  std::string exception;
  ProgramInfo info;           // the trace's start and end records (captured only)
  int64_t calls = 0;
  int64_t cases = 0;          // distinct op cases among the calls (filled by StoreProgram)
  int64_t unsupported_calls = 0;
  double seconds = 0;         // the tracer process, start to exit
  double peak_rss_mb = 0;
  std::string captured_at;
};

// One result of a model-level stage (table model_results): where it belongs,
// and the item's verdict as program replay gave it (Note [Stored results] in
// runs.cc).
struct ModelResultRecord {
  std::string run_id;
  std::string model_id;
  std::string profile;
  std::string stage;       // module, model, train
  std::string blocked_by;  // "<stage>:<item>" when the gate skipped it
  std::string family;
  ModelItemResult result;  // its item is the module kind, "forward", "train", or "*" when the whole stage was skipped
};

// What `MergeFrom` did.
struct MergeSummary {
  int64_t runs_added = 0;        // runs new to this registry
  int64_t results_added = 0;     // op-case results
  int64_t model_results_added = 0;
  int64_t already_present = 0;   // identical rows that were there already
  int64_t conflicts = 0;         // rows present with different content (kept as they were)
  int64_t cases_added = 0;       // op cases the source had and this registry lacked
  int64_t shards_added = 0;
  std::vector<std::string> conflict_examples;  // up to 10 "run / item: here X, there Y"
  std::vector<std::string> runs;               // the source's run ids
};

// A representative of a selection, with what the builder needs.
struct SelectedModel {
  int rank = 0;
  std::string model_id;
  std::string model_type;
  std::string features_json;  // "" when its features are missing or failed
  std::string config_json;
};

// Rows of a read-only query, as text (NULL becomes "").
struct QueryRows {
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
};

class Registry {
 public:
  // Opens or creates the registry at `path` and applies pending migrations
  // (unless read_only). Refuses a database whose schema is newer than this
  // build knows.
  static Result<std::unique_ptr<Registry>> Open(const std::string& path, const RegistryOptions& options = {});
  ~Registry();

  int schema_version() const { return schema_version_; }
  Database& db() { return *db_; }

  // Groups writes into one transaction (much faster for bulk inserts).
  Status Begin();
  Status Commit();
  Status Rollback();

  Status UpsertModel(const ModelRecord& model);
  // Inserts the case if its key is new; returns its case_id either way.
  Result<int64_t> UpsertCase(const OpCase& op_case, const CaseCost& cost);
  // Adds a provenance row or, for the same (case, model, module, profile,
  // depth), adds `call_count` to the existing one.
  Status AddCaseSource(int64_t case_id, const CaseSource& source);
  // Removes the provenance of one (model, profile) pair, before recapturing it.
  Status ClearCaseSources(const std::string& model_id, const std::string& profile);
  // Deletes cases that no capture produces any more and no run has a result
  // for (left behind by recaptures); returns how many.
  Result<int64_t> PruneOrphanCases();

  // Crawling. StoreCrawlPage writes a page's models and rejects and the next
  // page URL in one transaction: a killed crawl resumes at the next page and
  // never stores a model twice (models are upserted by id; a re-crawl
  // updates what changed and keeps a fetched config).
  Result<std::optional<CrawlState>> GetCrawl(const std::string& crawl_id);
  Status StartCrawl(const std::string& crawl_id);  // (re)starts at the first page
  Status StoreCrawlPage(const std::string& crawl_id, const std::vector<HubModelRecord>& models,
                        const std::vector<std::pair<std::string, std::string>>& rejects,  // (raw, reason)
                        const std::optional<std::string>& next_url);
  // Models listed by crawls whose config.json has not been fetched (no status
  // yet), most downloaded first.
  Result<std::vector<std::string>> ModelsWithoutConfig(int64_t limit);
  // Every model with Hub metadata (crawled), in id order, with its config
  // status ("" when none yet) and config JSON.
  Status ForEachHubModel(
      const std::function<Status(const HubModelRecord&, const std::string& config_status, const std::string& config)>&
          fn);
  // status: fetched (with the exact bytes), missing, gated or invalid (with a reason).
  Status StoreConfig(const std::string& model_id, const std::string& status, const std::string& reason,
                     const std::string& config_json);

  // Up to `limit` models with a fetched config whose id sorts after
  // `after` and that have no features of `version`, in id order (keyset
  // pagination: call again with the last id).
  Result<std::vector<ConfigRow>> ConfigsNeedingFeatures(int version, const std::string& after, int limit);
  // Replaces the features of these models, in one transaction, skipping a
  // model whose config changed since it was read (the next derivation picks
  // it up again). Returns how many rows were stored.
  Result<int64_t> StoreFeatures(const std::vector<FeatureRecord>& features);
  // Calls `fn` for every features row of `version` of a model whose config
  // status is still `fetched` (with the model's downloads), in model id
  // order; stops at the first error `fn` returns.
  Status ForEachFeature(int version, const std::function<Status(const FeatureRecord&)>& fn);
  // Stores a selection with its representatives and members in one
  // transaction; returns its selection_id. When the newest stored selection
  // is the same in every field, representative and member (a rerun of the
  // same select, e.g. after one killed once it had stored), nothing is
  // written: its id is returned and *unchanged set.
  Result<int64_t> StoreSelection(const SelectionRecord& selection, const std::vector<RepresentativeRecord>& reps,
                                 const std::vector<MemberRecord>& members, bool* unchanged = nullptr);

  // The representatives of selection `selection_id` (0: the newest) in rank
  // order. NotFound when there is no such selection.
  Result<std::vector<SelectedModel>> SelectionModels(int64_t selection_id, int64_t* resolved_id = nullptr);
  // The models `ids` names, in that order, as SelectedModel rows (rank: the
  // position, from 1); NotFound naming the first id the registry lacks.
  Result<std::vector<SelectedModel>> ModelsById(const std::vector<std::string>& ids);
  // Every model with at least one captured program, by id.
  Result<std::vector<std::string>> CapturedModelIds();

  // Replaces the results of (run, model, stage), under any profile, with
  // `items` under `profile`, in one transaction: a stage of a model is
  // stored whole or not at all.
  Status RecordModelStage(const std::string& run_id, const std::string& model_id, const std::string& profile,
                          const std::string& stage, const std::vector<ModelResultRecord>& items);
  // Ordered by model, profile, stage (module, model, train) and item; or,
  // with `as_stored`, in the order they were written.
  Result<std::vector<ModelResultRecord>> ModelResultsForRun(const std::string& run_id, bool as_stored = false);

  Result<std::vector<StoredCase>> FindCases(const CaseFilter& filter);

  // OpInfo samples (registry/opinfo.cc, schema v10). StoreOpInfo replaces
  // what was stored for (opinfo, variant, dtype), in one transaction: its
  // opinfo_imports row and its samples' calls with their op cases (a key
  // already stored is shared). Fills record->cases.
  Status StoreOpInfo(OpInfoImportRecord* record, const std::vector<OpInfoSampleCall>& calls);
  Result<std::vector<OpInfoImportRecord>> ListOpInfoImports();
  // The distinct ops ("aten::mm") of the stored op cases, sorted.
  Result<std::vector<std::string>> DistinctOps();
  Result<std::optional<StoredCase>> GetCaseByKey(const std::string& key);
  Result<int64_t> CountCases();

  // Programs (registry/programs.cc). StoreProgram replaces what was stored
  // for (record.model_id, record.profile) in one transaction: the model row
  // (a stored config is kept when `model.config_json` is empty), the
  // programs row and, when `program` is given (status captured), its values
  // and calls, their op cases (a key already stored is shared) with
  // provenance (module, profile, call count, first call index). Fills
  // record->program_id, calls, cases and unsupported_calls.
  Status StoreProgram(const ModelRecord& model, ProgramRecord* record, const Program* program);
  Result<std::optional<ProgramRecord>> GetProgramRecord(const std::string& model_id, const std::string& profile);
  Result<std::vector<ProgramRecord>> ListPrograms(const std::string& model_id = "");
  // The stored program; nullopt when the pair has no captured program.
  Result<std::optional<Program>> LoadProgram(const std::string& model_id, const std::string& profile);

  // Creates the run, or returns the stored one when `run.run_id` exists
  // (resume). Resuming with a different stage or backend is an error.
  Result<RunRecord> CreateOrResumeRun(const RunRecord& run, bool* resumed);
  Result<std::optional<RunRecord>> GetRun(const std::string& run_id);
  Status FinishRun(const std::string& run_id, const std::string& finished_at);

  // Shards (see stages/shard.h): a run spread over N processes records one
  // row per shard; a sharded run is finished when all N shards are.
  Status StartShard(const std::string& run_id, int shard_index, int shard_count, const std::string& host,
                    const std::string& started_at);
  Status FinishShard(const std::string& run_id, int shard_index, int shard_count, const std::string& finished_at);

  // Run leases: one live writer per run id, or per shard of it. In one
  // transaction, looks at the leases that overlap `mine` (the whole run
  // overlaps every shard; shards of one count overlap only at the same
  // index; shards of different counts overlap). A holder `is_live` says is
  // running wins: it is returned and nothing changes. Dead holders' leases
  // are deleted (appended to `taken_over`) and `mine` is stored: nullopt.
  Result<std::optional<RunLease>> AcquireRunLease(const RunLease& mine,
                                                  const std::function<bool(const RunLease&)>& is_live,
                                                  std::vector<RunLease>* taken_over);
  // Moves renewed_at to now; AlreadyExists when the lease is no longer `mine`'s
  // (another process took it over).
  Status RenewRunLease(const RunLease& mine);
  // Gives the lease back (no error when it is gone already).
  Status ReleaseRunLease(const RunLease& mine);

  // Marks `item` ("case:<id>", "model:<model>:<stage>") as sent to a worker;
  // recording its result clears the mark in the same transaction, so after a
  // crash of the whole run InFlight names what was running.
  Status MarkInFlight(const std::string& run_id, const std::string& item, const std::string& host, int64_t pid);
  Result<std::vector<std::string>> InFlight(const std::string& run_id);

  // Merges the runs of the registry file at `source_path` (typically shards
  // of one run, each made from a copy of this registry) into this one:
  // runs, shards, op-case results (matched by case key; cases this registry
  // lacks are copied) and model results. The source is only read (one of
  // an older schema is migrated in a temporary copy). Idempotent: rows
  // already present are left as they are, so merging twice changes nothing;
  // a `skipped` row here gives way to the source's real result (a resumed
  // shard retries skips); any other row present with different content is
  // a conflict, counted and kept. A run present in both with another stage,
  // backend or configuration (paths of config files aside) is an error, and
  // nothing is merged. One transaction.
  Result<MergeSummary> MergeFrom(const std::string& source_path);

  // Case ids that already have a final result in this run: anything but
  // `skipped`, which a resumed run retries.
  Result<std::unordered_set<int64_t>> FinishedCaseIds(const std::string& run_id);
  // Stores case `case_id`'s result in run `run_id` and clears its in-flight
  // mark, in one transaction.
  Status RecordResult(const std::string& run_id, int64_t case_id, const CaseResult& result);
  Result<std::vector<StoredResult>> ResultsForRun(const std::string& run_id);

  // Typed reads for reports (registry/reads.cc): outcomes are parsed once
  // here, and an unknown one is a Corruption naming the database, run and
  // row; no SQL outside registry/.
  // A run with its result count and shard progress; nullopt when unknown.
  Result<std::optional<RunOverview>> GetRunOverview(const std::string& run_id);
  // Finished runs of `stage` on run `run_id`'s backend (RunRecord::Identity:
  // by name, whatever path a plugin was loaded from) recorded before it in
  // this registry (Note [Run order] in reads.cc), newest first (baseline
  // candidates).
  Result<std::vector<RunOverview>> FinishedRunsBefore(const std::string& stage, const std::string& run_id);
  // Every unit result of `run_id` with its case's key, op, summary and dtypes.
  Result<std::vector<CaseResultRow>> CaseResultsForRun(const std::string& run_id);
  // The models each case with a result in either run was captured from,
  // by case id and model id.
  Result<std::vector<CaseModelRow>> CaseModelsOfRuns(const std::string& run_id, const std::string& other_run_id);
  // The OpInfos (NAME or NAME.VARIANT) whose samples make each case with a
  // result in either run: (case_id, name), by case and name.
  Result<std::vector<std::pair<int64_t, std::string>>> CaseOpInfosOfRuns(const std::string& run_id,
                                                                        const std::string& other_run_id);
  // model_type of each of `model_ids` that has one.
  Result<std::map<std::string, std::string>> ModelTypes(const std::vector<std::string>& model_ids);
  // The newest run (by start, then insertion); nullopt when there is none.
  Result<std::optional<std::string>> LatestRunId();
  // Counts of the crawl, the newest selection and the capture.
  Result<PipelineCounts> GetPipelineCounts();
  // Where the case with `key` was captured, most calls first (at most `limit`).
  Result<std::vector<CaseSourceRow>> SourcesOfCase(const std::string& key, int64_t limit);
  // The case's results in the newest runs first (at most `limit`).
  Result<std::vector<CaseRunResult>> ResultsOfCase(const std::string& key, int64_t limit);

  // Runs a query over the documented tables and views (stats, summaries).
  // `text_params` bind ?1, ?2, ... as text.
  Result<QueryRows> Query(const std::string& sql, const std::vector<std::string>& text_params = {});

 private:
  Registry(std::unique_ptr<Database> db, int version);
  std::unique_ptr<Database> db_;
  int schema_version_;
};

}  // namespace coverage::registry
