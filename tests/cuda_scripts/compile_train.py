"""A training loop written for CUDA that compiles its model (torch.compile
with Inductor): AOTAutograd patches torch.cuda.set_rng_state with
unittest.mock.patch, and Inductor reads torch.cuda's device properties."""

import sys

import torch

out = sys.argv[1]
use_cuda = torch.cuda.is_available()
device = "cuda" if use_cuda else "cpu"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(
    device
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# The CPU run is the eager reference.
step = torch.compile(model) if use_cuda else model
x, y = torch.randn(32, 8), torch.randn(32, 1)
losses = []
for _ in range(4):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(step(x.to(device)), y.to(device))
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
torch.save(
    {
        "device": str(next(model.parameters()).device),
        "losses": torch.tensor(losses),
        "weights": [p.detach().cpu() for p in model.parameters()],
    },
    out,
)
