// Signatures and selection on small hand-built populations whose right
// answer is known.
#include <algorithm>
#include <set>
#include <string>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <tbb/global_control.h>

#include "selection/selection.h"
#include "selection/signature.h"

namespace coverage::selection {
namespace {

Features Decoder(int64_t hidden, int64_t layers, const std::string& type = "llama") {
  Features f;
  f.model_type = type;
  f.architecture = "LlamaForCausalLM";
  f.head = "ForCausalLM";
  f.structure = "decoder";
  f.attention = "gqa";
  f.heads = hidden / 128;
  f.kv_heads = std::max<int64_t>(1, hidden / 512);
  f.head_dim = 128;
  f.position = "rope";
  f.norm = "rmsnorm";
  f.norm_placement = "pre";
  f.activation = "silu";
  f.gated_mlp = true;
  f.hidden = hidden;
  f.layers = layers;
  f.intermediate = hidden * 3;
  f.vocab = 32000;
  f.context = 4096;
  f.dtype = "bfloat16";
  f.understood = true;
  return f;
}

Features Encoder(int64_t hidden, int64_t layers) {
  Features f;
  f.model_type = "bert";
  f.architecture = "BertForMaskedLM";
  f.head = "ForMaskedLM";
  f.structure = "encoder";
  f.attention = "mha";
  f.heads = hidden / 64;
  f.kv_heads = f.heads;
  f.head_dim = 64;
  f.position = "learned";
  f.norm = "layernorm";
  f.norm_placement = "post";
  f.activation = "gelu";
  f.hidden = hidden;
  f.layers = layers;
  f.intermediate = hidden * 4;
  f.vocab = 30522;
  f.context = 512;
  f.dtype = "float32";
  f.understood = true;
  return f;
}

TEST(Signature, BucketsAreBitWidths) {
  EXPECT_EQ(Bucket(0), 0);
  EXPECT_EQ(Bucket(-5), 0);
  EXPECT_EQ(Bucket(1), 1);
  EXPECT_EQ(Bucket(4095), 12);
  EXPECT_EQ(Bucket(4096), 13);
  EXPECT_EQ(Bucket(8191), 13);
  EXPECT_EQ(Bucket(8192), 14);
}

TEST(Signature, CoarseIgnoresDimensionsFineBucketsThem) {
  const Features a = Decoder(4096, 32), b = Decoder(5120, 40), c = Decoder(8192, 80);
  EXPECT_EQ(CoarseSignature(a), CoarseSignature(c));
  EXPECT_EQ(FineSignature(a), FineSignature(b));  // 4096/5120 and 32/40 share buckets
  EXPECT_NE(FineSignature(a), FineSignature(c));
  Features d = a;
  d.dtype = "float16";  // numerics: fine only
  EXPECT_EQ(CoarseSignature(a), CoarseSignature(d));
  EXPECT_NE(FineSignature(a), FineSignature(d));
  for (auto change : std::vector<void (*)(Features&)>{
           [](Features& f) { f.attention = "mha"; }, [](Features& f) { f.position = "alibi"; },
           [](Features& f) { f.rope_scaling = "yarn"; }, [](Features& f) { f.norm = "layernorm"; },
           [](Features& f) { f.gated_mlp = false; }, [](Features& f) { f.experts = 8; },
           [](Features& f) { f.tied_embeddings = true; }, [](Features& f) { f.sliding_window = 4096; },
           [](Features& f) { f.quantization = "gptq"; }, [](Features& f) { f.vision.hidden = 1024; },
           [](Features& f) { f.head = "ForSequenceClassification"; }}) {
    Features e = a;
    change(e);
    EXPECT_NE(CoarseSignature(a), CoarseSignature(e)) << CoarseSignature(e);
  }
  EXPECT_EQ(SignatureHash(FineSignature(a)), SignatureHash(FineSignature(b)));
  EXPECT_NE(SignatureHash(FineSignature(a)), SignatureHash(FineSignature(c)));
}

TEST(Select, RefusesBadArguments) {
  Population empty;
  EXPECT_FALSE(Select(empty, 3, 0).has_value());
  Population one;
  one.Add("a/b", 1, Decoder(4096, 32));
  auto r = Select(one, 0, 0);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("--k"), std::string::npos);
}

TEST(Select, EveryFamilyFirstThenTheFarthestPoint) {
  Population p;
  p.Add("llama/small", 900, Decoder(2048, 16));
  p.Add("llama/mid", 1000, Decoder(4096, 32));  // most downloaded llama
  p.Add("llama/huge", 10, Decoder(16384, 120));
  p.Add("llama/mid-2", 50, Decoder(4608, 32));  // close to llama/mid
  p.Add("bert/base", 500, Encoder(768, 12));
  p.Add("bert/large", 20, Encoder(1024, 24));
  ASSERT_EQ(p.coarse_signatures(), 2u);
  auto s = Select(p, 3, 0);
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  ASSERT_EQ(s->representatives.size(), 3u);
  // Phase 1: the most downloaded of each family, most downloaded family first.
  EXPECT_EQ(p.id(s->representatives[0].model), "llama/mid");
  EXPECT_EQ(p.id(s->representatives[1].model), "bert/base");
  // Phase 2: the farthest point from both is the huge llama.
  EXPECT_EQ(p.id(s->representatives[2].model), "llama/huge");
  EXPECT_GT(s->representatives[2].distance_when_chosen, 0.3);
  EXPECT_NE(s->representatives[0].reason.find("covers coarse signature"), std::string::npos);
  EXPECT_NE(s->representatives[2].reason.find("farthest"), std::string::npos);
  EXPECT_TRUE(s->warnings.empty());
}

TEST(Select, CoverageFiguresAddUp) {
  Population p;
  p.Add("llama/a", 100, Decoder(4096, 32));
  p.Add("llama/a-ft", 30, Decoder(4096, 32));    // same point as llama/a
  p.Add("llama/b", 20, Decoder(5120, 40));       // same fine signature, other point
  p.Add("llama/c", 10, Decoder(16384, 120));     // own fine signature
  p.Add("bert/a", 40, Encoder(768, 12));
  auto s = Select(p, 2, 0);  // exactly the two families
  ASSERT_TRUE(s.has_value());
  const Coverage& c = s->coverage;
  EXPECT_EQ(c.models, 5);
  EXPECT_EQ(c.distinct_points, 4);
  EXPECT_EQ(c.coarse_total, 2);
  EXPECT_EQ(c.coarse_covered, 2);
  EXPECT_EQ(c.fine_total, 3);
  EXPECT_EQ(c.fine_covered, 2);  // llama/c's signature has no representative
  EXPECT_EQ(c.downloads_total, 200);
  EXPECT_EQ(c.downloads_equivalent, 190);  // all but llama/c
  // Distances: llama/a, llama/a-ft, bert/a are 0; llama/b and llama/c are not.
  EXPECT_EQ(s->distance[0], 0.f);
  EXPECT_EQ(s->distance[1], 0.f);
  EXPECT_GT(s->distance[2], 0.f);
  EXPECT_GT(s->distance[3], s->distance[2]);
  EXPECT_FLOAT_EQ(c.max_distance, s->distance[3]);
  EXPECT_NEAR(c.mean_distance, (s->distance[2] + s->distance[3]) / 5.0, 1e-6);
  // Every model stands for exactly one representative.
  int64_t stands = 0, downloads = 0;
  for (const auto& r : s->representatives) {
    stands += r.stands_for;
    downloads += r.downloads_represented;
  }
  EXPECT_EQ(stands, 5);
  EXPECT_EQ(downloads, 200);
  EXPECT_EQ(s->representatives[s->nearest[3]].model, 0u);  // llama/c -> llama/a
  EXPECT_EQ(s->representatives[s->nearest[4]].model, 4u);  // bert/a -> itself
}

TEST(Select, FewerSlotsThanFamiliesCoverTheMostDownloadedAndSaySo) {
  Population p;
  p.Add("a/llama", 10, Decoder(4096, 32));
  p.Add("b/bert", 1000, Encoder(768, 12));
  p.Add("c/mistral", 500, Decoder(4096, 32, "mistral"));
  auto s = Select(p, 2, 0);
  ASSERT_TRUE(s.has_value());
  ASSERT_EQ(s->representatives.size(), 2u);
  EXPECT_EQ(p.id(s->representatives[0].model), "b/bert");
  EXPECT_EQ(p.id(s->representatives[1].model), "c/mistral");
  ASSERT_EQ(s->warnings.size(), 1u);
  EXPECT_NE(s->warnings[0].find("smaller than the 3 coarse signatures"), std::string::npos) << s->warnings[0];
  EXPECT_EQ(s->coverage.coarse_covered, 2);
  // The uncovered llama is assigned across signatures, at more than the cross distance.
  EXPECT_GE(s->distance[0], kCrossSignatureDistance);
}

TEST(Select, TheMostDownloadedEquivalentModelWinsAndTiesGoToTheSmallerId) {
  Population p;
  p.Add("z/same", 5, Decoder(4096, 32));
  p.Add("a/same", 5, Decoder(4096, 32));  // same downloads: smaller id wins
  auto s = Select(p, 1, 0);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(p.id(s->representatives[0].model), "a/same");

  // The farthest point's fine signature holds a more downloaded model at a
  // slightly different point: that model represents it.
  Population q;
  q.Add("base/mid", 1000, Decoder(4096, 32));
  q.Add("far/rare", 1, Decoder(16000, 127));
  q.Add("far/popular", 800, Decoder(12000, 100));  // same buckets as far/rare, closer to base/mid
  auto t = Select(q, 2, 0);
  ASSERT_TRUE(t.has_value());
  ASSERT_EQ(t->representatives.size(), 2u);
  EXPECT_EQ(FineSignature(Decoder(16000, 127)), FineSignature(Decoder(12000, 100)));
  EXPECT_EQ(q.id(t->representatives[1].model), "far/popular");
}

TEST(Select, DeterministicForASeedWhateverTheThreadCount) {
  // Over 4,096 distinct points in one coarse signature, so the parallel
  // update of the farthest-point loop runs, plus a second family.
  Population p;
  for (int i = 0; i < 12000; ++i) {
    const int64_t hidden = 128 * (1 + (i * 7919) % 97);
    const int64_t layers = 2 + (i * 104729) % 113;
    p.Add("org/m" + std::to_string(i), (i * 31) % 977, i % 7 ? Decoder(hidden, layers) : Encoder(hidden, layers));
  }
  ASSERT_GT(p.distinct_points(), 8000u);
  auto run = [&](int threads, uint64_t seed) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    auto s = Select(p, 60, seed);
    std::vector<std::string> ids;
    for (const auto& r : s->representatives) ids.emplace_back(p.id(r.model));
    return std::make_tuple(ids, s->nearest, s->distance);
  };
  const auto one = run(1, 7);
  EXPECT_EQ(one, run(8, 7));
  EXPECT_EQ(one, run(3, 7));
  EXPECT_EQ(std::set<std::string>(std::get<0>(one).begin(), std::get<0>(one).end()).size(), 60u);  // no repeats
}

TEST(Features, DerivedValuesOutOfRangeReadAsUnknownAndRoundTripThroughText) {
  auto defaults = FamilyDefaults::Load(std::string(COVERAGE_SOURCE_DIR) + "/data/transformers_defaults.jsonl");
  ASSERT_TRUE(defaults.has_value());
  // 2^40 hidden with an MLP ratio: the derived intermediate would be 2^42;
  // both are beyond Note [Dimension bounds], and the error names the field.
  auto huge = ExtractFeatures(
      std::string_view(R"({"model_type": "llama", "hidden_size": 1099511627776, "mlp_ratio": 4})"), **defaults);
  ASSERT_FALSE(huge.has_value());
  EXPECT_NE(huge.error().message().find("hidden_size is 1099511627776"), std::string::npos) << huge.error().message();
  // A width within the bound whose derived intermediate is not.
  auto derived = ExtractFeatures(
      std::string_view(R"({"model_type": "llama", "hidden_size": 1048576, "mlp_ratio": 4})"), **defaults);
  ASSERT_FALSE(derived.has_value());
  EXPECT_NE(derived.error().message().find("intermediate_size is 4194304"), std::string::npos)
      << derived.error().message();
  auto f = ExtractFeatures(std::string_view(R"({"model_type": "llama", "hidden_size": 262144, "mlp_ratio": 4})"),
                           **defaults);
  ASSERT_TRUE(f.has_value()) << f.error().ToString();
  EXPECT_EQ(f->intermediate, int64_t{1} << 20);
  // Stored as text and read back (non-negative integers come back unsigned).
  auto back = FeaturesFromJson(nlohmann::json::parse(ToJson(*f).dump()));
  ASSERT_TRUE(back.has_value()) << back.error().ToString();
  EXPECT_EQ(*back, *f);
}

TEST(Select, TheSeedOnlyBreaksExactTies) {
  // Two points at exactly the same distance from the first representative,
  // with the same downloads: which one comes second depends on the seed,
  // and only on the seed. (Contexts 3, 15 and 0 normalise exactly to
  // log2(1 + x) / 4 = 0.5, 1 and 0.)
  auto with_context = [](int64_t context) {
    Features f = Decoder(4096, 32);
    f.context = context;
    return f;
  };
  Population p;
  p.Add("center/x", 100, with_context(3));
  p.Add("tie/a", 1, with_context(15));
  p.Add("tie/b", 1, with_context(0));
  std::set<std::string> seconds;
  for (uint64_t seed = 0; seed < 16; ++seed) {
    auto s = Select(p, 2, seed);
    ASSERT_TRUE(s.has_value());
    const std::string second(p.id(s->representatives[1].model));
    EXPECT_EQ(second, std::string(p.id(Select(p, 2, seed)->representatives[1].model)));
    seconds.insert(second);
  }
  EXPECT_EQ(seconds.size(), 2u) << "seeds should pick either tied point";
}

TEST(Select, PlainFarthestPointAgreesOnAnEasyPopulation) {
  Population p;
  p.Add("l/1", 100, Decoder(4096, 32));
  p.Add("l/2", 1, Decoder(16384, 120));
  p.Add("l/3", 1, Decoder(512, 4));
  const auto plain = PlainFarthestPoint(p, 3);
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(plain[0], 0u);
  auto s = Select(p, 3, 0);
  std::set<size_t> a(plain.begin(), plain.end()), b;
  for (const auto& r : s->representatives) b.insert(r.model);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace coverage::selection
