#include "registry/schema.h"

namespace coverage::registry {
namespace {

// Version 1: op cases with provenance, minimal models, runs and results, and
// the views documented in registry/README.md.
constexpr std::string_view kV1 = R"sql(
CREATE TABLE models (
  id           TEXT PRIMARY KEY,
  model_type   TEXT,
  source       TEXT,
  config_json  TEXT,
  added_at     TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now'))
);

CREATE TABLE op_cases (
  case_id      INTEGER PRIMARY KEY,
  key          TEXT NOT NULL UNIQUE,
  op           TEXT NOT NULL,
  overload     TEXT NOT NULL,
  case_json    TEXT NOT NULL,
  case_version INTEGER NOT NULL,
  dtypes       TEXT NOT NULL,          -- ' f32 i64 ': tensor dtypes, space-delimited
  summary      TEXT NOT NULL,          -- one readable line
  flops        REAL NOT NULL DEFAULT 0,
  bytes        REAL NOT NULL DEFAULT 0,
  added_at     TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now'))
);
CREATE INDEX op_cases_op ON op_cases(op, overload);
CREATE INDEX op_cases_flops ON op_cases(flops);

CREATE TABLE case_sources (
  case_id      INTEGER NOT NULL REFERENCES op_cases(case_id) ON DELETE CASCADE,
  model_id     TEXT NOT NULL REFERENCES models(id),
  module_path  TEXT NOT NULL,
  call_site    TEXT NOT NULL,
  profile      TEXT NOT NULL,
  depth        INTEGER NOT NULL,
  call_count   INTEGER NOT NULL,
  PRIMARY KEY (case_id, model_id, module_path, profile, depth, call_site)
);
CREATE INDEX case_sources_model ON case_sources(model_id);

-- Which (model, input profile) pairs have been captured, and by which
-- builder version: capture skips pairs already done with the same version.
CREATE TABLE captures (
  model_id         TEXT NOT NULL REFERENCES models(id),
  profile          TEXT NOT NULL,
  builder_version  INTEGER NOT NULL,
  calls            INTEGER NOT NULL,
  cases            INTEGER NOT NULL,
  captured_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now')),
  PRIMARY KEY (model_id, profile)
);

CREATE TABLE runs (
  run_id           TEXT PRIMARY KEY,
  stage            TEXT NOT NULL,
  backend          TEXT NOT NULL,
  started_at       TEXT NOT NULL,
  finished_at      TEXT,
  libtorch_version TEXT,
  host             TEXT,
  git_revision     TEXT,
  config_json      TEXT
);

CREATE TABLE results (
  run_id         TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  case_id        INTEGER NOT NULL REFERENCES op_cases(case_id),
  outcome        TEXT NOT NULL,
  error          TEXT,
  max_abs_err    REAL,
  max_rel_err    REAL,
  mismatch_frac  REAL,
  cosine         REAL,
  error_ratio    REAL,
  first_call_us  REAL,
  warm_us        REAL,
  detail_json    TEXT,
  recorded_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now')),
  PRIMARY KEY (run_id, case_id)
);
CREATE INDEX results_outcome ON results(run_id, outcome);

-- How many distinct cases each op has, and from how many models.
CREATE VIEW v_cases_per_op AS
  SELECT c.op, c.overload, COUNT(DISTINCT c.case_id) AS cases,
         COUNT(DISTINCT s.model_id) AS models, COALESCE(SUM(s.call_count), 0) AS calls
  FROM op_cases c LEFT JOIN case_sources s ON s.case_id = c.case_id
  GROUP BY c.op, c.overload;

-- Outcome counts per run.
CREATE VIEW v_run_summary AS
  SELECT r.run_id, r.outcome, COUNT(*) AS cases
  FROM results r GROUP BY r.run_id, r.outcome;

-- Failing cases per op in each run (anything but pass, skipped, expected_failure).
CREATE VIEW v_failures_per_op AS
  SELECT r.run_id, c.op, c.overload, r.outcome, COUNT(*) AS cases
  FROM results r JOIN op_cases c ON c.case_id = r.case_id
  WHERE r.outcome NOT IN ('pass', 'skipped', 'expected_failure')
  GROUP BY r.run_id, c.op, c.overload, r.outcome;

-- Every result with its case, for ad-hoc queries.
CREATE VIEW v_results AS
  SELECT r.run_id, c.key, c.op, c.overload, c.summary, c.flops, r.outcome, r.error,
         r.max_abs_err, r.max_rel_err, r.mismatch_frac, r.cosine, r.error_ratio,
         r.first_call_us, r.warm_us
  FROM results r JOIN op_cases c ON c.case_id = r.case_id;

-- Failing cases per source model in each run: which models a broken op hurts.
CREATE VIEW v_failures_per_model AS
  SELECT r.run_id, s.model_id, COUNT(DISTINCT r.case_id) AS failing_cases
  FROM results r JOIN case_sources s ON s.case_id = r.case_id
  WHERE r.outcome NOT IN ('pass', 'skipped', 'expected_failure')
  GROUP BY r.run_id, s.model_id;
)sql";

// Version 2: Hub metadata of crawled models, their config status, and crawl
// progress (the next page URL is committed with each page's rows, so a killed
// crawl resumes where it stopped) and rejected entries.
constexpr std::string_view kV2 = R"sql(
ALTER TABLE models ADD COLUMN author TEXT;
ALTER TABLE models ADD COLUMN sha TEXT;
ALTER TABLE models ADD COLUMN downloads INTEGER;
ALTER TABLE models ADD COLUMN likes INTEGER;
ALTER TABLE models ADD COLUMN tags_json TEXT;           -- JSON array
ALTER TABLE models ADD COLUMN pipeline_tag TEXT;
ALTER TABLE models ADD COLUMN library_name TEXT;
ALTER TABLE models ADD COLUMN created_at TEXT;
ALTER TABLE models ADD COLUMN last_modified TEXT;
ALTER TABLE models ADD COLUMN gated TEXT;               -- 'false', 'auto', 'manual'
ALTER TABLE models ADD COLUMN private INTEGER;
ALTER TABLE models ADD COLUMN architectures_json TEXT;  -- JSON array
ALTER TABLE models ADD COLUMN config_status TEXT;       -- NULL (not fetched), fetched, missing, gated, invalid
ALTER TABLE models ADD COLUMN config_reason TEXT;
ALTER TABLE models ADD COLUMN crawled_at TEXT;
CREATE INDEX models_model_type ON models(model_type);
CREATE INDEX models_config_status ON models(config_status);

CREATE TABLE crawls (
  crawl_id    TEXT PRIMARY KEY,        -- the first page's URL: endpoint and query
  next_url    TEXT,                    -- NULL when the listing is exhausted
  pages       INTEGER NOT NULL DEFAULT 0,
  models      INTEGER NOT NULL DEFAULT 0,
  rejects     INTEGER NOT NULL DEFAULT 0,
  started_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now')),
  updated_at  TEXT
);

CREATE TABLE crawl_rejects (
  crawl_id  TEXT NOT NULL REFERENCES crawls(crawl_id) ON DELETE CASCADE,
  raw       TEXT NOT NULL,             -- the entry as received, cut to 300 characters
  reason    TEXT NOT NULL,
  at        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now'))
);

-- Crawled models per model_type and how many have their config.json.
CREATE VIEW v_models_per_type AS
  SELECT COALESCE(model_type, '') AS model_type, COUNT(*) AS models,
         SUM(config_status = 'fetched') AS configs, SUM(downloads) AS downloads
  FROM models GROUP BY COALESCE(model_type, '');
)sql";

// Version 3: architectural features of each model's config (derived by a
// numbered extractor version; a changed config drops its features through a
// trigger) and selections of representative models.
constexpr std::string_view kV3 = R"sql(
CREATE TABLE features (
  model_id      TEXT PRIMARY KEY REFERENCES models(id) ON DELETE CASCADE,
  version       INTEGER NOT NULL,      -- the feature extractor version that derived the row
  status        TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
  reason        TEXT,                  -- why extraction failed
  understood    INTEGER NOT NULL DEFAULT 0,
  features_json TEXT,                  -- selection/features.h ToJson
  coarse        TEXT,                  -- coarse signature (Note [Signatures])
  fine          TEXT,                  -- fine signature
  derived_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now'))
);
CREATE INDEX features_coarse ON features(coarse);
CREATE INDEX features_fine ON features(fine);
CREATE TRIGGER features_stale AFTER UPDATE OF config_json ON models
  WHEN OLD.config_json IS NOT NEW.config_json
  BEGIN DELETE FROM features WHERE model_id = NEW.id; END;

CREATE TABLE selections (
  selection_id    INTEGER PRIMARY KEY,
  created_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now')),
  k               INTEGER NOT NULL,
  seed            INTEGER NOT NULL,
  feature_version INTEGER NOT NULL,
  models          INTEGER NOT NULL,    -- models selected from
  coverage_json   TEXT NOT NULL,       -- coverage figures (selection/selection.h Coverage)
  warnings_json   TEXT NOT NULL        -- JSON array of strings
);

CREATE TABLE representatives (
  selection_id          INTEGER NOT NULL REFERENCES selections(selection_id) ON DELETE CASCADE,
  rank                  INTEGER NOT NULL,  -- 1 = chosen first
  model_id              TEXT NOT NULL,
  reason                TEXT NOT NULL,
  distance_when_chosen  REAL NOT NULL,
  stands_for            INTEGER NOT NULL,  -- models assigned to it, itself included
  downloads_represented INTEGER NOT NULL,
  PRIMARY KEY (selection_id, rank)
);

-- Which representative each model of a selection is assigned to.
CREATE TABLE selection_members (
  selection_id        INTEGER NOT NULL REFERENCES selections(selection_id) ON DELETE CASCADE,
  model_id            TEXT NOT NULL,
  representative_rank INTEGER NOT NULL,
  distance            REAL NOT NULL,
  PRIMARY KEY (selection_id, model_id)
) WITHOUT ROWID;

-- The newest selection's representatives with their signatures.
CREATE VIEW v_representatives AS
  SELECT r.rank, r.model_id, m.model_type, m.downloads, f.coarse, f.fine, r.stands_for,
         r.downloads_represented, r.reason
  FROM representatives r
  LEFT JOIN models m ON m.id = r.model_id
  LEFT JOIN features f ON f.model_id = r.model_id
  WHERE r.selection_id = (SELECT MAX(selection_id) FROM selections)
  ORDER BY r.rank;

-- Why feature extraction failed, per model_type.
CREATE VIEW v_feature_failures AS
  SELECT COALESCE(m.model_type, '') AS model_type, f.reason, COUNT(*) AS models
  FROM features f JOIN models m ON m.id = f.model_id
  WHERE f.status = 'failed'
  GROUP BY COALESCE(m.model_type, ''), f.reason
  ORDER BY models DESC;
)sql";

// Version 4: what the config-driven model builder did with each
// (representative, input profile): built and captured, or not built and why.
constexpr std::string_view kV4 = R"sql(
CREATE TABLE builds (
  model_id         TEXT NOT NULL,
  profile          TEXT NOT NULL,
  builder_version  INTEGER NOT NULL,
  status           TEXT NOT NULL CHECK (status IN ('built', 'not_built', 'failed')),
  reason           TEXT,              -- why not built, or the error
  family           TEXT,              -- the builder family ("decoder", ...)
  layers_built     INTEGER,
  layers_total     INTEGER,
  estimated_bytes  REAL,
  estimated_flops  REAL,
  notes_json       TEXT,              -- what the build does differently (JSON array)
  calls            INTEGER,
  cases            INTEGER,
  seconds          REAL,
  built_at         TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now')),
  PRIMARY KEY (model_id, profile)
);

-- Per model_type: how many models the builder built (in at least one profile) and how many it did not.
CREATE VIEW v_build_coverage AS
  SELECT COALESCE(m.model_type, '') AS model_type,
         COUNT(DISTINCT b.model_id) AS models,
         COUNT(DISTINCT CASE WHEN b.status = 'built' THEN b.model_id END) AS built,
         COUNT(DISTINCT CASE WHEN b.status <> 'built' THEN b.model_id END) AS not_built
  FROM builds b LEFT JOIN models m ON m.id = b.model_id
  GROUP BY COALESCE(m.model_type, '') ORDER BY models DESC;

-- Why models were not built, most common first.
CREATE VIEW v_build_failures AS
  SELECT b.status, b.reason, COUNT(DISTINCT b.model_id) AS models, MIN(b.model_id) AS example
  FROM builds b WHERE b.status <> 'built'
  GROUP BY b.status, b.reason ORDER BY models DESC;
)sql";

// Version 5: results of the model-level stages (module, model, train), one
// row per (run, model, profile, stage, item).
constexpr std::string_view kV5 = R"sql(
CREATE TABLE model_results (
  run_id       TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  model_id     TEXT NOT NULL,
  profile      TEXT NOT NULL,
  stage        TEXT NOT NULL CHECK (stage IN ('module', 'model', 'train')),
  item         TEXT NOT NULL,   -- module kind ("attention", ...), "forward", "train", or "*" for the whole stage
  outcome      TEXT NOT NULL,
  error        TEXT,            -- why not a pass; for skipped: the cost cap or what blocked it
  blocked_by   TEXT,            -- gate: "<stage>:<item>" that failed earlier, when skipped for it
  family       TEXT,
  max_abs_err  REAL,
  max_rel_err  REAL,
  cosine       REAL,
  error_ratio  REAL,
  seconds      REAL,
  detail_json  TEXT,
  recorded_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now')),
  PRIMARY KEY (run_id, model_id, profile, stage, item)
);
CREATE INDEX model_results_outcome ON model_results(run_id, stage, outcome);

-- Per run and stage: models by the outcome that stands for their stage (a
-- failing item's outcome, else skipped when an item was, else pass).
CREATE VIEW v_model_stage_outcomes AS
  WITH per_model AS (
    SELECT run_id, stage, model_id,
           COALESCE(MIN(CASE WHEN outcome NOT IN ('pass', 'skipped', 'expected_failure') THEN outcome END),
                    MIN(CASE WHEN outcome = 'skipped' THEN 'skipped' END), 'pass') AS outcome,
           COUNT(*) AS items
    FROM model_results GROUP BY run_id, stage, model_id)
  SELECT run_id, stage, outcome, COUNT(*) AS models, SUM(items) AS items
  FROM per_model GROUP BY run_id, stage, outcome ORDER BY run_id, stage, models DESC;

-- Failing items, with the module kind or check that failed.
CREATE VIEW v_model_failures AS
  SELECT r.run_id, r.stage, r.model_id, r.profile, r.item, r.outcome, r.error, r.family
  FROM model_results r
  WHERE r.outcome NOT IN ('pass', 'skipped', 'expected_failure')
  ORDER BY r.run_id, r.stage, r.model_id;
)sql";


// Version 6: isolation and sharding. Attempts of a case (reruns in fresh
// workers, flaky vs consistent), warm-latency spread and backend counters
// per result; what is in flight (marked before a case is sent to a worker,
// cleared with its result); the shards a run was spread over.
constexpr std::string_view kV6 = R"sql(
ALTER TABLE results ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1;
ALTER TABLE results ADD COLUMN flaky INTEGER NOT NULL DEFAULT 0;     -- 1: attempts disagreed
ALTER TABLE results ADD COLUMN attempt_outcomes TEXT;                -- "crash,pass" when rerun
ALTER TABLE results ADD COLUMN warm_spread_us REAL;
ALTER TABLE results ADD COLUMN counters_json TEXT;                   -- backend counters during the case
ALTER TABLE model_results ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1;
ALTER TABLE model_results ADD COLUMN flaky INTEGER NOT NULL DEFAULT 0;
ALTER TABLE model_results ADD COLUMN attempt_outcomes TEXT;

CREATE TABLE in_flight (
  run_id      TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  item        TEXT NOT NULL,   -- "case:<case_id>" or "model:<model_id>:<stage>"
  started_at  TEXT NOT NULL,
  host        TEXT,
  pid         INTEGER,         -- the process that owns the run
  PRIMARY KEY (run_id, item)
);

CREATE TABLE run_shards (
  run_id       TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  shard_index  INTEGER NOT NULL,
  shard_count  INTEGER NOT NULL,
  host         TEXT,
  started_at   TEXT NOT NULL,
  finished_at  TEXT,
  PRIMARY KEY (run_id, shard_index, shard_count)
);

-- Cases whose attempts disagreed (flaky) or were rerun, per run.
CREATE VIEW v_flaky AS
  SELECT r.run_id, c.op || CASE WHEN c.overload = '' THEN '' ELSE '.' || c.overload END AS op, c.key,
         r.outcome, r.attempts, r.attempt_outcomes, r.error
  FROM results r JOIN op_cases c ON c.case_id = r.case_id
  WHERE r.flaky = 1
  ORDER BY r.run_id, op, c.key;
)sql";


// Version 7: programs captured from the real models by the capture tracer
// (capture/tracer/README.md): per (model, profile) the outcome of the trace
// and, when captured, every value the program starts from and every call in
// dispatch order with its op case, the value ids it reads and writes, its
// module path and phase. case_sources gain the first call index of each
// (case, model, module, profile).
constexpr std::string_view kV7 = R"sql(
ALTER TABLE case_sources ADD COLUMN first_call INTEGER;  -- program call index; NULL for builder captures

CREATE TABLE programs (
  program_id        INTEGER PRIMARY KEY,
  model_id          TEXT NOT NULL,
  profile           TEXT NOT NULL,
  tracer_version    INTEGER NOT NULL,
  max_layers        INTEGER NOT NULL,
  config_sha256     TEXT NOT NULL,      -- of the config text traced; a changed config is traced again
  max_gb            REAL NOT NULL,      -- the CPU-run budget it was traced with (a refusal is retried with more)
  device_option     TEXT NOT NULL,      -- --device: auto, meta or cpu
  seed              INTEGER NOT NULL,
  status            TEXT NOT NULL CHECK (status IN ('captured', 'not_built', 'not_applicable', 'refused', 'failed')),
  stage             TEXT,               -- why not captured: config, build, profile, budget, run, timeout, memory, crash, output
  reason            TEXT,               -- the library's own message, or what happened to the tracer
  exception         TEXT,               -- the Python exception type
  class_name        TEXT,
  model_type        TEXT,
  kind              TEXT,               -- decoder, encoder, encoder-decoder, vision, conv, speech, hybrid, ssm, multimodal
  device            TEXT,               -- meta or cpu
  fallback          TEXT,               -- why a meta run was redone on cpu (JSON)
  attn_implementation TEXT,
  dtype             TEXT,
  layers_json       TEXT,               -- {"num_hidden_layers": {"kept": 2, "of": 22}}
  torch_version     TEXT,
  transformers_version TEXT,
  calls             INTEGER NOT NULL DEFAULT 0,
  cases             INTEGER NOT NULL DEFAULT 0,   -- distinct op cases among the calls
  unsupported_calls INTEGER NOT NULL DEFAULT 0,   -- calls with an argument no op case can hold
  value_count       INTEGER NOT NULL DEFAULT 0,
  estimated_gb      REAL,
  seconds           REAL,               -- the tracer process, start to exit
  peak_rss_mb       REAL,
  captured_at       TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now')),
  UNIQUE (model_id, profile)
);

CREATE TABLE program_values (
  program_id   INTEGER NOT NULL REFERENCES programs(program_id) ON DELETE CASCADE,
  value_id     INTEGER NOT NULL,
  kind         TEXT NOT NULL,           -- parameter, buffer, input, constant
  name         TEXT NOT NULL,
  tensor_json  TEXT,                    -- dtype, shape, strides, offset, domain; NULL when unsupported
  init_json    TEXT,                    -- parameters and buffers: the init rule
  scalar_json  TEXT,                    -- constants made from a Python number
  unsupported  TEXT,
  PRIMARY KEY (program_id, value_id)
) WITHOUT ROWID;

CREATE TABLE program_calls (
  program_id   INTEGER NOT NULL REFERENCES programs(program_id) ON DELETE CASCADE,
  call_index   INTEGER NOT NULL,
  case_id      INTEGER REFERENCES op_cases(case_id),  -- NULL when unsupported
  op           TEXT NOT NULL,
  overload     TEXT NOT NULL,
  inputs       TEXT NOT NULL,           -- JSON array: value id of each tensor argument / list item (-1: absent)
  outputs      TEXT NOT NULL,           -- JSON array: value id of each return (-1: not a tensor)
  module       TEXT NOT NULL,
  phase        TEXT NOT NULL,           -- forward, backward, optimizer
  unsupported  TEXT,
  PRIMARY KEY (program_id, call_index)
) WITHOUT ROWID;
CREATE INDEX program_calls_case ON program_calls(case_id);

-- Per model_type: models the tracer was run on, captured (in at least one
-- profile), and not captured in any.
CREATE VIEW v_capture_coverage AS
  WITH per_model AS (
    SELECT p.model_id, COALESCE(NULLIF(p.model_type, ''), m.model_type, '') AS model_type,
           MAX(p.status = 'captured') AS captured
    FROM programs p LEFT JOIN models m ON m.id = p.model_id GROUP BY p.model_id)
  SELECT model_type, COUNT(*) AS models, SUM(captured) AS captured, COUNT(*) - SUM(captured) AS not_captured
  FROM per_model GROUP BY model_type ORDER BY models DESC;

-- Why (model, profile) pairs were not captured, most common first.
CREATE VIEW v_capture_failures AS
  SELECT status, stage, reason, COUNT(*) AS pairs, COUNT(DISTINCT model_id) AS models, MIN(model_id) AS example
  FROM programs WHERE status NOT IN ('captured', 'not_applicable')
  GROUP BY status, stage, reason ORDER BY pairs DESC;

-- Where each op case is called: model, profile, module and call index.
CREATE VIEW v_case_calls AS
  SELECT c.key, c.op || CASE WHEN c.overload = '' THEN '' ELSE '.' || c.overload END AS op,
         p.model_id, p.profile, pc.module, pc.phase, pc.call_index
  FROM program_calls pc JOIN programs p ON p.program_id = pc.program_id JOIN op_cases c ON c.case_id = pc.case_id;
)sql";

// Version 8: the config-driven model builder retired with the model families
// (the model stages replay captured programs): its bookkeeping goes. The
// op cases it captured stay, with their provenance in case_sources.
constexpr std::string_view kV8 = R"sql(
DROP VIEW IF EXISTS v_build_coverage;
DROP VIEW IF EXISTS v_build_failures;
DROP TABLE IF EXISTS builds;
DROP TABLE IF EXISTS captures;
)sql";

// Version 9: one live writer per run id (and shard). A stage run takes the
// lease of (run, shard) before it writes and gives it back when it ends; a
// lease left by a killed process is taken over (stages/stage_run.cc, Note
// [Run leases]). Leases are this file's own: merge does not copy them.
constexpr std::string_view kV9 = R"sql(
CREATE TABLE run_leases (
  run_id        TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  shard_index   INTEGER NOT NULL,       -- 0 with shard_count 0: the whole run
  shard_count   INTEGER NOT NULL,
  host          TEXT NOT NULL,
  pid           INTEGER NOT NULL,
  process_start INTEGER NOT NULL,       -- the holder's start time (clock ticks after boot): a reused pid is not the holder
  acquired_at   TEXT NOT NULL,
  renewed_at    TEXT NOT NULL,          -- a holder on another host is dead when this is older than the lease's life
  PRIMARY KEY (run_id, shard_index, shard_count)
) WITHOUT ROWID;
)sql";

// Version 10: op cases from PyTorch's OpInfo samples (`coverage import
// opinfo`, capture/opinfo_import.h). A case's sources are then its captured
// calls (case_sources), its OpInfo samples (opinfo_samples) or both; one
// opinfo_imports row per (OpInfo, dtype) imported or skipped, so an
// interrupted import resumes after the last one stored.
constexpr std::string_view kV10 = R"sql(
CREATE TABLE opinfo_imports (
  opinfo        TEXT NOT NULL,              -- the OpInfo's name, e.g. softmax
  variant       TEXT NOT NULL,              -- its variant_test_name, '' for none
  dtype         TEXT NOT NULL,              -- the dtype its samples were made for: f32, bf16, ...
  status        TEXT NOT NULL,              -- imported, skipped
  reason        TEXT NOT NULL DEFAULT '',   -- skipped: why (the dtype is unsupported, making samples raised)
  samples       INTEGER NOT NULL DEFAULT 0,
  failed        INTEGER NOT NULL DEFAULT 0, -- samples that raised on CPU (nothing stored from them)
  calls         INTEGER NOT NULL DEFAULT 0, -- calls of the kept ops, over all samples
  cases         INTEGER NOT NULL DEFAULT 0, -- distinct op cases among them
  torch_version TEXT NOT NULL DEFAULT '',
  imported_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ','now')),
  PRIMARY KEY (opinfo, variant, dtype)
) WITHOUT ROWID;

CREATE TABLE opinfo_samples (
  case_id      INTEGER NOT NULL REFERENCES op_cases(case_id) ON DELETE CASCADE,
  opinfo       TEXT NOT NULL,
  variant      TEXT NOT NULL,
  dtype        TEXT NOT NULL,
  sample       INTEGER NOT NULL,            -- index among the OpInfo's samples for the dtype
  sample_name  TEXT NOT NULL,               -- SampleInput.name, often ''
  call_index   INTEGER NOT NULL,            -- the call within the sample
  PRIMARY KEY (opinfo, variant, dtype, sample, call_index)
) WITHOUT ROWID;
CREATE INDEX opinfo_samples_case ON opinfo_samples(case_id);

-- Op cases by source: captured from a model, an OpInfo sample, or both.
CREATE VIEW v_case_source_kinds AS
  SELECT c.case_id, c.key, c.op, c.overload,
         EXISTS (SELECT 1 FROM case_sources s WHERE s.case_id = c.case_id) AS captured,
         EXISTS (SELECT 1 FROM opinfo_samples o WHERE o.case_id = c.case_id) AS opinfo
  FROM op_cases c;
)sql";

// Version 11: runs in an unambiguous order (Note [Run order] in
// registry/reads.cc), and each result's fastest warm call, which performance
// is judged on (Note [Fastest calls] in reports/build.cc). seq numbers the runs in the order this registry
// recorded them; a trigger gives each new row the next number, whatever
// inserts it (a stage, a merge). Runs stored before are numbered by their
// start, then by the order of their rows.
constexpr std::string_view kV11 = R"sql(
ALTER TABLE results ADD COLUMN warm_min_us REAL;  -- the fastest warm call: Note [Fastest calls] in reports/build.cc
ALTER TABLE runs ADD COLUMN seq INTEGER;
UPDATE runs SET seq = (SELECT COUNT(*) FROM runs o WHERE o.started_at < runs.started_at OR
                       (o.started_at = runs.started_at AND o.rowid <= runs.rowid));
CREATE UNIQUE INDEX runs_seq ON runs(seq);
CREATE TRIGGER runs_next_seq AFTER INSERT ON runs WHEN NEW.seq IS NULL
BEGIN
  UPDATE runs SET seq = (SELECT COALESCE(MAX(seq), 0) + 1 FROM runs) WHERE rowid = NEW.rowid;
END;
)sql";

// Version 12: a call recorded whole (a composite that picks its kernel by
// device, capture/tracer/coverage_tracer/composites.py) keeps the names of
// the calls the trace device made for it.
constexpr std::string_view kV12 = R"sql(
ALTER TABLE program_calls ADD COLUMN decomposition TEXT;  -- JSON array of op names; NULL for other calls
)sql";

// Version 13: the tracer cuts mixture-of-experts layers to --max-experts
// experts (capture/tracer/README.md, Experts); a program records the cut it
// was traced with, so another cut traces it again. Programs stored before
// kept every expert.
constexpr std::string_view kV13 = R"sql(
ALTER TABLE programs ADD COLUMN max_experts INTEGER NOT NULL DEFAULT 0;  -- --max-experts; 0: every expert
)sql";

// Version 14: a run records the backend as baselines know it (its name, and
// for a plugin the device's name rather than the library's path, so moving
// the library keeps its baseline) and the version of its software stack
// (a plugin's coverage_backend_version). Older runs have neither: their
// backend column is their identity.
constexpr std::string_view kV14 = R"sql(
ALTER TABLE runs ADD COLUMN backend_name TEXT;     -- "cpu", "sim", "privateuse1:<device name>"
ALTER TABLE runs ADD COLUMN backend_version TEXT;  -- "" when the backend gives none
)sql";

}  // namespace

const std::vector<Migration>& Migrations() {
  static const std::vector<Migration> kMigrations = {
      {1, "op cases, provenance, models, runs, results, views", kV1},
      {2, "Hub metadata of models, config status, crawl progress and rejects", kV2},
      {3, "features of model configs, selections of representatives", kV3},
      {4, "what the model builder built, per model and profile", kV4},
      {5, "results of the module, model and train stages", kV5},
      {6, "attempts, flakiness, counters; cases in flight; shards of a run", kV6},
      {7, "programs captured from the real models: values, calls, provenance by call", kV7},
      {8, "the retired model builder's builds and captures dropped", kV8},
      {9, "one live writer per run and shard: run leases", kV9},
      {10, "op cases from PyTorch's OpInfo samples", kV10},
      {11, "runs in the order they were recorded; the fastest warm call of each result", kV11},
      {12, "the trace device's decomposition of calls recorded whole", kV12},
      {13, "the expert cut a program was traced with", kV13},
      {14, "a run's backend by name and version", kV14},
  };
  return kMigrations;
}

int LatestSchemaVersion() { return Migrations().back().version; }

}  // namespace coverage::registry
