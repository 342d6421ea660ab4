"""Host microseconds per call: torch.add against torch.mm at decode shapes, cuBLAS and cuBLASLt."""
import time, statistics, torch
dev = "cuda"
x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
ws = {n: torch.randn(o, 4096, device=dev, dtype=torch.bfloat16) for n, o in [("qkv", 6144), ("o", 4096), ("gate_up", 28672)]}
wd = torch.randn(4096, 14336, device=dev, dtype=torch.bfloat16)
xd = torch.randn(1, 14336, device=dev, dtype=torch.bfloat16)
a = torch.ones(4096, device=dev, dtype=torch.bfloat16)
def host_us(fn, n=200, reps=7):
    out = []
    for _ in range(reps):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(n): fn()
        out.append((time.perf_counter() - t) / n * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)
cases = {"add": lambda: torch.add(a, a), **{f"mm {k}": (lambda w=w: torch.mm(x, w.t())) for k, w in ws.items()}, "mm down": lambda: torch.mm(xd, wd.t())}
outbuf = torch.empty(1, 6144, device=dev, dtype=torch.bfloat16)
cases["mm qkv out="] = lambda: torch.mm(x, ws["qkv"].t(), out=outbuf)
for lib in ("cublas", "cublaslt"):
    torch.backends.cuda.preferred_blas_library(lib)
    for name, fn in cases.items():
        fn(); fn()
        print(lib, name, round(host_us(fn), 2))
