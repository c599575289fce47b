"""How far the CPU reference's fp32 results are from an fp64 golden, by library.

The reference moved from Debian's libtorch 1.13 (OpenBLAS GEMMs, ATen's own
im2col convolutions) to the PyTorch 2.13 wheel (MKL GEMMs, oneDNN
convolutions). This measures, on shapes the bundled registry holds, the
max relative error against fp64 of: torch's fp32 matmul (MKL), numpy's fp32
matmul (the OpenBLAS numpy wheels bundle), torch's fp32 convolution with
oneDNN, and with oneDNN turned off (ATen's own kernel). Run from the
project venv: .venv/bin/python bench/reference_numerics.py
"""
import numpy as np
import torch

torch.manual_seed(0)
np.random.seed(0)


def rel_err(x, golden):
    x = torch.as_tensor(x).double()
    scale = golden.abs().max().clamp_min(1e-30)
    return ((x - golden).abs().max() / scale).item()


def matmul_row(m, k, n):
    a = torch.rand(m, k) * 2 - 1
    b = torch.rand(k, n) * 2 - 1
    golden = a.double() @ b.double()
    mkl = rel_err(a @ b, golden)
    openblas = rel_err(np.matmul(a.numpy(), b.numpy()), golden)
    diff = rel_err(a @ b, torch.as_tensor(np.matmul(a.numpy(), b.numpy())).double())
    return f"| mm [{m},{k}]x[{k},{n}] | {mkl:.2e} | {openblas:.2e} | {diff:.2e} |"


def conv_row(n, c, h, o, kh, stride):
    x = torch.rand(n, c, h, h) * 2 - 1
    w = torch.rand(o, c, kh, kh) * 2 - 1
    golden = torch.nn.functional.conv2d(x.double(), w.double(), stride=stride)
    onednn = torch.nn.functional.conv2d(x, w, stride=stride)
    with torch.backends.mkldnn.flags(enabled=False):
        native = torch.nn.functional.conv2d(x, w, stride=stride)
    return (f"| conv2d [{n},{c},{h},{h}] * [{o},{c},{kh},{kh}] /{stride} | {rel_err(onednn, golden):.2e} | "
            f"{rel_err(native, golden):.2e} | {rel_err(onednn, native.double()):.2e} |")


def main():
    print(f"torch {torch.__version__}, numpy {np.__version__}, {torch.get_num_threads()} threads")
    settings = ",".join(torch.__config__.show().splitlines()).split(",")
    print(", ".join(s.strip() for s in settings if s.strip().startswith(("BLAS_INFO=", "USE_MKLDNN="))))
    print()
    print("| matmul (fp32, inputs in [-1, 1)) | torch / MKL vs fp64 | numpy / OpenBLAS vs fp64 | MKL vs OpenBLAS |")
    print("|---|---|---|---|")
    for shape in [(512, 2048, 2048), (512, 2048, 5632), (8, 2048, 2048), (1, 1024, 151936), (512, 1024, 3072)]:
        print(matmul_row(*shape))
    print()
    print("| convolution (fp32) | oneDNN vs fp64 | ATen native vs fp64 | oneDNN vs native |")
    print("|---|---|---|---|")
    for shape in [(1, 3, 224, 64, 7, 2), (1, 64, 56, 64, 3, 1), (1, 256, 14, 256, 3, 1), (1, 3, 224, 1024, 32, 32)]:
        print(conv_row(*shape))


if __name__ == "__main__":
    main()
