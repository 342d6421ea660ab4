import torch
torch.manual_seed(0)
for K, N in [(896, 1152), (4096, 6144)]:
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(16, K, device="cuda", dtype=torch.bfloat16)
    full = torch.addmm(b, x, w.t())
    for m in (1, 3, 5, 8, 13, 15):
        d = (torch.addmm(b, x[:m], w.t()).float() - full[:m].float()).abs()
        print(f"addmm K={K} N={N} M={m} vs M=16: max diff {d.max().item():.3g}, rows {(d.amax(1) > 0).nonzero().flatten().tolist()}")
