// The capture driver without Python: TraceReader on hand-written records,
// and RunTracerCapture against a fake tracer (a shell script standing in for
// the interpreter) that traces, crashes, hangs, errs or prints garbage; the
// tracer server (Note [Tracer server]) against the real tracer package.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "capture/trace_reader.h"
#include "capture/tracer_capture.h"
#include "capture/tracer_process.h"
#include "registry/registry.h"
#include "tests/support/temp_dir.h"

namespace coverage::capture {
namespace {

const char* kStart =
    R"({"type":"start","tracer_version":1,"model":"m","profile":"p","class":"LlamaForCausalLM","model_type":"llama","kind":"decoder","torch":"2.13.0","transformers":"5.18.0","device":"meta","layers":{"num_hidden_layers":{"kept":2,"of":22}},"attn_implementation":"sdpa","dtype":"f32","estimated_gb":0.5})";
const char* kValue0 =
    R"({"type":"value","id":0,"kind":"parameter","name":"w","tensor":{"dtype":"f32","shape":[4,8],"strides":[8,1],"storage_offset":0},"init":{"rule":"normal","mean":0.0,"std":0.02}})";
const char* kValue1 =
    R"({"type":"value","id":1,"kind":"input","name":"input_ids","tensor":{"dtype":"i64","shape":[1,3],"strides":[3,1],"storage_offset":0},"domain":{"kind":"integer","lo":0,"hi":4}})";
const char* kCall0 =
    R"({"type":"call","index":0,"op":"aten::embedding","overload":"","args":[{"name":"weight","kind":"tensor","value":0,"tensor":{"dtype":"f32","shape":[4,8],"strides":[8,1],"storage_offset":0}},{"name":"indices","kind":"tensor","value":1,"tensor":{"dtype":"i64","shape":[1,3],"strides":[3,1],"storage_offset":0},"domain":{"kind":"integer","lo":0,"hi":4}},{"name":"padding_idx","kind":"int","i":-1},{"name":"scale_grad_by_freq","kind":"bool","b":false},{"name":"sparse","kind":"bool","b":false}],"outputs":[{"value":2,"tensor":{"dtype":"f32","shape":[1,3,8],"strides":[24,8,1],"storage_offset":0}}],"module":"model.embed_tokens","phase":"forward"})";
const char* kCall1 =
    R"({"type":"call","index":1,"op":"aten::mul","overload":"Scalar","args":[{"name":"self","kind":"tensor","value":2,"tensor":{"dtype":"f32","shape":[1,3,8],"strides":[24,8,1],"storage_offset":0}},{"name":"other","kind":"double","d":"inf"}],"outputs":[{"value":3,"tensor":{"dtype":"f32","shape":[1,3,8],"strides":[24,8,1],"storage_offset":0}}],"module":"model","phase":"forward","decomposition":["aten::mul.Tensor","aten::_to_copy"]})";
const char* kCall2 =
    R"({"type":"call","index":2,"op":"aten::normal_","overload":"","unsupported":"argument generator: a Generator","outputs":[{"value":3,"tensor":{"dtype":"f32","shape":[1,3,8],"strides":[24,8,1],"storage_offset":0}}],"module":"model","phase":"forward"})";
const char* kEnd = R"({"type":"end","calls":3,"values":4,"seconds":1.5,"peak_rss_mb":300})";

Result<TraceOutcome> Read(const std::vector<std::string>& lines) {
  TraceReader reader;
  for (const auto& l : lines) COV_RETURN_IF_ERROR(reader.Feed(l));
  return reader.Finish();
}

TEST(TraceReaderTest, ReadsAProgram) {
  auto out = Read({kStart, kValue0, kValue1, kCall0, kCall1, kCall2, kEnd});
  ASSERT_TRUE(out) << out.error().message();
  ASSERT_TRUE(out->program);
  const Program& p = *out->program;
  EXPECT_EQ(p.info.class_name, "LlamaForCausalLM");
  EXPECT_EQ(p.info.device, "meta");
  EXPECT_EQ(p.info.layers_json, R"({"num_hidden_layers":{"kept":2,"of":22}})");
  ASSERT_EQ(p.values.size(), 2u);
  EXPECT_EQ(p.values[0].init.dump(), R"({"mean":0.0,"rule":"normal","std":0.02})");
  EXPECT_EQ(p.values[1].tensor->domain.kind, ValueDomain::Kind::kInteger);
  EXPECT_EQ(p.values[1].tensor->domain.hi, 4);
  ASSERT_EQ(p.calls.size(), 3u);
  const ProgramCall& emb = p.calls[0];
  ASSERT_TRUE(emb.op_case);
  EXPECT_EQ(emb.inputs, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(emb.outputs, (std::vector<int64_t>{2}));
  EXPECT_EQ(emb.module, "model.embed_tokens");
  EXPECT_EQ(emb.op_case->args.size(), 5u);
  EXPECT_EQ(emb.op_case->args[1].tensor.domain.lo, 0);
  EXPECT_EQ(emb.op_case->args[2].i, -1);
  EXPECT_TRUE(std::isinf(p.calls[1].op_case->args[1].d));
  EXPECT_EQ(p.calls[1].op_case->overload, "Scalar");
  // A call recorded whole names the trace device's calls for it.
  EXPECT_EQ(p.calls[1].decomposition, (std::vector<std::string>{"aten::mul.Tensor", "aten::_to_copy"}));
  EXPECT_TRUE(p.calls[0].decomposition.empty());
  EXPECT_FALSE(p.calls[2].op_case);
  EXPECT_EQ(p.calls[2].unsupported, "argument generator: a Generator");
  EXPECT_EQ(p.calls[2].outputs, (std::vector<int64_t>{3}));
}

TEST(TraceReaderTest, ReadsAnErrorRecord) {
  auto out = Read({R"({"type":"error","stage":"config","reason":"unknown model type `nope`","exception":"ValueError"})"});
  ASSERT_TRUE(out);
  ASSERT_TRUE(out->error);
  EXPECT_EQ(out->error->stage, "config");
  EXPECT_EQ(out->error->exception, "ValueError");
  EXPECT_EQ(StatusForStage("config"), "not_built");
  EXPECT_EQ(StatusForStage("profile"), "not_applicable");
  EXPECT_EQ(StatusForStage("budget"), "refused");
  EXPECT_EQ(StatusForStage("run"), "failed");
}

// Found by fuzz/op_case.cc: sizes whose product overflows int64 made every
// later Numel()/StorageNumel() (cost estimates, footprints) undefined.
TEST(TraceReaderTest, RefusesTensorsWhoseSizeOverflows) {
  auto huge = Read({kStart,
                    R"({"type":"value","id":0,"kind":"input","name":"x","tensor":{"dtype":"f32","shape":[4294967296,4294967296],"strides":[1,1],"storage_offset":0}})"});
  ASSERT_FALSE(huge);
  EXPECT_EQ(huge.error().code(), StatusCode::kCorruption);
  EXPECT_NE(huge.error().message().find("overflows 64 bits"), std::string::npos) << huge.error().message();
  auto far = Read({kStart,
                   R"({"type":"value","id":0,"kind":"input","name":"x","tensor":{"dtype":"f32","shape":[3],"strides":[4611686018427387904],"storage_offset":0}})"});
  ASSERT_FALSE(far);
  EXPECT_NE(far.error().message().find("overflows 64 bits"), std::string::npos) << far.error().message();
}

TEST(TraceReaderTest, RefusesWhatIsNotATrace) {
  auto cut = Read({kStart, kValue0, kValue1, kCall0});
  ASSERT_FALSE(cut);
  EXPECT_NE(cut.error().message().find("without an 'end' record"), std::string::npos);
  auto garbage = Read({kStart, "Loading weights..."});
  ASSERT_FALSE(garbage);
  EXPECT_NE(garbage.error().message().find("line 2: not a JSON record"), std::string::npos);
  auto skipped = Read({kStart, kValue0, kValue1, kCall1});
  ASSERT_FALSE(skipped);
  EXPECT_NE(skipped.error().message().find("call index 1 where 0 was expected"), std::string::npos);
  auto count = Read({kStart, kValue0, kValue1, kCall0, R"({"type":"end","calls":5,"values":3})"});
  ASSERT_FALSE(count);
  EXPECT_NE(count.error().message().find("counts 5 calls but 1 were read"), std::string::npos);
  auto field = Read({kStart, R"({"type":"value","id":"x","kind":"input"})"});
  ASSERT_FALSE(field);
  EXPECT_NE(field.error().message().find("line 2.id: expected a whole number"), std::string::npos);
  std::string bad_decomposition = kCall0;
  bad_decomposition.insert(bad_decomposition.size() - 1, R"(,"decomposition":"aten::mm")");
  auto decomposition = Read({kStart, kValue0, kValue1, bad_decomposition});
  ASSERT_FALSE(decomposition);
  EXPECT_NE(decomposition.error().message().find("decomposition: expected an array of strings"), std::string::npos)
      << decomposition.error().message();
  auto version = Read({R"({"type":"start","tracer_version":99})"});
  ASSERT_FALSE(version);
  EXPECT_NE(version.error().message().find("tracer_version 99"), std::string::npos);
  EXPECT_FALSE(Read({}));
}

// Tracer version 2: a Python number passed for a Tensor argument is a
// constant domain with its value (version 1 programs are still read: kStart).
TEST(TraceReaderTest, APythonNumberForATensorIsAConstantCase) {
  const std::string value =
      R"({"type":"value","id":4,"kind":"constant","name":"","scalar":{"kind":"double","d":0.99999},"tensor":{"dtype":"f64","shape":[],"strides":[],"storage_offset":0},"domain":{"kind":"positive"}})";
  const std::string call =
      R"({"type":"call","index":3,"op":"aten::mul_","overload":"Tensor","args":[{"name":"self","kind":"tensor","value":3,"tensor":{"dtype":"f32","shape":[1,3,8],"strides":[24,8,1],"storage_offset":0}},{"name":"other","kind":"tensor","value":4,"tensor":{"dtype":"f64","shape":[],"strides":[],"storage_offset":0},"domain":{"kind":"constant","value":0.99999}}],"outputs":[{"value":3,"tensor":{"dtype":"f32","shape":[1,3,8],"strides":[24,8,1],"storage_offset":0}}],"module":"","phase":"optimizer"})";
  auto out = Read({kStart, kValue0, kValue1, kCall0, kCall1, kCall2, value, call,
                   R"({"type":"end","calls":4,"values":5})"});
  ASSERT_TRUE(out) << out.error().message();
  const ProgramCall& mul = out->program->calls[3];
  ASSERT_TRUE(mul.op_case);
  const ValueDomain& d = mul.op_case->args[1].tensor.domain;
  EXPECT_EQ(d.kind, ValueDomain::Kind::kConstant);
  EXPECT_EQ(d.value, 0.99999);
  EXPECT_NE(mul.op_case->Summary().find("f64[]=0.99999"), std::string::npos) << mul.op_case->Summary();
  auto missing = Read({kStart, kValue0, kValue1, kCall0, kCall1, kCall2, value,
                       std::string(call).replace(call.find(R"(,"value":0.99999)"), 16, "")});
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message().find("domain.value: missing"), std::string::npos) << missing.error().message();
}

// A fake interpreter: `python -m coverage_tracer --config - --profile P --model-id M ...`
// behaves by profile (and model id), and logs every start to calls.log.
class FakeTracerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_.File("pkg/coverage_tracer"));
    std::ofstream(dir_.File("pkg/coverage_tracer/__main__.py")) << "";
    python_ = dir_.File("python");
    std::ofstream script(python_);
    script << "#!/bin/bash\n"
              "for a in \"$@\"; do [ \"$a\" = --serve ] && exec sleep 600; done  # a warm tracer that hangs\n"
              "profile=''; model=''\n"
              "while [ $# -gt 0 ]; do case $1 in --profile) profile=$2; shift;; --model-id) model=$2; shift;; esac; shift; done\n"
              "cat > /dev/null\n"
              "echo \"$model/$profile\" >> " << dir_.File("calls.log") << "\n"
              "start='{\"type\":\"start\",\"tracer_version\":1,\"model\":\"'$model'\",\"profile\":\"'$profile'\",\"class\":\"C\",\"kind\":\"decoder\",\"device\":\"meta\"}'\n"
              "case $model in broken*) echo '{\"type\":\"error\",\"stage\":\"build\",\"reason\":\"The hidden size (50) is not a multiple of the number of attention heads (3)\",\"exception\":\"ValueError\"}'; exit 3;; esac\n"
              "case $profile in\n"
              "  ok) echo \"$start\"; echo '" << kValue0 << "'; echo '" << kValue1 << "'; echo '" << kCall0 << "'\n"
              "      echo '" << kCall1 << "'; echo '" << kCall2 << "'; echo '" << kEnd << "';;\n"
              "  crash) echo 'Fatal Python error: Segmentation fault' >&2; kill -SEGV $$;;\n"
              "  hang) echo \"$start\"; exec sleep 600;;\n"
              "  garbage) echo 'hello'; exit 0;;\n"
              "  cut) echo \"$start\"; echo '" << kValue0 << "'; exit 1;;\n"
              "  memory) exec python3 -c 'import time; x = bytearray(400_000_000); time.sleep(60)';;\n"
              "  raises) echo '{\"type\":\"error\",\"stage\":\"run\",\"reason\":\"index out of range\",\"exception\":\"IndexError\"}'; exit 3;;\n"
              "  budget) echo '{\"type\":\"error\",\"stage\":\"budget\",\"reason\":\"needs 5 GB\"}'; exit 3;;\n"
              "  wrongkind) echo '{\"type\":\"error\",\"stage\":\"profile\",\"reason\":\"profile wrongkind applies to multimodal models; CLIPForImageClassification is a model of kind vision\"}'; exit 3;;\n"
              "  usage) echo 'python -m coverage_tracer: error: --max-gb must be positive' >&2; exit 2;;\n"
              "esac\n";
    script.close();
    chmod(python_.c_str(), 0755);
    auto reg = registry::Registry::Open(dir_.File("r.db"));
    ASSERT_TRUE(reg) << reg.error().message();
    registry_ = std::move(*reg);
  }

  TracerCaptureOptions Options(std::vector<std::string> profiles, std::vector<std::string> models = {"m"}) {
    TracerCaptureOptions o;
    for (const auto& id : models) o.models.push_back({id, "llama", "test", R"({"model_type":"llama"})", ""});
    for (const auto& p : profiles) o.profiles.push_back({p, {"decoder"}});
    o.tracer.python = python_;
    o.tracer.package_dir = dir_.File("pkg");
    o.tracer.timeout_s = 3;
    o.tracer.server = false;  // the fake is an interpreter per pair; the server is tested on the real tracer below
    o.progress = false;
    return o;
  }

  int Starts() {
    std::ifstream in(dir_.File("calls.log"));
    int n = 0;
    std::string line;
    while (std::getline(in, line)) ++n;
    return n;
  }

  testing::TempDir dir_;
  std::string python_;
  std::unique_ptr<registry::Registry> registry_;
};

// A warm tracer that never gets ready costs its job one bounded wait (10 s
// for a --timeout under that), then every pair runs in a fresh interpreter
// under its own deadline; before, each pair waited 60 s for the server.
TEST_F(FakeTracerTest, AWarmTracerThatHangsCostsOneWaitThenPairsKeepTheirDeadline) {
  TracerCaptureOptions o = Options({"ok", "hang", "cut"});
  o.tracer.server = true;
  o.tracer.timeout_s = 2;
  o.jobs = 1;
  const auto start = std::chrono::steady_clock::now();
  auto s = RunTracerCapture(*registry_, o);
  ASSERT_TRUE(s) << s.error().message();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 20) << "10 s for the server, 2 s for the hanging pair";
  EXPECT_EQ(s->captured, 1);
  auto hang = registry_->GetProgramRecord("m", "hang");
  ASSERT_TRUE(hang && *hang);
  EXPECT_EQ((*hang)->status + "/" + (*hang)->stage, "failed/timeout");
}

TEST_F(FakeTracerTest, EachFailureCostsOnlyItsPair) {
  TracerCaptureOptions o = Options({"ok", "crash", "hang", "garbage", "cut"});
  o.jobs = 2;
  const auto start = std::chrono::steady_clock::now();
  auto s = RunTracerCapture(*registry_, o);
  ASSERT_TRUE(s) << s.error().message();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30);
  EXPECT_EQ(s->captured, 1);
  EXPECT_EQ(s->failed, 4);
  EXPECT_FALSE(s->interrupted);
  const auto status = [&](const std::string& profile) {
    auto r = registry_->GetProgramRecord("m", profile);
    EXPECT_TRUE(r && *r) << profile;
    return (r && *r) ? (*r)->status + "/" + (*r)->stage : std::string();
  };
  EXPECT_EQ(status("ok"), "captured/");
  EXPECT_EQ(status("crash"), "failed/crash");
  EXPECT_EQ(status("hang"), "failed/timeout");
  EXPECT_EQ(status("garbage"), "failed/output");
  EXPECT_EQ(status("cut"), "failed/crash");
  auto crash = registry_->GetProgramRecord("m", "crash");
  EXPECT_NE((*crash)->reason.find("SIGSEGV"), std::string::npos) << (*crash)->reason;
  EXPECT_NE((*crash)->reason.find("Segmentation fault"), std::string::npos) << (*crash)->reason;
  auto hang = registry_->GetProgramRecord("m", "hang");
  EXPECT_LT((*hang)->seconds, 10);

  // The captured program reads back as it was traced; its cases have provenance.
  auto program = registry_->LoadProgram("m", "ok");
  ASSERT_TRUE(program && *program);
  const Program& p = **program;
  ASSERT_EQ(p.calls.size(), 3u);
  EXPECT_EQ(p.calls[0].op, "aten::embedding");
  EXPECT_EQ(p.calls[0].inputs, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p.calls[0].module, "model.embed_tokens");
  EXPECT_FALSE(p.calls[2].op_case);
  EXPECT_EQ(p.calls[1].decomposition, (std::vector<std::string>{"aten::mul.Tensor", "aten::_to_copy"}));
  EXPECT_TRUE(p.calls[0].decomposition.empty());
  EXPECT_EQ(p.values.size(), 2u);
  EXPECT_EQ(p.values[1].name, "input_ids");
  EXPECT_EQ(p.values[1].tensor->domain.hi, 4);
  EXPECT_EQ(p.info.class_name, "C");
  auto sources = registry_->Query(
      "SELECT module_path, first_call, call_count FROM case_sources WHERE model_id = 'm' ORDER BY first_call");
  ASSERT_TRUE(sources);
  ASSERT_EQ(sources->rows.size(), 2u);
  EXPECT_EQ(sources->rows[0], (std::vector<std::string>{"model.embed_tokens", "0", "1"}));
  EXPECT_EQ(sources->rows[1], (std::vector<std::string>{"model", "1", "1"}));
  auto rec = registry_->GetProgramRecord("m", "ok");
  EXPECT_EQ((*rec)->cases, 2);
  EXPECT_EQ((*rec)->unsupported_calls, 1);

  // A value's init record is parsed once as the program is read: a row
  // that is not JSON is named, never replayed with a default.
  ASSERT_TRUE(registry_->Query("UPDATE program_values SET init_json = '{\"rule\":' WHERE value_id = 0").has_value());
  auto broken = registry_->LoadProgram("m", "ok");
  ASSERT_FALSE(broken.has_value());
  EXPECT_EQ(broken.error().code(), StatusCode::kCorruption);
  EXPECT_NE(broken.error().message().find("value 0: its init record is not JSON"), std::string::npos)
      << broken.error().ToString();
}

TEST_F(FakeTracerTest, ResumesAndRetracesOnlyWhatChanged) {
  TracerCaptureOptions o = Options({"ok", "crash", "raises"});
  ASSERT_TRUE(RunTracerCapture(*registry_, o));
  EXPECT_EQ(Starts(), 3);
  auto again = RunTracerCapture(*registry_, o);
  ASSERT_TRUE(again);
  // What the model's library said stands; a crashed tracer says nothing
  // about the model and is traced again (before: "done before", exit 0).
  EXPECT_EQ(again->skipped, 2);
  EXPECT_EQ(Starts(), 4);
  auto cases = registry_->CountCases();
  ASSERT_TRUE(cases);
  // A changed config is traced again; provenance is replaced, not added to.
  o.models[0].config_json = R"({"model_type":"llama","hidden_size":8})";
  auto changed = RunTracerCapture(*registry_, o);
  ASSERT_TRUE(changed);
  EXPECT_EQ(changed->skipped, 0);
  EXPECT_EQ(Starts(), 7);
  EXPECT_EQ(*registry_->CountCases(), *cases);
  auto calls = registry_->Query("SELECT SUM(call_count) FROM case_sources");
  EXPECT_EQ(calls->rows[0][0], "2");
  o.force = true;
  ASSERT_TRUE(RunTracerCapture(*registry_, o));
  EXPECT_EQ(Starts(), 10);
  // Prune keeps the cases programs call.
  EXPECT_EQ(*registry_->PruneOrphanCases(), 0);
}

TEST_F(FakeTracerTest, ARefusalIsRetriedWithALargerBudget) {
  TracerCaptureOptions o = Options({"budget"});
  o.tracer.max_gb = 4;
  auto first = RunTracerCapture(*registry_, o);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->refused, 1);
  ASSERT_TRUE(RunTracerCapture(*registry_, o));
  EXPECT_EQ(Starts(), 1);  // the same budget: done
  o.tracer.max_gb = 8;
  ASSERT_TRUE(RunTracerCapture(*registry_, o));
  EXPECT_EQ(Starts(), 2);
  auto r = registry_->GetProgramRecord("m", "budget");
  EXPECT_EQ((*r)->max_gb, 8);
  o.tracer.device = "cpu";  // another device option traces again
  ASSERT_TRUE(RunTracerCapture(*registry_, o));
  EXPECT_EQ(Starts(), 3);
}

TEST_F(FakeTracerTest, AModelNotBuiltIsTracedOnce) {
  TracerCaptureOptions o = Options({"ok", "crash", "hang"}, {"broken/bert"});
  auto s = RunTracerCapture(*registry_, o);
  ASSERT_TRUE(s) << s.error().message();
  EXPECT_EQ(s->not_built, 3);
  EXPECT_EQ(Starts(), 1);
  auto r = registry_->GetProgramRecord("broken/bert", "hang");
  ASSERT_TRUE(r && *r);
  EXPECT_EQ((*r)->status, "not_built");
  EXPECT_EQ((*r)->stage, "build");
  EXPECT_NE((*r)->reason.find("hidden size (50)"), std::string::npos);
}

TEST_F(FakeTracerTest, MemoryLimitAndInterruption) {
  TracerCaptureOptions o = Options({"memory"});
  o.tracer.memory_limit_gb = 0.2;
  o.tracer.timeout_s = 30;
  auto s = RunTracerCapture(*registry_, o);
  ASSERT_TRUE(s);
  auto r = registry_->GetProgramRecord("m", "memory");
  ASSERT_TRUE(r && *r);
  EXPECT_EQ((*r)->status + "/" + (*r)->stage, "failed/memory");

  std::atomic<bool> stop{false};
  TracerCaptureOptions h = Options({"hang"});
  h.tracer.timeout_s = 60;
  h.stop = &stop;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    stop = true;
  });
  const auto start = std::chrono::steady_clock::now();
  auto i = RunTracerCapture(*registry_, h);
  stopper.join();
  ASSERT_TRUE(i);
  EXPECT_TRUE(i->interrupted);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10);
  auto none = registry_->GetProgramRecord("m", "hang");
  ASSERT_TRUE(none);
  EXPECT_FALSE(*none);  // an interrupted pair is not stored: the next capture traces it
}

TEST_F(FakeTracerTest, RefusedCommandLineStopsTheCapture) {
  auto s = RunTracerCapture(*registry_, Options({"usage", "ok"}));
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("--max-gb must be positive"), std::string::npos);
  TracerCaptureOptions missing = Options({"ok"});
  missing.tracer.python = dir_.File("no-such-python");
  auto m = RunTracerCapture(*registry_, missing);
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message().find("scripts/setup.sh"), std::string::npos);
}

TEST_F(FakeTracerTest, AProfileForTheKindTheTracerNamesIsTriedWhenTheStructureWasWrong) {
  // The extractor read the config as multimodal; transformers builds a
  // vision model: the vision profile ("ok" here) gets its turn.
  TracerCaptureOptions o = Options({});
  o.models[0].structure = "multimodal";
  o.profiles = {{"wrongkind", {"multimodal"}}, {"ok", {"vision"}}};
  auto s = RunTracerCapture(*registry_, o);
  ASSERT_TRUE(s) << s.error().message();
  EXPECT_EQ(s->pairs, 2);
  EXPECT_EQ(s->not_applicable, 1);
  EXPECT_EQ(s->captured, 1);
  auto ok = registry_->GetProgramRecord("m", "ok");
  ASSERT_TRUE(ok && *ok);
  EXPECT_EQ((*ok)->status, "captured");
  // Resumed: both outcomes are stored, nothing is traced again.
  const int starts = Starts();
  auto again = RunTracerCapture(*registry_, o);
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(again->skipped, 2);
  EXPECT_EQ(Starts(), starts);
}


// The real tracer package under the project venv's Python; skipped (with
// the reason) where set-up has not made the venv.
class TracerServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    python_ = std::string(COVERAGE_SOURCE_DIR) + "/.venv/bin/python";
    package_ = std::string(COVERAGE_SOURCE_DIR) + "/capture/tracer";
    if (!std::filesystem::exists(python_)) GTEST_SKIP() << "no project venv at " << python_ << " (bash scripts/setup.sh)";
  }
  TracerCommand Command(std::vector<std::string> args, std::string stdin_text = "") {
    TracerCommand c;
    c.python = python_;
    c.package_dir = package_;
    c.args = std::move(args);
    c.stdin_text = std::move(stdin_text);
    c.timeout_s = 120;
    c.threads = 1;
    return c;
  }
  std::string python_, package_;
};

TEST_F(TracerServerTest, ATraceInTheServerEndsAsInAFreshInterpreter) {
  auto server = TracerServer::Start(python_, package_, 1);
  ASSERT_TRUE(server) << server.error().message();
  // A refused command line: exit status 2 and the reason on stderr, both ways.
  const TracerCommand usage = Command({"--config", "-", "--profile", "no-such-profile"}, "{}");
  auto lines = [](std::vector<std::string>* out) {
    return [out](std::string_view line) {
      out->emplace_back(line);
      return Status::Ok();
    };
  };
  std::vector<std::string> served_out, fresh_out;
  auto served = (*server)->Run(usage, lines(&served_out));
  auto fresh = RunTracerProcess(usage, lines(&fresh_out));
  ASSERT_TRUE(served) << served.error().message();
  ASSERT_TRUE(fresh) << fresh.error().message();
  EXPECT_EQ(served->kind, TracerExit::Kind::kExited);
  EXPECT_EQ(served->exit_status, 2);
  EXPECT_EQ(fresh->exit_status, 2);
  EXPECT_NE(served->stderr_tail.find("unknown profile 'no-such-profile'"), std::string::npos) << served->stderr_tail;
  EXPECT_EQ(served->stderr_tail, fresh->stderr_tail);
  // A config that is not JSON: one error record on stdout and the tracer's
  // failure status, from the same server (it survives its children).
  const TracerCommand bad = Command({"--config", "-", "--profile", "prefill"}, "{not json");
  served_out.clear();
  fresh_out.clear();
  served = (*server)->Run(bad, lines(&served_out));
  fresh = RunTracerProcess(bad, lines(&fresh_out));
  ASSERT_TRUE(served) << served.error().message();
  ASSERT_TRUE(fresh) << fresh.error().message();
  EXPECT_EQ(served->kind, TracerExit::Kind::kExited);
  EXPECT_NE(served->exit_status, 0);
  EXPECT_EQ(served->exit_status, fresh->exit_status);
  ASSERT_EQ(served_out.size(), 1u);
  EXPECT_EQ(served_out, fresh_out);
  EXPECT_NE(served_out[0].find("\"type\":\"error\""), std::string::npos) << served_out[0];
}

TEST_F(TracerServerTest, ADeadlineKillsOnlyTheTraceAndTheServerGoesOn) {
  auto server = TracerServer::Start(python_, package_, 1);
  ASSERT_TRUE(server) << server.error().message();
  // The child opens its config from a FIFO no one writes, and waits there
  // until the deadline kills it.
  std::string fifo_dir = std::filesystem::temp_directory_path() / ("tracer_server_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(fifo_dir);
  const std::string fifo = fifo_dir + "/config";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  TracerCommand slow = Command({"--config", fifo, "--profile", "prefill"});
  slow.timeout_s = 1;
  const auto start = std::chrono::steady_clock::now();
  auto killed = (*server)->Run(slow, [](std::string_view) { return Status::Ok(); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(killed) << killed.error().message();
  EXPECT_EQ(killed->kind, TracerExit::Kind::kTimeout);
  EXPECT_LT(seconds, 30);
  // The next trace runs in the same server.
  auto next = (*server)->Run(Command({"--config", "-", "--profile", "no-such-profile"}, "{}"),
                             [](std::string_view) { return Status::Ok(); });
  ASSERT_TRUE(next) << next.error().message();
  EXPECT_EQ(next->exit_status, 2);
  std::filesystem::remove_all(fifo_dir);
}

}  // namespace
}  // namespace coverage::capture
