import sys, torch
from cgtool.capture.timing import profile_kernels_by_size
x = torch.ones(4096, device='cuda')
r = profile_kernels_by_size([(1, lambda: x.add_(1)), (2, lambda: (x.add_(1), x.mul_(2)))])
for size, stats in r.items():
    print(size, [(s.name[:60], s.launches) for s in stats])
print('inductor', 'torch._inductor' in sys.modules)
