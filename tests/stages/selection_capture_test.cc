// Capture of a selection's representatives through the model builder:
// built pairs store cases with provenance, unbuilt ones a reason, and a
// second run skips what is done.
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "registry/registry.h"
#include "stages/capture_stage.h"
#include "stages/select_stage.h"
#include "tests/support/real_models.h"
#include "tests/support/temp_dir.h"

namespace coverage::stages {
namespace {

const std::vector<std::string> kModels = {
    "optimum-intel-internal-testing/tiny-random-BloomModel",  // decoder, alibi
    "openai-community/gpt2",                                 // decoder, learned positions
    "uberkie/pypythia",                                      // decoder, parallel residual
    "deepseek-ai/DeepSeek-V4-Flash",                         // DeepSeek-V4 attention: not built
};

void Fill(registry::Registry& reg) { testing::StoreRealModels(reg, kModels); }

std::vector<runners::CaptureProfile> SmallProfiles() {
  runners::CaptureProfile prefill;
  prefill.name = "prefill";
  prefill.families = {"decoder"};
  prefill.seq_len = 16;
  runners::CaptureProfile decode = prefill;
  decode.name = "decode";
  decode.batch = 2;
  decode.seq_len = 1;
  decode.past_len = 15;
  return {prefill, decode};
}

int64_t Count(registry::Registry& reg, const std::string& sql) { return std::stoll(reg.Query(sql)->rows[0][0]); }

TEST(SelectionCapture, BuildsWhatItCanRecordsWhyNotAndResumes) {
  testing::TempDir dir;
  auto reg = registry::Registry::Open(dir.File("r.db"));
  ASSERT_TRUE(reg.has_value());
  Fill(**reg);
  // No selection yet: a clear error.
  SelectionCaptureOptions options;
  options.profiles = SmallProfiles();
  options.progress = false;
  auto none = RunSelectionCapture(**reg, options);
  ASSERT_FALSE(none.has_value());
  EXPECT_NE(none.error().message().find("coverage select"), std::string::npos);

  testing::SelectAll(**reg, 4);

  auto first = RunSelectionCapture(**reg, options);
  ASSERT_TRUE(first.has_value()) << first.error().ToString();
  EXPECT_EQ(first->representatives, 4);
  EXPECT_EQ(first->pairs_built, 6);  // three decoders x two profiles
  EXPECT_EQ(first->pairs_not_built, 2);
  EXPECT_EQ(first->pairs_failed, 0);
  EXPECT_GT(first->cases_new, 50);
  EXPECT_EQ(Count(**reg, "SELECT COUNT(*) FROM builds WHERE status = 'not_built' AND reason LIKE '%DeepSeek-V4%'"), 2);
  // Provenance: module paths of the built models.
  EXPECT_GT(Count(**reg, "SELECT COUNT(*) FROM case_sources WHERE model_id = 'openai-community/gpt2' AND "
                         "module_path = 'layers.1.mlp' AND profile = 'decode'"),
            0);
  EXPECT_EQ(Count(**reg, "SELECT built FROM v_build_coverage WHERE model_type = 'gpt2'"), 1);
  EXPECT_EQ(Count(**reg, "SELECT COUNT(*) FROM builds WHERE notes_json LIKE '%layers built%'"), 6);

  // Done pairs are skipped; --force redoes them without duplicating cases.
  auto again = RunSelectionCapture(**reg, options);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->pairs_skipped, 8);
  EXPECT_EQ(again->pairs_built, 0);
  const int64_t cases = Count(**reg, "SELECT COUNT(*) FROM op_cases");
  options.force = true;
  options.only_models = {"openai-community/gpt2"};
  auto forced = RunSelectionCapture(**reg, options);
  ASSERT_TRUE(forced.has_value());
  EXPECT_EQ(forced->pairs_built, 2);
  EXPECT_EQ(Count(**reg, "SELECT COUNT(*) FROM op_cases"), cases);

  options.only_models = {"not/a-representative"};
  auto bad = RunSelectionCapture(**reg, options);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("not/a-representative"), std::string::npos);
}

}  // namespace
}  // namespace coverage::stages
