// The simulated PrivateUse1 device (sim/) loaded as a plugin
// (backends/plugin_backend.h): ops on sim against CPU, the unit stage's
// replay on it, numerics, faults, configuration, counters and the loader.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "backends/backend.h"
#include "backends/backends.h"
#include "backends/plugin_backend.h"
#include "replay/composites.h"
#include "replay/call_engine.h"
#include "replay/program_replay.h"
#include "replay/replay.h"
#include "tests/support/case_builder.h"
#include "tests/support/programs.h"
#include "tests/support/temp_dir.h"

namespace coverage::backends {
using namespace coverage::replay;  // replay/'s names, unqualified in these tests
namespace {

const char* const kPlugin = COVERAGE_SIM_PLUGIN;
const c10::Device kSim(c10::DeviceType::PrivateUse1, 0);

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Loads sim (once per process) and (re)configures it: `config` is the text of
// $COVERAGE_SIM_CONFIG's file, `faults` the value of $COVERAGE_SIM_FAULTS.
Result<std::shared_ptr<Backend>> TrySim(const std::string& config, const std::string& faults = "") {
  static testing::TempDir* dir = new testing::TempDir;
  const std::string path = dir->File("sim.json");
  WriteFile(path, config);
  setenv("COVERAGE_SIM_CONFIG", path.c_str(), 1);
  if (faults.empty()) {
    unsetenv("COVERAGE_SIM_FAULTS");
  } else {
    setenv("COVERAGE_SIM_FAULTS", faults.c_str(), 1);
  }
  return LoadPluginBackend("sim", kPlugin);
}

std::shared_ptr<Backend> Sim(const std::string& config = R"({"numerics": "exact"})", const std::string& faults = "") {
  auto backend = TrySim(config, faults);
  if (!backend.has_value()) {
    ADD_FAILURE() << backend.error().message();
    return nullptr;
  }
  return *backend;
}

CaseResult RunOn(std::shared_ptr<Backend> backend, const OpCase& c) {
  ReplayExecutor executor(std::move(backend), ReplayOptions{});
  return executor.Run(c);
}

at::Tensor OnSim(const at::Tensor& t) { return t.to(kSim); }

void ExpectSame(const at::Tensor& sim, const at::Tensor& cpu, const char* what) {
  EXPECT_EQ(sim.device().type(), c10::DeviceType::PrivateUse1) << what;
  ASSERT_EQ(sim.sizes(), cpu.sizes()) << what;
  EXPECT_EQ(sim.scalar_type(), cpu.scalar_type()) << what;
  EXPECT_TRUE(at::equal(sim.cpu(), cpu)) << what;
}

class SimOps : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(Sim(), nullptr); }
};

TEST_F(SimOps, TensorsReallyLiveOnPrivateUse1) {
  at::Tensor t = at::empty({2, 3}, at::TensorOptions().device(kSim));
  EXPECT_EQ(t.device().type(), c10::DeviceType::PrivateUse1);
  EXPECT_EQ(t.device().index(), 0);
  EXPECT_EQ(t.storage().device().type(), c10::DeviceType::PrivateUse1);
  EXPECT_TRUE(t.key_set().has(c10::DispatchKey::PrivateUse1));
  at::Tensor c = at::arange(6, at::kFloat).reshape({2, 3});
  at::Tensor s = OnSim(c);
  EXPECT_EQ(s.device(), kSim);
  EXPECT_NE(s.data_ptr(), c.data_ptr());
  EXPECT_TRUE(at::equal(s.cpu(), c));
}

// What PyTorch 2.x asks of a well-formed PrivateUse1 device: a name of its
// own, hooks, streams and events, a generator, autograd.
TEST_F(SimOps, RenamesTheDeviceAndRegistersHooks) {
  EXPECT_EQ(c10::get_privateuse1_backend(), "sim");
  EXPECT_EQ(c10::Device("sim:0"), kSim);
  EXPECT_EQ(kSim.str(), "sim:0");
  EXPECT_EQ(OnSim(at::ones({2})).device().str(), "sim:0");
  ASSERT_TRUE(at::isPrivateUse1HooksRegistered());
  const auto& hooks = at::detail::getPrivateUse1Hooks();
  EXPECT_TRUE(hooks.isAvailable());
  EXPECT_TRUE(hooks.hasPrimaryContext(0));
  EXPECT_EQ(hooks.getDeviceFromPtr(nullptr), kSim);
  EXPECT_NE(hooks.getPinnedMemoryAllocator(), nullptr);
  // torch.accelerator's calls.
  EXPECT_EQ(at::getAccelerator(), c10::DeviceType::PrivateUse1);
  EXPECT_EQ(at::accelerator::deviceCount(), 1);
  EXPECT_EQ(at::accelerator::getDeviceIndex(), 0);
  at::accelerator::setDeviceIndex(0);
  at::accelerator::synchronizeDevice(0);
  EXPECT_THROW(at::accelerator::setDeviceIndex(1), c10::Error);
}

TEST_F(SimOps, StreamsAndEventsWorkAsOnADevice) {
  c10::impl::VirtualGuardImpl guard(c10::DeviceType::PrivateUse1);
  const c10::Stream default_stream = guard.getDefaultStream(kSim);
  EXPECT_EQ(at::accelerator::getCurrentStream(0), default_stream);
  const c10::Stream side = guard.getNewStream(kSim);
  EXPECT_NE(side, default_stream);
  {
    c10::StreamGuard on_side(side);
    EXPECT_EQ(at::accelerator::getCurrentStream(0), side);
    c10::Event start(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
    c10::Event end(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
    start.record(side);
    at::Tensor work = at::mm(OnSim(at::randn({64, 64})), OnSim(at::randn({64, 64})));
    end.record(side);
    end.block(default_stream);
    EXPECT_TRUE(end.query());
    end.synchronize();
    EXPECT_GE(start.elapsedTime(end), 0.0);
    EXPECT_EQ(work.device(), kSim);
  }
  EXPECT_EQ(at::accelerator::getCurrentStream(0), default_stream);
}

TEST_F(SimOps, ManualSeedSeedsSimsOwnGenerator) {
  const auto opts = at::TensorOptions().device(kSim);
  at::manual_seed(7);
  at::Tensor first = at::randn({256}, opts);
  at::Tensor second = at::randn({256}, opts);
  EXPECT_EQ(first.device(), kSim);
  EXPECT_FALSE(at::equal(first.cpu(), second.cpu())) << "sim's generator advances";
  at::manual_seed(7);
  EXPECT_TRUE(at::equal(at::randn({256}, opts).cpu(), first.cpu())) << "reseeding replays the stream";
  // Draws on sim leave the CPU generator alone.
  at::manual_seed(11);
  const at::Tensor cpu_only = at::randn({16});
  at::manual_seed(11);
  (void)at::randn({1024}, opts);
  EXPECT_TRUE(at::equal(at::randn({16}), cpu_only));
  // A generator made for the device, passed explicitly.
  at::Generator g = at::detail::getPrivateUse1Hooks().getNewGenerator(0);
  EXPECT_EQ(g.device(), kSim);
  g.set_current_seed(3);
  at::Tensor a = at::empty({64}, opts).normal_(0.0, 1.0, g);
  g.set_current_seed(3);
  at::Tensor b = at::empty({64}, opts).normal_(0.0, 1.0, g);
  EXPECT_TRUE(at::equal(a.cpu(), b.cpu()));
  EXPECT_EQ(at::globalContext().defaultGenerator(kSim).device(), kSim);
}

TEST_F(SimOps, BackwardRunsOnSimAndMatchesCpu) {
  const at::Tensor x = at::randn({8, 16}), w = at::randn({16, 4}), bias = at::randn({4});
  auto loss_of = [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    return at::log_softmax(at::tanh(at::linear(x, w.t(), b)), 1).sum();
  };
  at::Tensor cw = w.clone().requires_grad_(), cb = bias.clone().requires_grad_();
  loss_of(x, cw, cb).backward();
  at::Tensor sw = OnSim(w).requires_grad_(), sb = OnSim(bias).requires_grad_();
  at::Tensor loss = loss_of(OnSim(x), sw, sb);
  EXPECT_EQ(loss.device(), kSim);
  loss.backward();
  ASSERT_TRUE(sw.grad().defined());
  EXPECT_EQ(sw.grad().device(), kSim);
  EXPECT_TRUE(at::allclose(sw.grad().cpu(), cw.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(sb.grad().cpu(), cb.grad(), 1e-5, 1e-6));
}

TEST_F(SimOps, CopiesInEveryDirection) {
  at::Tensor c = at::randn({4, 5});
  at::Tensor s = OnSim(c);
  at::Tensor s2 = at::empty({4, 5}, at::TensorOptions().device(kSim));
  s2.copy_(s);  // sim -> sim
  EXPECT_TRUE(at::equal(s2.cpu(), c));
  at::Tensor back = at::empty({4, 5});
  back.copy_(s2);  // sim -> cpu
  EXPECT_TRUE(at::equal(back, c));
  at::Tensor d = OnSim(c).to(at::kDouble);  // sim -> sim with a dtype change
  EXPECT_TRUE(at::equal(d.cpu(), c.to(at::kDouble)));
  at::Tensor nc = OnSim(c.t());  // non-contiguous source
  EXPECT_TRUE(at::equal(nc.cpu(), c.t()));
}

TEST_F(SimOps, MixingDeviceAndHostTensorsIsRefusedLikeOnADevice) {
  at::Tensor s = OnSim(at::ones({3, 4}));
  try {
    (void)at::mm(s, at::ones({4, 2}));
    ADD_FAILURE() << "mm of a sim and a cpu tensor ran";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("same device"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("aten::mm"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)(s + at::ones({3, 4})), c10::Error);
  // A 0-dim host tensor is a scalar: allowed, as on CUDA.
  EXPECT_TRUE(at::allclose((s * at::scalar_tensor(2.0)).cpu(), at::full({3, 4}, 2.0)));
}

TEST_F(SimOps, ElementwiseReductionsAndMatmulMatchCpu) {
  at::Tensor a = at::randn({8, 16}), b = at::randn({8, 16}), m = at::randn({16, 4});
  at::Tensor sa = OnSim(a), sb = OnSim(b), sm = OnSim(m);
  ExpectSame(sa + sb, a + b, "add");
  ExpectSame(sa * sb, a * b, "mul");
  ExpectSame(at::exp(sa), at::exp(a), "exp");
  ExpectSame(at::where(sa > 0, sa, sb), at::where(a > 0, a, b), "where");
  ExpectSame(at::mm(sa, sm), at::mm(a, m), "mm");
  ExpectSame(at::matmul(sa, sm), at::matmul(a, m), "matmul");
  ExpectSame(at::linear(sa, sm.t(), OnSim(at::ones({4}))), at::linear(a, m.t(), at::ones({4})), "linear");
  ExpectSame(sa.sum(1), a.sum(1), "sum");
  ExpectSame(sa.mean(), a.mean(), "mean");
  ExpectSame(std::get<0>(sa.max(1)), std::get<0>(a.max(1)), "max values");
  ExpectSame(std::get<1>(sa.max(1)), std::get<1>(a.max(1)), "max indices");
  ExpectSame(at::softmax(sa, -1), at::softmax(a, -1), "softmax");
  EXPECT_EQ(sa.sum().item<float>(), a.sum().item<float>());
  at::Tensor x = at::randn({2, 3, 8, 8}), w = at::randn({4, 3, 3, 3});
  ExpectSame(at::conv2d(OnSim(x), OnSim(w)), at::conv2d(x, w), "conv2d");
}

TEST_F(SimOps, ViewsShareTheSimStorage) {
  at::Tensor a = at::arange(24, at::kFloat).reshape({2, 3, 4});
  at::Tensor s = OnSim(a);
  for (const auto& [view, ref, what] : std::vector<std::tuple<at::Tensor, at::Tensor, const char*>>{
           {s.transpose(0, 2), a.transpose(0, 2), "transpose"},
           {s.view({6, 4}), a.view({6, 4}), "view"},
           {s.select(1, 2), a.select(1, 2), "select"},
           {s.narrow(2, 1, 2), a.narrow(2, 1, 2), "narrow"},
           {s.permute({2, 0, 1}), a.permute({2, 0, 1}), "permute"},
           {s.unsqueeze(0), a.unsqueeze(0), "unsqueeze"}}) {
    ExpectSame(view, ref, what);
    EXPECT_TRUE(view.is_alias_of(s)) << what;
    EXPECT_EQ(view.strides(), ref.strides()) << what;
    EXPECT_EQ(view.storage_offset(), ref.storage_offset()) << what;
  }
  ExpectSame(s.permute({2, 0, 1}).contiguous(), a.permute({2, 0, 1}).contiguous(), "contiguous");
  auto parts = s.split(1, 1);
  ASSERT_EQ(parts.size(), 3u);
  ExpectSame(parts[1], a.split(1, 1)[1], "split");
}

// A conjugate (x.conj() of a complex tensor) is a view with the conjugate
// bit; found by `coverage import opinfo` (19 `_conj` samples): sim's host
// views dropped the bit, so the conjugate read back as the tensor itself.
TEST_F(SimOps, ConjugateAndNegativeViewsKeepTheirMathBits) {
  at::Tensor c = at::randn({3, 4}, at::kComplexFloat);
  at::Tensor s = OnSim(c);
  at::Tensor conj = s.conj();
  EXPECT_TRUE(conj.is_conj());
  EXPECT_TRUE(conj.is_alias_of(s));
  EXPECT_TRUE(at::equal(conj.cpu(), c.conj().resolve_conj()));
  EXPECT_TRUE(at::equal(at::_conj(s).cpu(), at::_conj(c).resolve_conj()));
  EXPECT_TRUE(at::equal(conj.resolve_conj().cpu(), c.conj().resolve_conj()));
  EXPECT_TRUE(at::equal((conj * 2).cpu(), c.conj() * 2));
  at::Tensor neg = at::_neg_view(OnSim(at::randn({5})));
  EXPECT_TRUE(neg.is_neg());
  EXPECT_TRUE(at::equal(neg.cpu(), neg.resolve_neg().cpu()));
}

TEST_F(SimOps, ViewsMadeInInferenceModeOfNormalTensorsStayNormal) {
  at::Tensor s = OnSim(at::randn({4, 6}));
  ASSERT_FALSE(s.is_inference());
  c10::InferenceMode inference;
  at::Tensor v = s.t();
  EXPECT_FALSE(v.is_inference());  // as ATen's own views: the model stage routes ops this way
  EXPECT_TRUE(at::OptionalDeviceGuard(kSim).current_device().has_value());
  ExpectSame(at::mm(OnSim(at::eye(6)), v).t(), s.cpu(), "mm through views");
}

TEST_F(SimOps, InPlaceAndOutVariantsWriteIntoTheirArguments) {
  at::Tensor a = at::randn({4, 6}), b = at::randn({4, 6});
  at::Tensor s = OnSim(a), sb = OnSim(b);
  at::Tensor& r = s.add_(sb);
  EXPECT_TRUE(r.is_same(s));
  a.add_(b);
  ExpectSame(s, a, "add_");
  s.narrow(1, 2, 2).mul_(3);  // in place through a view
  a.narrow(1, 2, 2).mul_(3);
  ExpectSame(s, a, "mul_ on a view");
  at::Tensor out = at::empty({4, 6}, at::TensorOptions().device(kSim));
  at::Tensor& o = at::mul_out(out, s, sb);
  EXPECT_TRUE(o.is_same(out));
  ExpectSame(out, a * b, "mul out=");
  at::Tensor small = at::empty({0}, at::TensorOptions().device(kSim));
  at::add_out(small, s, sb);  // out= resized by the CPU kernel
  ExpectSame(small, a + b, "add out= resized");
  s.zero_();
  ExpectSame(s, at::zeros({4, 6}), "zero_");
}

TEST_F(SimOps, TensorListsAndOptionalTensorLists) {
  at::Tensor a = at::randn({2, 3}), b = at::randn({4, 3});
  ExpectSame(at::cat({OnSim(a), OnSim(b)}, 0), at::cat({a, b}, 0), "cat");
  ExpectSame(at::stack({OnSim(a), OnSim(a)}, 1), at::stack({a, a}, 1), "stack");
  at::Tensor x = at::randn({5, 6});
  at::Tensor rows = at::tensor({4, 0, 2}, at::kLong), cols = at::tensor({1, 5, 3}, at::kLong);
  c10::List<std::optional<at::Tensor>> idx_cpu({rows, std::optional<at::Tensor>()});
  c10::List<std::optional<at::Tensor>> idx_sim({OnSim(rows), std::optional<at::Tensor>()});
  ExpectSame(at::index(OnSim(x), idx_sim), at::index(x, idx_cpu), "index with None");
  c10::List<std::optional<at::Tensor>> both_cpu({rows, cols});
  c10::List<std::optional<at::Tensor>> both_sim({OnSim(rows), OnSim(cols)});
  ExpectSame(at::index(OnSim(x), both_sim), at::index(x, both_cpu), "index");
  at::Tensor sx = OnSim(x);
  sx.index_put_(both_sim, OnSim(at::ones({3})));
  x.index_put_(both_cpu, at::ones({3}));
  ExpectSame(sx, x, "index_put_");
}

TEST_F(SimOps, FactoriesMakeTheirTensorsOnTheDevice) {
  const auto on = at::TensorOptions().device(kSim);
  ExpectSame(at::zeros({3, 2}, on), at::zeros({3, 2}), "zeros");
  ExpectSame(at::ones({3}, on.dtype(at::kLong)), at::ones({3}, at::kLong), "ones");
  ExpectSame(at::full({2, 2}, 7.5, on), at::full({2, 2}, 7.5), "full");
  ExpectSame(at::arange(0, 10, 3, on), at::arange(0, 10, 3), "arange");
  ExpectSame(at::eye(3, on), at::eye(3), "eye");
  at::Tensor r = at::randn({16}, on);
  EXPECT_EQ(r.device(), kSim);
  EXPECT_EQ(r.sizes(), at::IntArrayRef({16}));
  ExpectSame(at::zeros_like(r), at::zeros({16}), "zeros_like");
  at::Tensor st = at::empty_strided({2, 3}, {1, 2}, on);
  EXPECT_EQ(st.strides(), at::IntArrayRef({1, 2}));
}

TEST_F(SimOps, ResizeKeepsTheValuesAndGrowsTheStorage) {
  at::Tensor s = OnSim(at::arange(6, at::kFloat));
  s.resize_({2, 3});
  ExpectSame(s, at::arange(6, at::kFloat).reshape({2, 3}), "resize_ same size");
  s.resize_({4, 5});
  EXPECT_EQ(s.sizes(), at::IntArrayRef({4, 5}));
  EXPECT_GE(s.storage().nbytes(), 20 * sizeof(float));
  EXPECT_TRUE(at::equal(s.reshape({-1}).narrow(0, 0, 6).cpu(), at::arange(6, at::kFloat)));
  s.resize_({1});
  EXPECT_EQ(s.numel(), 1);
  at::Tensor t = at::empty({0}, at::TensorOptions().device(kSim));
  t.set_(s);
  EXPECT_TRUE(t.is_alias_of(s));
}

// The unit stage's replay over real op cases: the distinct cases of a tiny
// Llama's traced prefill and training step (forward, backward, AdamW). With
// exact numerics every case passes on sim.
std::vector<OpCase> RealCases() {
  std::vector<OpCase> cases;
  std::set<std::string> keys;
  for (const char* name : {"tiny_llama_prefill.jsonl", "tiny_llama_train.jsonl"}) {
    const Program program = testing::LoadProgramFixture(name);
    for (const ProgramCall& call : program.calls) {
      if (call.op_case && keys.insert(call.op_case->Key()).second) cases.push_back(*call.op_case);
    }
  }
  return cases;
}

TEST(SimReplay, RealCasesPassWithExactNumerics) {
  auto sim = Sim();
  ASSERT_NE(sim, nullptr);
  std::vector<OpCase> cases = RealCases();
  ASSERT_GT(cases.size(), 20u);
  ReplayExecutor executor(sim, ReplayOptions{});
  int passed = 0;
  int64_t fallbacks = 0;
  for (const OpCase& c : cases) {
    CaseResult r = executor.Run(c);
    EXPECT_TRUE(r.outcome == Outcome::kPass || r.outcome == Outcome::kSkipped)
        << c.QualifiedName() << ": " << OutcomeName(r.outcome) << " " << r.error;
    passed += r.outcome == Outcome::kPass;
    fallbacks += r.counters["fallbacks"];
  }
  EXPECT_GT(passed, static_cast<int>(cases.size()) * 9 / 10);
  EXPECT_GT(fallbacks, static_cast<int64_t>(cases.size()));
}

TEST(SimReplay, Bf16MatmulNumericsMismatchOnFp32MatmulsOnly) {
  auto sim = Sim(R"({"numerics": "bf16_matmul"})");
  ASSERT_NE(sim, nullptr);
  CaseResult mm = RunOn(sim, testing::MmCase(64, 256, 32));
  EXPECT_EQ(mm.outcome, Outcome::kMismatch) << mm.error;
  ASSERT_TRUE(mm.max_rel_err.has_value());
  EXPECT_GT(*mm.max_abs_err, 1e-4);
  EXPECT_GT(*mm.cosine, 0.999);  // rounded, not wrong
  EXPECT_EQ(mm.counters["bf16_matmul_ops"], 4);  // first call + 3 warm
  EXPECT_EQ(RunOn(sim, testing::MmCase(64, 256, 32, DType::kBFloat16)).outcome, Outcome::kPass);
  EXPECT_EQ(RunOn(sim, testing::AddCase({64, 32})).outcome, Outcome::kPass);
  auto exact = Sim(R"({"numerics": "exact"})");
  EXPECT_EQ(RunOn(exact, testing::MmCase(64, 256, 32)).outcome, Outcome::kPass);
  // Only the configured ops are rounded.
  auto addmm_only = Sim(R"({"numerics": "bf16_matmul", "bf16_ops": ["addmm"]})");
  EXPECT_EQ(RunOn(addmm_only, testing::MmCase(64, 256, 32)).outcome, Outcome::kPass);
}

// sim declares what its numerics do (coverage_backend_numerics, Note
// [Declared numerics]): judged against that declaration its bf16 matmuls
// pass; "exact" declares nothing.
TEST(SimReplay, SimDeclaresItsBf16MatmulsAndPassesAgainstTheDeclaration) {
  auto sim = Sim(R"({"numerics": "bf16_matmul"})");
  ASSERT_NE(sim, nullptr);
  const std::string text = BackendNumericsOf(*sim);
  auto declared = DeclaredNumerics::FromJson(text, "sim");
  ASSERT_TRUE(declared.has_value()) << declared.error().ToString() << ": " << text;
  ASSERT_NE(declared->OperandsOf("aten::addmm"), nullptr);
  EXPECT_EQ(*declared->OperandsOf("aten::addmm"), (std::vector<std::string>{"mat1", "mat2"}));
  EXPECT_EQ(declared->OperandsOf("aten::add"), nullptr);
  ReplayOptions options;
  options.comparison.numerics = *declared;
  ReplayExecutor executor(sim, options);
  const CaseResult mm = executor.Run(testing::MmCase(64, 256, 32));
  EXPECT_EQ(mm.outcome, Outcome::kPass) << mm.error;
  auto exact = Sim(R"({"numerics": "exact"})");
  EXPECT_EQ(BackendNumericsOf(*exact), "");
}

// The counters' fast path reads what the JSON parser reads: the same
// members for the flat form, and for anything else (spaces, escapes,
// fractions, nesting, leading zeros, repeated names, broken text) the
// parser's own answer. Fixed cases, then random texts of JSON-like pieces.
TEST(PluginCounters, TheFastPathReadsWhatTheJsonParserReads) {
  auto reference = [](const std::string& text) {  // the parser alone
    const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, false);
    std::map<std::string, int64_t> members;
    for (auto it = parsed.begin(); parsed.is_object() && it != parsed.end(); ++it) {
      if (it->is_number_integer()) members.emplace(it.key(), it->get<int64_t>());
    }
    return members;
  };
  EXPECT_EQ(ParseCounters(R"({"fallbacks":3,"fallback:aten::mm.default":-2})"),
            (std::map<std::string, int64_t>{{"fallbacks", 3}, {"fallback:aten::mm.default", -2}}));
  for (const std::string text :
       {"{}", "", "{", "{\"a\":1,}", "{\"a\":01}", "{\"a\":1.5,\"b\":2}", "{\"a\": 1}", "{\"a\\\"b\":1}",
        "{\"a\":{\"b\":1}}", "{\"a\":1,\"a\":2}", "{\"a\":1e3}", "{\"a\":-}", "{\"a\":9223372036854775808}",
        "[1]", "{\"\xff\":1}", "{\"a\":1}}", "{\"a\"1}", "{\"a\":-0}", "{\"\":5}"}) {
    EXPECT_EQ(ParseCounters(text), reference(text)) << text;
  }
  std::mt19937 random(7);
  const char* pieces[] = {"{", "}", "\"a\"", "\"b:c\"", ":", ",", "1", "-12", "0", "07", "1.5", " ", "\\", "\"", "x"};
  for (int n = 0; n < 20000; ++n) {
    std::string text = "{";
    for (int k = static_cast<int>(random() % 8); k > 0; --k) text += pieces[random() % std::size(pieces)];
    if (random() % 2) text += "}";
    ASSERT_EQ(ParseCounters(text), reference(text)) << text;
  }
  // Mostly well-formed: members of names and numbers, now and then a piece out of place.
  const char* names[] = {"\"a\"", "\"fallback:aten::mm\"", "\"a\""};
  const char* numbers[] = {"1", "-12", "0", "07", "1.5", "123456789012", "-0"};
  for (int n = 0; n < 20000; ++n) {
    std::string text = "{";
    for (int k = static_cast<int>(random() % 4); k > 0; --k) {
      text += std::string(names[random() % std::size(names)]) + ":" + numbers[random() % std::size(numbers)];
      if (k > 1) text += ",";
      if (random() % 10 == 0) text += pieces[random() % std::size(pieces)];
    }
    text += "}";
    ASSERT_EQ(ParseCounters(text), reference(text)) << text;
  }
}

TEST(SimReplay, CountersAndCompilesReachTheCaseResult) {
  auto sim = Sim(R"({"numerics": "exact", "compile_us": 20000})");
  ASSERT_NE(sim, nullptr);
  const OpCase c = testing::MulCase({3, 77});  // a shape no other test uses
  CaseResult first = RunOn(sim, c);
  ASSERT_EQ(first.outcome, Outcome::kPass) << first.error;
  EXPECT_EQ(first.counters["compiles"], 1);
  EXPECT_EQ(first.counters["cache_hits"], 3);
  EXPECT_EQ(first.counters["fallback:aten::mul.Tensor"], 4);
  EXPECT_GT(first.counters["fallback:aten::as_strided"], 0);  // placing the inputs: views, never compiled
  EXPECT_GT(first.counters["allocations"], 0);
  EXPECT_GT(first.counters["bytes_allocated"], 0);
  EXPECT_EQ(first.counters.count("faults_injected"), 0u);  // unchanged counters are left out
  ASSERT_TRUE(first.first_call_us && first.warm_us && first.warm_spread_us);
  EXPECT_GT(*first.first_call_us, *first.warm_us + 15000);  // the compile
  EXPECT_GE(*first.warm_spread_us, 0);
  ASSERT_TRUE(first.warm_min_us.has_value()) << "the fastest warm call is what performance is judged on";
  EXPECT_LE(*first.warm_min_us, *first.warm_us);
  CaseResult again = RunOn(sim, c);
  EXPECT_EQ(again.counters.count("compiles"), 0u);
  EXPECT_EQ(again.counters["cache_hits"], 4);
  EXPECT_LT(*again.first_call_us, 15000);
  auto back = CaseResult::FromJson(first.ToJson());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->counters, first.counters);
  EXPECT_EQ(back->warm_spread_us, first.warm_spread_us);
  EXPECT_EQ(back->warm_min_us, first.warm_min_us);
}

// Sim has no convolution_backward kernel (its host fallback serves only the
// forward, sim.cc): PyTorch's own "not implemented" is an unsupported call
// that names the kernel (Note [Missing kernels]), not an error.
TEST_F(SimOps, AMissingKernelIsUnsupportedAndNamed) {
  const at::Tensor x = OnSim(at::randn({1, 2, 5, 5}));
  const at::Tensor w = OnSim(at::randn({3, 2, 3, 3}));
  const at::Tensor grad = OnSim(at::randn({1, 3, 3, 3}));
  try {
    at::convolution_backward(grad, x, w, std::nullopt, {1, 1}, {0, 0}, {1, 1}, false, {0, 0}, 1, {true, true, false});
    FAIL() << "sim ran convolution_backward";
  } catch (const std::exception& e) {
    const CallFailure failure = BackendFailure(e, 2000);
    EXPECT_EQ(failure.outcome, Outcome::kUnsupported) << failure.message;
    EXPECT_EQ(MissingKernel(failure.message), "convolution_backward_overrideable") << failure.message;
  }
}

// Each fault that leaves the process alive gives its Outcome through replay.
TEST(SimFaults, EachKindGivesItsOutcome) {
  const std::string exact = R"({"numerics": "exact"})";
  const OpCase mul = testing::MulCase({4, 8});
  auto with = [&](const std::string& fault) {
    return RunOn(Sim(exact, R"([{"op": "aten::mul", "fault": ")" + fault + R"("}])"), mul);
  };
  EXPECT_EQ(with("wrong_values").outcome, Outcome::kMismatch);
  EXPECT_EQ(with("nan").outcome, Outcome::kNonFiniteMismatch);
  CaseResult unsupported = with("unsupported");
  EXPECT_EQ(unsupported.outcome, Outcome::kUnsupported);
  EXPECT_NE(unsupported.error.find("Could not run 'aten::mul.Tensor' with arguments from the 'PrivateUse1' backend"),
            std::string::npos) << unsupported.error;
  EXPECT_TRUE(LooksUnsupported(unsupported.error));
  CaseResult error = with("error");
  EXPECT_EQ(error.outcome, Outcome::kError);
  EXPECT_NE(error.error.find("injected error in aten::mul.Tensor"), std::string::npos) << error.error;
  EXPECT_EQ(error.counters["faults_injected"], 1);
  // Other ops are untouched.
  EXPECT_EQ(RunOn(Sim(exact, R"([{"op": "aten::mul", "fault": "error"}])"), testing::AddCase({4, 8})).outcome,
            Outcome::kPass);
}

TEST(SimFaults, RulesMatchOverloadDtypeShapeAndDim) {
  const std::string exact = R"({"numerics": "exact"})";
  auto outcome = [&](const std::string& rule, const OpCase& c) {
    return RunOn(Sim(exact, "[" + rule + "]"), c).outcome;
  };
  const OpCase mul = testing::MulCase({3, 17});
  EXPECT_EQ(outcome(R"({"op": "aten::mul.Tensor", "fault": "error"})", mul), Outcome::kError);
  EXPECT_EQ(outcome(R"({"op": "aten::mul.Scalar", "fault": "error"})", mul), Outcome::kPass);
  EXPECT_EQ(outcome(R"({"op": "mul", "fault": "error"})", mul), Outcome::kError);
  EXPECT_EQ(outcome(R"({"op": "*", "fault": "error"})", mul), Outcome::kError);
  EXPECT_EQ(outcome(R"({"op": "*", "dtype": "f32", "fault": "error"})", mul), Outcome::kError);
  EXPECT_EQ(outcome(R"({"op": "*", "dtype": "bf16", "fault": "error"})", mul), Outcome::kPass);
  EXPECT_EQ(outcome(R"({"op": "aten::mul", "shape": [3, 17], "fault": "error"})", mul), Outcome::kError);
  EXPECT_EQ(outcome(R"({"op": "aten::mul", "shape": [17, 3], "fault": "error"})", mul), Outcome::kPass);
  EXPECT_EQ(outcome(R"({"op": "aten::mul", "dim": 17, "fault": "error"})", mul), Outcome::kError);
  EXPECT_EQ(outcome(R"({"op": "aten::mul", "dim": 16, "fault": "error"})", mul), Outcome::kPass);
}

TEST(SimFaults, AttemptsRuleFiresOnlyOnTheListedAttempts) {
  const OpCase mul = testing::MulCase({4, 8});
  const std::string rule = R"([{"op": "aten::mul", "attempts": [1], "fault": "wrong_values"}])";
  unsetenv("COVERAGE_ATTEMPT");
  EXPECT_EQ(RunOn(Sim(R"({"numerics": "exact"})", rule), mul).outcome, Outcome::kMismatch);  // default attempt 1
  setenv("COVERAGE_ATTEMPT", "2", 1);
  EXPECT_EQ(RunOn(Sim(R"({"numerics": "exact"})", rule), mul).outcome, Outcome::kPass);  // the rerun passes
  setenv("COVERAGE_ATTEMPT", "1", 1);
  EXPECT_EQ(RunOn(Sim(R"({"numerics": "exact"})", rule), mul).outcome, Outcome::kMismatch);
  unsetenv("COVERAGE_ATTEMPT");
}

TEST(SimFaults, FaultsFromAFileAndFromTheConfig) {
  testing::TempDir dir;
  WriteFile(dir.File("faults.json"), R"([{"op": "aten::mul", "fault": "nan"}])");
  const OpCase mul = testing::MulCase({4, 8});
  EXPECT_EQ(RunOn(Sim(R"({"numerics": "exact"})", "@" + dir.File("faults.json")), mul).outcome,
            Outcome::kNonFiniteMismatch);
  EXPECT_EQ(RunOn(Sim(R"({"faults": [{"op": "aten::mul", "fault": "unsupported"}]})"), mul).outcome,
            Outcome::kUnsupported);
}

// Note [Sim attention]: sim answers ATen's kernel choice with its own
// attention, forward and backward, which must agree with the CPU's for every
// form a model passes: a causal flag, a float mask that needs a gradient
// (T5's position bias), a bool mask, fewer key heads than query heads.
TEST(SimAttention, TheDevicesOwnAttentionAgreesWithTheCpuForwardAndBackward) {
  auto sim = Sim();
  ASSERT_NE(sim, nullptr);
  replay::RegisterCompositeOps();
  auto backward = c10::Dispatcher::singleton().findSchemaOrThrow(replay::kAttentionBackwardOp, "");
  at::manual_seed(3);
  const at::Tensor q = at::randn({2, 4, 6, 8}), k = at::randn({2, 2, 6, 8}), v = at::randn({2, 2, 6, 8});
  const at::Tensor grad = at::randn({2, 4, 6, 8});
  const at::Tensor float_mask = at::randn({1, 1, 6, 6});
  const at::Tensor bool_mask = at::rand({2, 1, 6, 6}) > 0.3;
  struct Form {
    const char* what;
    at::Tensor mask;
    bool causal;
  };
  for (const Form& f : {Form{"causal", at::Tensor(), true}, Form{"float mask", float_mask, false},
                        Form{"bool mask", bool_mask, false}}) {
    const auto before = sim->Counters();
    auto run = [&](c10::Device d) {
      const std::optional<at::Tensor> mask = f.mask.defined() ? std::optional<at::Tensor>(f.mask.to(d)) : std::nullopt;
      const at::Tensor out = at::scaled_dot_product_attention(q.to(d), k.to(d), v.to(d), mask, 0.0, f.causal,
                                                              std::nullopt, /*enable_gqa=*/true);
      torch::jit::Stack stack{grad.to(d), q.to(d), k.to(d), v.to(d), mask, 0.0, f.causal, std::nullopt, true,
                              c10::List<bool>({true, true, true, f.mask.defined() && f.mask.is_floating_point()})};
      backward.callBoxed(&stack);
      std::vector<at::Tensor> all{out.cpu()};
      for (const auto& r : stack) all.push_back(r.isTensor() && r.toTensor().defined() ? r.toTensor().cpu() : at::Tensor());
      return all;
    };
    const auto on_sim = run(kSim);
    const auto on_cpu = run(c10::Device(c10::kCPU));
    ASSERT_EQ(on_sim.size(), 5u);
    for (size_t i = 0; i < on_sim.size(); ++i) {
      ASSERT_EQ(on_sim[i].defined(), on_cpu[i].defined()) << f.what << " result " << i;
      if (on_cpu[i].defined()) {
        EXPECT_TRUE(at::allclose(on_sim[i], on_cpu[i], 1e-4, 1e-5)) << f.what << " result " << i;
      }
    }
    const auto after = sim->Counters();
    EXPECT_EQ(after.at("attention") - (before.count("attention") ? before.at("attention") : 0), 2) << f.what;
    EXPECT_EQ(after.at("attention_backward") - (before.count("attention_backward") ? before.at("attention_backward") : 0), 1)
        << f.what;
  }
}

// What a device receives when a captured decoder runs on it: its own
// attention (not the CPU's flash kernel), in the forward and in the
// training step's backward, and AdamW's foreach kernels.
TEST(SimAttention, ACapturedDecoderRunsTheDevicesAttentionAndForeachKernels) {
  auto sim = Sim();
  ASSERT_NE(sim, nullptr);
  auto counted = [&](const std::map<std::string, int64_t>& before, const std::string& name) {
    const auto now = sim->Counters();
    const int64_t was = before.count(name) ? before.at(name) : 0;
    return (now.count(name) ? now.at(name) : 0) - was;
  };
  const Program prefill = testing::LoadProgramFixture("tiny_llama_prefill.jsonl");
  int64_t attention_calls = 0;
  for (const auto& c : prefill.calls) attention_calls += c.op == "aten::scaled_dot_product_attention";
  ASSERT_GT(attention_calls, 0);
  auto before = sim->Counters();
  auto item = replay::ReplayProgram(prefill, *sim, replay::ProgramReplayOptions{});
  EXPECT_EQ(item.outcome, Outcome::kPass) << item.error;
  EXPECT_EQ(counted(before, "attention"), attention_calls);
  EXPECT_EQ(counted(before, "fallback:aten::_scaled_dot_product_flash_attention_for_cpu"), 0);

  const Program train = testing::LoadProgramFixture("tiny_llama_train.jsonl");
  int64_t backward_calls = 0, foreach_calls = 0;
  for (const auto& c : train.calls) {
    backward_calls += c.op == replay::kAttentionBackwardOp;
    foreach_calls += c.phase == "optimizer" && c.op.rfind("aten::_foreach_", 0) == 0;
  }
  ASSERT_GT(backward_calls, 0);
  ASSERT_GT(foreach_calls, 0);
  replay::ProgramReplayOptions options;
  options.check.train_steps = 1;
  before = sim->Counters();
  item = replay::ReplayTraining(train, *sim, options);
  EXPECT_EQ(item.outcome, Outcome::kPass) << item.error;
  EXPECT_GE(counted(before, "attention_backward"), backward_calls);
  int64_t foreach_kernels = 0;
  for (const auto& [name, n] : sim->Counters()) {
    if (name.rfind("fallback:aten::_foreach_", 0) == 0) foreach_kernels += n - (before.count(name) ? before.at(name) : 0);
  }
  EXPECT_GE(foreach_kernels, foreach_calls);
}

class SimDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

void MulOnSimWith(const std::string& fault) {
  if (!TrySim(R"({"numerics": "exact"})", R"([{"op": "aten::mul", "fault": ")" + fault + R"("}])").has_value()) std::exit(3);
  at::Tensor a = at::ones({2, 2}).to(kSim);
  at::Tensor b = a * a;
  std::exit(b.defined() ? 0 : 4);
}

TEST_F(SimDeathTest, CrashFaultKillsTheProcessWithSigsegv) {
  EXPECT_EXIT(MulOnSimWith("crash"), ::testing::KilledBySignal(SIGSEGV), "");
}

TEST_F(SimDeathTest, AbortFaultAbortsTheProcess) {
  EXPECT_EXIT(MulOnSimWith("abort"), ::testing::KilledBySignal(SIGABRT), "");
}

// Run by SimFaults.HangFaultNeverReturns in a child process.
TEST(SimFaultChild, HangsInMul) {
  const char* marker = std::getenv("SIM_HANG_MARKER");
  if (marker == nullptr) GTEST_SKIP() << "runs only as the child of SimFaults.HangFaultNeverReturns";
  auto sim = TrySim(R"({"numerics": "exact"})", R"([{"op": "aten::mul", "fault": "hang"}])");
  ASSERT_TRUE(sim.has_value());
  at::Tensor a = at::ones({2, 2}).to(kSim);
  WriteFile(marker, "about to hang");
  at::Tensor b = a * a;
  FAIL() << "mul returned";
}

TEST(SimFaults, HangFaultNeverReturns) {
  testing::TempDir dir;
  const std::string marker = dir.File("marker");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("SIM_HANG_MARKER", marker.c_str(), 1);
    execl("/proc/self/exe", "sim_test", "--gtest_filter=SimFaultChild.HangsInMul", static_cast<char*>(nullptr));
    _exit(127);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(marker) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const bool reached = std::filesystem::exists(marker);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  int status = 0;
  const pid_t done = waitpid(pid, &status, WNOHANG);
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  EXPECT_TRUE(reached) << "the child never reached the op";
  EXPECT_EQ(done, 0) << "the child exited instead of hanging";
}

TEST(SimConfig, ErrorsNameTheSourceAndTheKey) {
  auto error_of = [](const std::string& config, const std::string& faults = "") {
    auto r = TrySim(config, faults);
    return r.has_value() ? std::string("no error") : r.error().message();
  };
  std::string e = error_of(R"({"numerics": "fp8"})");
  EXPECT_NE(e.find("COVERAGE_SIM_CONFIG="), std::string::npos) << e;
  EXPECT_NE(e.find("sim.json"), std::string::npos) << e;
  EXPECT_NE(e.find("key 'numerics'"), std::string::npos) << e;
  EXPECT_NE(error_of(R"({"compile_us": -1})").find("key 'compile_us'"), std::string::npos);
  EXPECT_NE(error_of(R"({"numerix": "exact"})").find("key 'numerix': unknown key"), std::string::npos);
  EXPECT_NE(error_of(R"({"faults": [{"op": "aten::mul", "fault": "melt"}]})").find("faults'[0]: key 'fault'"),
            std::string::npos)
      << error_of(R"({"faults": [{"op": "aten::mul", "fault": "melt"}]})");
  EXPECT_NE(error_of("{", "").find("not valid JSON"), std::string::npos);
  e = error_of("{\n  \"numerics\": \"exact\",\n  \"compile_us\": }");
  EXPECT_NE(e.find("line 3, column 17"), std::string::npos) << e;
  e = error_of("{}", R"([{"op": "aten::mul", "dtype": "float", "fault": "nan"}])");
  EXPECT_NE(e.find("COVERAGE_SIM_FAULTS[0]: key 'dtype'"), std::string::npos) << e;
  e = error_of("{}", R"([{"op": "aten::mul", "shape": "3x4", "fault": "nan"}])");
  EXPECT_NE(e.find("key 'shape'"), std::string::npos) << e;
  e = error_of("{}", R"([{"op": "aten::mul", "attempts": [0], "fault": "nan"}])");
  EXPECT_NE(e.find("key 'attempts'"), std::string::npos) << e;
  e = error_of("{}", R"([{"fault": "nan"}])");
  EXPECT_NE(e.find("key 'op': missing"), std::string::npos) << e;
  e = error_of("{}", "@/nonexistent/faults.json");
  EXPECT_NE(e.find("COVERAGE_SIM_FAULTS=@/nonexistent/faults.json: cannot read"), std::string::npos) << e;
  // A good configuration afterwards makes the backend ready again.
  EXPECT_TRUE(TrySim(R"({"numerics": "exact"})").has_value());
}

TEST(PluginLoader, ErrorsAreClear) {
  auto missing = LoadPluginBackend("privateuse1:/nonexistent/plugin.so", "/nonexistent/plugin.so");
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message().find("'/nonexistent/plugin.so': no such file"), std::string::npos)
      << missing.error().message();
  std::string libm;
  for (const char* p : {"/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                        "/lib64/libm.so.6", "/usr/lib/aarch64-linux-gnu/libm.so.6"}) {
    if (std::filesystem::exists(p)) libm = p;
  }
  if (!libm.empty()) {
    auto not_plugin = LoadPluginBackend("privateuse1:" + libm, libm);
    ASSERT_FALSE(not_plugin.has_value());
    // Which message depends on whether sim is already loaded in this process.
    const std::string m = not_plugin.error().message();
    EXPECT_TRUE(m.find("is not a PrivateUse1 backend plugin: it registered no PrivateUse1 kernels") != std::string::npos ||
                m.find("already belongs to plugin") != std::string::npos)
        << m;
  }
  testing::TempDir dir;
  WriteFile(dir.File("junk.so"), "not an ELF file");
  auto junk = LoadPluginBackend("privateuse1:junk", dir.File("junk.so"));
  ASSERT_FALSE(junk.has_value());
  EXPECT_NE(junk.error().message().find("junk.so"), std::string::npos);
}

TEST(PluginLoader, TheSimPluginIsAPrivateUse1BackendThroughTheRegistry) {
  ASSERT_TRUE(TrySim(R"({"numerics": "exact"})").has_value());
  BackendRegistry registry;
  RegisterPluginBackends(registry, {.plugin_path = kPlugin});
  auto sim = registry.Create("sim");
  ASSERT_TRUE(sim.has_value()) << sim.error().message();
  EXPECT_EQ((*sim)->name(), "sim");
  EXPECT_EQ((*sim)->device(), kSim);
  EXPECT_NE((*sim)->Version().find("sim"), std::string::npos);
  EXPECT_TRUE((*sim)->Counters().count("compiles"));
  auto by_path = registry.Create(std::string("privateuse1:") + kPlugin);
  ASSERT_TRUE(by_path.has_value()) << by_path.error().message();
  EXPECT_EQ((*by_path)->name(), std::string("privateuse1:") + kPlugin);
  EXPECT_FALSE(registry.Create("privateuse1:").has_value());
  // A second, different plugin cannot take PrivateUse1 in the same process.
  testing::TempDir dir;
  std::filesystem::copy_file(kPlugin, dir.File("other.so"));
  auto other = LoadPluginBackend("privateuse1:other", dir.File("other.so"));
  ASSERT_FALSE(other.has_value());
  EXPECT_NE(other.error().message().find("one PrivateUse1 backend per process"), std::string::npos)
      << other.error().message();
}

TEST(Cuda, RunsWhereLibtorchHasCudaElseSkipsWithTheReason) {
  BackendRegistry registry;
  RegisterCudaBackend(registry);
  bool listed = false;
  for (const auto& info : registry.Describe()) {
    if (info.name != "cuda") continue;
    listed = true;
    if (!info.available) {
      EXPECT_FALSE(info.reason.empty());
    }
  }
  EXPECT_TRUE(listed);
  auto cuda = registry.Create("cuda");
  if (!cuda.has_value()) {
    EXPECT_NE(cuda.error().message().find("not available here"), std::string::npos);
    GTEST_SKIP() << cuda.error().message();
  }
  CaseResult r = RunOn(*cuda, testing::AddCase({64, 32}));
  EXPECT_EQ(r.outcome, Outcome::kPass) << r.error;
}

TEST(BackendRegistry, UnavailableBackendsAreListedAndRefusedWithTheirReason) {
  BackendRegistry registry;
  RegisterCpuBackend(registry);
  registry.RegisterUnavailable("npu", "an NPU", "no NPU driver");
  auto npu = registry.Create("npu");
  ASSERT_FALSE(npu.has_value());
  EXPECT_NE(npu.error().message().find("no NPU driver"), std::string::npos);
  auto described = registry.Describe();
  ASSERT_EQ(described.size(), 2u);
  EXPECT_EQ(described[1].name, "npu");
  EXPECT_FALSE(described[1].available);
  EXPECT_EQ(registry.List().size(), 1u);  // List() keeps to what can be created
}

}  // namespace
}  // namespace coverage::backends
