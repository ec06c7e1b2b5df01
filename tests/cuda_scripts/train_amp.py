"""A CUDA training script: AMP with GradScaler, pinned DataLoader, checkpoint and resume."""

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

out_dir = sys.argv[1]
use_cuda = torch.cuda.is_available()
device = torch.device("cuda" if use_cuda else "cpu")
device_type = "cuda" if use_cuda else "cpu"

torch.manual_seed(0)  # data and initial weights are made on the CPU
inputs = torch.randn(256, 16)
targets = inputs @ torch.randn(16, 4) + 0.1 * torch.randn(256, 4)
loader = DataLoader(
    TensorDataset(inputs, targets),
    batch_size=32,
    shuffle=True,
    pin_memory=use_cuda,
    generator=torch.Generator().manual_seed(0),
)


def make_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


model = make_model()
if use_cuda:
    model.cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler(device_type, init_scale=2.0**10)


def train_epoch(model, optimizer, scaler, losses):
    model.train()
    for x, y in loader:
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        with torch.autocast(device_type, dtype=torch.float16):
            pred = model(x)
            assert pred.dtype == torch.float16, pred.dtype
            loss = F.mse_loss(pred, y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())


losses = []
for _ in range(2):
    train_epoch(model, optimizer, scaler, losses)
if use_cuda:
    torch.cuda.synchronize()
checkpoint = os.path.join(out_dir, "checkpoint.pt")
torch.save(
    {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
    },
    checkpoint,
)

# Resume in fresh objects, as a restarted job would.
state = torch.load(checkpoint, map_location=device)
resumed = make_model().to(device)
resumed.load_state_dict(state["model"])
optimizer2 = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
optimizer2.load_state_dict(state["optimizer"])
scaler2 = torch.amp.GradScaler(device_type)
scaler2.load_state_dict(state["scaler"])
train_epoch(resumed, optimizer2, scaler2, losses)

torch.save(
    {
        "losses": torch.tensor(losses),
        "weights": {k: v.cpu() for k, v in resumed.state_dict().items()},
        "scale": scaler2.get_scale(),
        "param_device": str(next(resumed.parameters()).device),
        "memory_allocated": torch.cuda.memory_allocated() if use_cuda else 0,
    },
    os.path.join(out_dir, "result.pt"),
)
