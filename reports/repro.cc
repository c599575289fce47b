#include "reports/repro.h"

#include <cmath>
#include <sstream>

#include <fmt/format.h>

#include "core/input_rules.h"

namespace coverage::reports {
namespace {

std::string PyDType(DType d) {
  switch (d) {
    case DType::kFloat32: return "torch.float32";
    case DType::kFloat64: return "torch.float64";
    case DType::kFloat16: return "torch.float16";
    case DType::kBFloat16: return "torch.bfloat16";
    case DType::kInt8: return "torch.int8";
    case DType::kUInt8: return "torch.uint8";
    case DType::kInt16: return "torch.int16";
    case DType::kInt32: return "torch.int32";
    case DType::kInt64: return "torch.int64";
    case DType::kBool: return "torch.bool";
    case DType::kComplex64: return "torch.complex64";
    case DType::kComplex128: return "torch.complex128";
  }
  return "torch.float32";
}

// Always a Python float (1.0, not 1): a Scalar's type decides promotion.
std::string PyFloat(double v) {
  if (std::isnan(v)) return "float('nan')";
  if (std::isinf(v)) return v > 0 ? "float('inf')" : "float('-inf')";
  std::string text = fmt::format("{}", v);
  if (text.find_first_of(".eE") == std::string::npos) text += ".0";
  return text;
}

template <class T, class F>
std::string PyList(const std::vector<T>& v, F f) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + f(v[i]);
  return out + "]";
}

std::string PyString(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\\' || c == '\'') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
      continue;
    }
    out += c;
  }
  return out + "'";
}

// ATen passes these enums as ints; Python's torch.ops wants the objects.
std::string IntArgument(const std::string& name, int64_t v) {
  static const char* kScalarTypes[] = {"torch.uint8",     "torch.int8",       "torch.int16",   "torch.int32",
                                       "torch.int64",     "torch.float16",    "torch.float32", "torch.float64",
                                       "torch.complex32", "torch.complex64",  "torch.complex128", "torch.bool",
                                       "torch.qint8",     "torch.quint8",     "torch.qint32",  "torch.bfloat16"};
  if (name == "dtype" && v >= 0 && v < 16) return kScalarTypes[v];
  if (name == "memory_format") {
    static const char* kFormats[] = {"torch.contiguous_format", "torch.preserve_format", "torch.channels_last",
                                     "torch.channels_last_3d"};
    if (v >= 0 && v < 4) return kFormats[v];
  }
  if (name == "layout" && v == 0) return "torch.strided";
  return std::to_string(v);
}

std::string MakeTensor(const TensorSpec& t) {
  const char* kind = "real";
  switch (t.domain.kind) {
    case ValueDomain::Kind::kReal: kind = "real"; break;
    case ValueDomain::Kind::kNonNegative: kind = "nonnegative"; break;
    case ValueDomain::Kind::kPositive: kind = "positive"; break;
    case ValueDomain::Kind::kUnit: kind = "unit"; break;
    case ValueDomain::Kind::kMask: kind = "mask"; break;
    case ValueDomain::Kind::kInteger: kind = "integer"; break;
    case ValueDomain::Kind::kBool: kind = "bool"; break;
    case ValueDomain::Kind::kConstant: kind = "constant"; break;
  }
  auto ints = [](int64_t v) { return std::to_string(v); };
  if (t.domain.kind == ValueDomain::Kind::kConstant) {
    return fmt::format("Input({}, {}, {}, {}, 'constant', {}, 0)", PyList(t.shape, ints), PyList(t.strides, ints),
                       t.storage_offset, PyDType(t.dtype), PyFloat(t.domain.value));
  }
  return fmt::format("Input({}, {}, {}, {}, '{}', {}, {})", PyList(t.shape, ints), PyList(t.strides, ints),
                     t.storage_offset, PyDType(t.dtype), kind, t.domain.lo, t.domain.hi);
}

std::string Value(const Argument& a) {
  auto ints = [](int64_t v) { return std::to_string(v); };
  switch (a.kind) {
    case Argument::Kind::kNone: return "None";
    case Argument::Kind::kTensor: return MakeTensor(a.tensor);
    case Argument::Kind::kTensorList:
      return PyList(a.tensors, [](const std::optional<TensorSpec>& t) { return t ? MakeTensor(*t) : "None"; });
    case Argument::Kind::kInt: return IntArgument(a.name, a.i);
    case Argument::Kind::kDouble: return PyFloat(a.d);
    case Argument::Kind::kBool: return a.b ? "True" : "False";
    case Argument::Kind::kString: return PyString(a.s);
    case Argument::Kind::kIntList: return PyList(a.ints, ints);
    case Argument::Kind::kDoubleList: return PyList(a.doubles, PyFloat);
    case Argument::Kind::kBoolList: return PyList(a.bools, [](bool b) { return std::string(b ? "True" : "False"); });
    case Argument::Kind::kDevice: return "'__device__'";
  }
  return "None";
}

}  // namespace

std::string PythonRepro(const OpCase& recorded, uint64_t seed, const ReproTarget& target) {
  // An index takes the whole dimension it indexes, as in replay.
  OpCase c = recorded;
  IndexRules(c);
  std::ostringstream py;
  const std::string op = c.op.substr(c.op.find("::") == std::string::npos ? 0 : c.op.find("::") + 2);
  const std::string ns = c.op.find("::") == std::string::npos ? "aten" : c.op.substr(0, c.op.find("::"));
  py << "# " << recorded.Summary() << "\n"
     << "import torch\n\n";
  if (target.plugin.empty()) {
    py << "DEVICE = " << PyString(target.device) << "\n";
  } else {
    if (!target.environment.empty()) py << "import os\n";
    for (const auto& [name, value] : target.environment) {
      py << "os.environ.setdefault(" << PyString(name) << ", " << PyString(value) << ")\n";
    }
    py << "import types\n"
       << "torch.ops.load_library(" << PyString(target.plugin) << ")\n";
    if (!target.device_name.empty()) {
      py << "if torch._C._get_privateuse1_backend_name() == 'privateuseone':\n"
         << "    torch.utils.rename_privateuse1_backend(" << PyString(target.device_name) << ")\n";
    }
    py << "NAME = torch._C._get_privateuse1_backend_name()\n"
       << "if not hasattr(torch, NAME):\n"
       << "    # The device module PyTorch looks up for a PrivateUse1 device; the\n"
       << "    # backend's own Python package would register a complete one.\n"
       << "    module = types.ModuleType('torch.' + NAME)\n"
       << "    module.is_available = lambda: True\n"
       << "    module.is_initialized = lambda: True\n"
       << "    module._lazy_init = lambda: None\n"
       << "    module._is_in_bad_fork = lambda: False\n"
       << "    module.device_count = lambda: 1\n"
       << "    module.current_device = lambda: 0\n"
       << "    module.manual_seed_all = lambda seed: None\n"
       << "    torch._register_device_module(NAME, module)\n"
       << "DEVICE = NAME + ':0'\n";
  }
  py
     << "torch.manual_seed(" << seed << ")\n\n"
     << "class Input:\n"
     << "    # One tensor argument: flat storage for its strides and offset, filled in\n"
     << "    # the case's value domain, viewed with the same shape, strides and offset\n"
     << "    # on whichever device it is placed.\n"
     << "    def __init__(self, shape, stride, offset, dtype, domain, lo, hi):\n"
     << "        self.shape, self.stride, self.offset = shape, stride, offset\n"
     << "        n = offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride)) if all(shape) else offset + 1\n"
     << "        if domain == 'mask' and len(shape) >= 2:\n"
     << "            self.flat, self.shape, self.stride, self.offset = (\n"
     << "                torch.full(shape, float('-inf')).triu(1).to(dtype).reshape(-1), shape,\n"
     << "                torch.empty(shape).stride(), 0)  # a causal additive mask\n"
     << "            return\n"
     << "        if domain == 'constant':  # a recorded Python number: lo holds it\n"
     << "            flat = torch.full((n,), lo, dtype=torch.float64)\n"
     << "        elif domain == 'integer':\n"
     << "            flat = torch.randint(lo, hi, (n,))\n"
     << "            flat[0], flat[-1] = lo, hi - 1  # both ends of the range, as replay draws them\n"
     << "        elif domain == 'bool' or dtype == torch.bool:\n"
     << "            flat = torch.rand(n) < 0.5\n"
     << "        elif not (dtype.is_floating_point or dtype.is_complex):\n"
     << "            flat = torch.randint(0, 16, (n,))\n"
     << "        elif domain == 'unit':\n"
     << "            flat = 0.002 + 0.996 * torch.rand(n)  # inside (0, 1)\n"
     << "        elif domain == 'positive':\n"
     << "            flat = 0.5 + 1.5 * torch.rand(n)\n"
     << "        elif domain == 'nonnegative':\n"
     << "            flat = 2 * torch.rand(n)\n"
     << "        else:\n"
     << "            flat = 2 * torch.rand(n) - 1\n"
     << "        self.flat = flat.to(dtype)\n"
     << "    def on(self, device):\n"
     << "        # A copy of the storage on the device (even on the CPU: ops that write\n"
     << "        # their inputs must not share them between the two runs), viewed there.\n"
     << "        return self.flat.clone().to(device).as_strided(self.shape, self.stride, self.offset)\n\n"
     << "def on(v, device):\n"
     << "    if isinstance(v, Input):\n"
     << "        return v.on(device)\n"
     << "    if isinstance(v, list):\n"
     << "        return [on(e, device) for e in v]\n"
     << "    if isinstance(v, str) and v == '__device__':\n"
     << "        return device\n"
     << "    return v\n\n"
     << "args = {\n";
  for (const Argument& a : c.args) py << "    " << PyString(a.name) << ": " << Value(a) << ",\n";
  py << "}\n";
  if (c.op == "coverage::scaled_dot_product_attention_backward") {
    // An op of this project (replay/composites.cc), not of PyTorch: the same
    // computation in Python.
    py << "def op(grad_out, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, output_mask):\n"
       << "    # coverage::scaled_dot_product_attention_backward: the gradients of\n"
       << "    # scaled_dot_product_attention, its forward recomputed under autograd.\n"
       << "    inputs = [None if t is None else t.clone().requires_grad_(bool(m) and t.is_floating_point())\n"
       << "              for t, m in zip((query, key, value, attn_mask), output_mask)]\n"
       << "    with torch.enable_grad():\n"
       << "        out = torch.nn.functional.scaled_dot_product_attention(\n"
       << "            inputs[0], inputs[1], inputs[2], attn_mask=inputs[3], dropout_p=dropout_p, is_causal=is_causal,\n"
       << "            scale=scale, enable_gqa=enable_gqa)\n"
       << "        wanted = [t for t in inputs if t is not None and t.requires_grad]\n"
       << "        grads = iter(torch.autograd.grad(out, wanted, grad_out) if wanted else ())\n"
       << "    return tuple(next(grads) if t is not None and t.requires_grad else None for t in inputs)\n";
  } else {
    py << "op = torch.ops." << ns << "." << op << "." << (c.overload.empty() ? "default" : c.overload) << "\n";
  }
  py
     << "cpu_args = {k: on(v, 'cpu') for k, v in args.items()}\n"
     << "dev_args = {k: on(v, DEVICE) for k, v in args.items()}\n"
     << "ref = op(**cpu_args)\n"
     << "out = op(**dev_args)\n"
     << "refs = ref if isinstance(ref, (tuple, list)) else (ref,)\n"
     << "outs = out if isinstance(out, (tuple, list)) else (out,)\n"
     << "for i, (r, o) in enumerate(zip(refs, outs)):\n"
     << "    if isinstance(r, torch.Tensor):\n"
     << "        d = (o.cpu().double() - r.double()).abs().max().item() if r.numel() else 0.0\n"
     << "        print(f'output {i}: shape {tuple(o.shape)} dtype {o.dtype} max abs diff vs cpu {d:.3g}')\n";
  return py.str();
}

}  // namespace coverage::reports
