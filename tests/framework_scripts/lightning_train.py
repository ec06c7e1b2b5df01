"""Lightning on openreg: the same LightningModule trained on the CPU and on openreg.

``python lightning_train.py OUT.json`` trains with ``devices=1`` (32-bit and
bf16-mixed on both, 16-mixed with a GradScaler on openreg) and checks whether
torch.distributed can run on openreg (by trying). ``python lightning_train.py
OUT.json ddp`` trains with ``devices=2`` (DDP) on two CPU processes and on two
openreg devices. Results go to OUT.json for tests/test_frameworks.py.
"""

import json
import sys
import warnings

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore")


class Regressor(pl.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        torch.manual_seed(0)  # initial weights from the CPU generator
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )
        self.lr = lr
        self.devices_seen = set()
        self.losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.devices_seen.add(str(x.device))
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.losses.append(loss.detach().float().cpu().item())
        return loss

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def data(batch_size):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=generator)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def fit(accelerator, precision="32-true", devices=1, batch_size=16):
    model = Regressor()
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=devices,
        max_epochs=2,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data(batch_size))
    return trainer, model


def weights(model):
    return [p.detach().cpu().flatten().tolist() for p in model.parameters()]


def distributed_on_openreg():
    """None if torch.distributed runs collectives on openreg tensors, else why not."""
    import torch.distributed as dist

    if not dist.is_available():
        return "torch.distributed is not available in this PyTorch build"
    backend = dist.Backend.default_device_backend_map.get("openreg", "gloo")
    try:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        tensor = torch.ones(2, device="openreg")
        dist.all_reduce(tensor)
        assert tensor.cpu().tolist() == [1.0, 1.0], tensor
        return None
    except Exception as e:  # noqa: BLE001  (any failure means: not usable)
        return f"torch.distributed cannot run on openreg ({backend}): {type(e).__name__}: {e}"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def single_device():
    out = {}
    for precision in ("32-true", "bf16-mixed"):
        _, cpu = fit("cpu", precision)
        trainer, dev = fit("openreg", precision)
        out[precision] = {
            "cpu_weights": weights(cpu),
            "openreg_weights": weights(dev),
            "cpu_losses": cpu.losses,
            "openreg_losses": dev.losses,
            "devices_seen": sorted(dev.devices_seen),
            "strategy": type(trainer.strategy).__name__,
            "root_device": str(trainer.strategy.root_device),
            "plugin_device": getattr(trainer.precision_plugin, "device", None),
        }
    trainer, dev = fit("openreg", "16-mixed")
    scaler = trainer.precision_plugin.scaler
    out["16-mixed"] = {
        "openreg_losses": dev.losses,
        "devices_seen": sorted(dev.devices_seen),
        "scaler_device": scaler._device,
        "scale": scaler.get_scale(),
    }
    out["registered"] = "openreg" in pl.accelerators.AcceleratorRegistry
    out["ddp_skip_reason"] = distributed_on_openreg()
    return out


def ddp():
    # The same DDP training on two CPU processes (Gloo) and on two openreg devices.
    _, cpu = fit("cpu", devices=2, batch_size=16)
    trainer, model = fit("openreg", devices=2, batch_size=16)
    if trainer.global_rank != 0:
        return None
    return {
        "strategy": type(trainer.strategy).__name__,
        "world_size": trainer.world_size,
        "devices_seen": sorted(model.devices_seen),
        "openreg_weights": weights(model),
        "cpu_weights": weights(cpu),
        "openreg_losses": model.losses,
        "cpu_losses": cpu.losses,
    }


if __name__ == "__main__":
    result = ddp() if sys.argv[2:] == ["ddp"] else single_device()
    if result is not None:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f)
