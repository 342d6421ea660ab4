import timeit, torch
x = torch.empty(1, 6144, device="cuda", dtype=torch.bfloat16)
w = torch.empty(4096, 4096, device="cuda", dtype=torch.bfloat16)
q = x[:, :4096]
cases = {
 "is_current_stream_capturing": lambda: torch.cuda.is_current_stream_capturing(),
 "compiler.is_compiling": lambda: torch.compiler.is_compiling(),
 "view": lambda: q.view(1, 32, 128),
 "split3": lambda: x.split([4096, 1024, 1024], dim=-1),
 "w.t()": lambda: w.t(),
 "stride(0)": lambda: x.stride(0),
 "shape[0]": lambda: x.shape[0],
 "is_cuda": lambda: x.is_cuda,
 "data_ptr": lambda: x.data_ptr(),
 "promote_types": lambda: torch.promote_types(torch.bfloat16, torch.bfloat16),
 "is_contiguous": lambda: x.is_contiguous(),
 "empty": lambda: torch.empty((1, 4096), dtype=torch.bfloat16, device=x.device),
 "reshape": lambda: q.reshape(1, -1),
 "dev hash": lambda: hash(("a", 1, 2, x.device)),
}
for k, f in cases.items():
    n = 20000
    t = min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6
    print(f"{k:30s} {t:6.3f} us")
