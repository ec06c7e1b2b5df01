"""accelerate and the HF Trainer on openreg, through the migration shim.

Neither has an extension point for a device it does not know: both pick CUDA
when ``torch.cuda.is_available()``, and the shim maps that CUDA to openreg.
``python hf_train.py OUT.json`` trains the same things on the CPU
(``cpu=True``/``use_cpu=True``, in this process) and on openreg, and writes
what tests/test_frameworks.py compares. No downloads: the model is built from
a config. Run with ``OPENREG_DEVICE_COUNT=1``: with two devices the Trainer
wraps the model in ``DataParallel`` (which works on openreg under the shim),
and then transformers skips accelerate's autocast, as it does on CUDA.
"""

# ruff: noqa: I001  (the shim is imported first, before anything uses CUDA)
import json
import sys
import warnings

import torch_openreg.transfer_to_openreg  # noqa: F401

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from torch.utils.data import DataLoader, Dataset, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.utils import logging

warnings.filterwarnings("ignore")
logging.set_verbosity_error()


def reset_accelerate():
    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()


def accelerate_loop(cpu, mixed_precision="no"):
    reset_accelerate()
    accelerator = Accelerator(cpu=cpu, mixed_precision=mixed_precision)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # built before the move
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=generator)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses, devices = [], set()
    for _ in range(3):
        for inputs, targets in loader:
            devices.add(str(inputs.device))
            with accelerator.autocast():
                loss = torch.nn.functional.mse_loss(model(inputs).float(), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return {
        "accelerator_device": str(accelerator.device),
        "tensor_devices": sorted(devices),
        "param_devices": sorted({str(p.device) for p in model.parameters()}),
        "scaler": accelerator.scaler is not None,
        "losses": losses,
        "weights": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
    }


class TokenData(Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(2))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def hf_trainer(out_dir, cpu, fp16=False):
    reset_accelerate()
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=64,
        n_positions=16,
        resid_pdrop=0.0,  # no dropout: the two devices' random streams differ
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = GPT2LMHeadModel(config)
    dtypes = set()
    model.lm_head.register_forward_hook(lambda module, args, out: dtypes.add(str(out.dtype)))
    args = TrainingArguments(
        output_dir=out_dir,
        use_cpu=cpu,
        fp16=fp16,
        per_device_train_batch_size=4,
        num_train_epochs=1,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_pin_memory=not cpu,
        seed=0,
        data_seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=TokenData())
    trainer.train()
    return {
        "args_device": str(args.device),
        "n_gpu": args.n_gpu,
        "logits_dtypes": sorted(dtypes),
        "scaler": trainer.accelerator.scaler is not None,
        "param_devices": sorted({str(p.device) for p in model.parameters()}),
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "weights": [p.detach().cpu().flatten().tolist() for p in list(model.parameters())[:4]],
    }


if __name__ == "__main__":
    out_dir = sys.argv[2]
    result = {
        "accelerate_cpu": accelerate_loop(cpu=True),
        "accelerate_openreg": accelerate_loop(cpu=False),
        "accelerate_fp16": accelerate_loop(cpu=False, mixed_precision="fp16"),
        "trainer_cpu": hf_trainer(out_dir, cpu=True),
        "trainer_openreg": hf_trainer(out_dir, cpu=False),
        "trainer_fp16": hf_trainer(out_dir, cpu=False, fp16=True),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)
