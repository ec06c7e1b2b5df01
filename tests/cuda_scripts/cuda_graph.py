"""A CUDA script using an API openreg has no counterpart for (CUDA graphs)."""

import torch

model = torch.nn.Linear(8, 8).cuda()
static_input = torch.randn(4, 8, device="cuda")
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    static_output = model(static_input)
graph.replay()
print("replayed", static_output.sum().item())
