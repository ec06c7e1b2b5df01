"""Real training loops, openreg against the CPU, each in its own fresh process.

Where `bench.py` times single operations and steps, this times the loops
users run, as they run them: the demo's model and loop (AdamW, a cosine
schedule, ``loss.item()`` every 10 steps, a tqdm bar), a GPT-2-style and a
Llama-style decoder, a ResNet-18-style CNN, and a Lightning fit of a small
model (when Lightning is installed). All models are defined here or in
examples/; nothing is downloaded.

Method: each (loop, device) runs in a new Python process that builds the
model from a fixed seed and warms the loop up (``warmup`` steps: the first
run of each signature, allocator pools, workers). A round starts one CPU
process and one openreg process per driver (``--drivers``, both by default:
``OPENREG_DRIVER=thread`` and ``process``), one after the other, then has
them time ``blocks`` blocks of ``steps`` steps in turn, in an order that
rotates from block to block, each process alone on the cores while the
others wait on their pipe. Each block follows ``warmup`` untimed steps
(the process's caches and its device's choice of spin after its pause) and
ends when the loss of its last step is on the host. This VM's cores have
slow spells of tens of seconds that slow the CPU's loops too (its Llama
step goes from 53 to 64 ms and back within one process), so a ratio is
taken between blocks timed seconds apart: the row's ratio is the median of
openreg's block over the CPU's block of the same turn, with their range, over
``rounds`` rounds of fresh processes.

The goal is the machine's bound (issue 62). On n cores that the kernels
fill, the CPU takes K/n + H a step (K: the kernels' CPU time, H: the host's
Python and dispatch, serial) and openreg at least (K + H)/n, since its host
shares the cores with its device; with h = H / openreg's step, the ratio is
at least 1 / (1 + h (n-1)/n). Every openreg process measures its own h (the
CPU time of its main thread and autograd's thread over the timed blocks, /proc),
the row's bound is the median over its rounds, and a loop meets the goal when
its ratio is within 5% of its bound (ratio <= 1.05 x bound).

``--breakdown`` runs each loop once more on openreg with launch statistics
(``torch.openreg._launch_stats``): how many operator calls were queued, run
synchronously, or run synchronously to learn their signature, and which
operators ran synchronously, and which calls computed their results into
temporaries the device then copied (no out= variant), per step. It also
runs each loop once on each device with the CPU time of every thread of the
process (Linux's /proc), per step: on openreg the host (the main thread),
autograd's thread and the device's workers with their OpenMP threads; on
the CPU the main thread and its OpenMP threads; on both, "ended" for the
threads that ended during the block (openreg's OpenMP team threads, which
end when the worker releases its team). On a machine whose cores
the kernels already fill, openreg can hide at most the host's share of a
step behind the device's work, which bounds its ratio from below.

Usage: python benchmarks/bench_loops.py [--rounds N] [--loops a,b] [--drivers thread,process]
       [--breakdown] [--out DIR]
Writes DIR/bench_loops.json and DIR/bench_loops.png.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import paired
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
# A loop's ratio may exceed the machine's bound by this factor (issue 62).
SLACK = 1.05
DRIVERS = ("thread", "process")


# --- models ---------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class LlamaBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = RMSNorm(dim)
        hidden = 4 * dim * 2 // 3
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        h = self.attn_norm(x)
        shape = (b, t, self.heads, c // self.heads)
        q = rotary(self.wq(h).view(shape), cos, sin).transpose(1, 2)
        k = rotary(self.wk(h).view(shape), cos, sin).transpose(1, 2)
        v = self.wv(h).view(shape).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, c))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, vocab=256, context=64, dim=128, heads=4, layers=4) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(LlamaBlock(dim, heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        half = dim // heads // 2
        freqs = 1.0 / (10000 ** (torch.arange(half).float() / half))
        angles = torch.outer(torch.arange(context).float(), freqs)
        self.register_buffer("cos", angles.cos()[:, None, :], persistent=False)
        self.register_buffer("sin", angles.sin()[:, None, :], persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x, self.cos[:t], self.sin[:t])
        return self.head(self.norm(x))


class GPT2Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)
        self.p = dropout

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.attn(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.p if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


class GPT2(nn.Module):
    def __init__(self, vocab=256, context=64, dim=128, heads=4, layers=4, dropout=0.1) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[GPT2Block(dim, heads, dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.drop(self.wte(idx) + self.wpe(pos)))))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNet18(nn.Module):
    """ResNet-18's layout ([2, 2, 2, 2] basic blocks) at CIFAR size, narrower."""

    def __init__(self, classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width))
        layers, cin = [], width
        for i, cout in enumerate((width, 2 * width, 4 * width, 8 * width)):
            stride = 1 if i == 0 else 2
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(F.relu(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --- loops ------------------------------------------------------------------------
class Loop:
    """A training loop: ``run(n)`` does n steps and returns the last loss on the host."""

    def __init__(self, device: torch.device) -> None:
        self.device = device


class DemoLoop(Loop):
    """examples/train_demo.py's model and loop, minus its sampling and checks."""

    def __init__(self, device):
        super().__init__(device)
        sys.path.insert(0, str(ROOT / "examples"))
        import train_demo
        from tqdm import tqdm

        self.tqdm = tqdm
        text = train_demo.make_text(4000)
        vocab = sorted(set(text))
        data = torch.tensor([vocab.index(ch) for ch in text])
        gen = torch.Generator().manual_seed(0)
        starts = torch.randint(len(data) - 33, (400, 32), generator=gen)
        self.batches = [data[s[:, None] + torch.arange(33)] for s in starts]
        torch.manual_seed(0)
        self.model = train_demo.TinyGPT(len(vocab), 32).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-3, weight_decay=0.01)
        self.schedule = torch.optim.lr_scheduler.CosineAnnealingLR(self.opt, T_max=10_000)
        self.i = 0

    def run(self, n):
        bar = self.tqdm(range(n), unit="step", file=sys.stderr, mininterval=0.1)
        loss = None
        for step in bar:
            batch = self.batches[self.i % len(self.batches)].to(self.device, non_blocking=True)
            self.i += 1
            logits = self.model(batch[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.schedule.step()
            if step % 10 == 0:
                bar.set_postfix(loss=f"{loss.item():.3f}")
        return loss.item()


class LMLoop(Loop):
    """A decoder on random tokens: AdamW, gradient clipping, loss.item() every 10 steps."""

    model_class: type = nn.Module

    def __init__(self, device):
        super().__init__(device)
        torch.manual_seed(0)
        self.model = self.model_class().to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.1)
        gen = torch.Generator().manual_seed(1)
        self.batches = [torch.randint(256, (16, 65), generator=gen) for _ in range(64)]
        self.i = 0

    def run(self, n):
        loss = None
        for step in range(n):
            batch = self.batches[self.i % len(self.batches)].to(self.device, non_blocking=True)
            self.i += 1
            logits = self.model(batch[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            if step % 10 == 0:
                loss.item()
        return loss.item()


class GPT2Loop(LMLoop):
    model_class = GPT2


class LlamaLoop(LMLoop):
    model_class = Llama


class ResNetLoop(Loop):
    """ResNet-18-style on 32x32 images: SGD with momentum, BatchNorm in training mode."""

    def __init__(self, device):
        super().__init__(device)
        torch.manual_seed(0)
        self.model = ResNet18().to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator().manual_seed(1)
        self.batches = [
            (torch.randn(32, 3, 32, 32, generator=gen), torch.randint(10, (32,), generator=gen))
            for _ in range(16)
        ]
        self.i = 0

    def run(self, n):
        loss = None
        for step in range(n):
            x, y = self.batches[self.i % len(self.batches)]
            self.i += 1
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            loss = F.cross_entropy(self.model(x), y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            if step % 10 == 0:
                loss.item()
        return loss.item()


class LightningLoop(Loop):
    """Trainer.fit of a small MLP classifier (max_steps per run), no logging or checkpoints."""

    def __init__(self, device):
        super().__init__(device)
        import lightning.pytorch as pl

        self.pl = pl
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(4096, 64, generator=gen)
        y = (x[:, :8].sum(1) > 0).long()
        self.data = torch.utils.data.TensorDataset(x, y)

        class Classifier(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = nn.Sequential(
                    nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2)
                )

            def training_step(self, batch, _):
                x, y = batch
                loss = F.cross_entropy(self.net(x), y)
                self.last = loss.detach()
                return loss

            def configure_optimizers(self):
                return torch.optim.Adam(self.parameters(), lr=1e-3)

        torch.manual_seed(0)
        self.module = Classifier()

    def run(self, n):
        loader = torch.utils.data.DataLoader(self.data, batch_size=64, shuffle=False)
        accelerator = "cpu" if self.device.type == "cpu" else "openreg"
        trainer = self.pl.Trainer(
            accelerator=accelerator,
            devices=1,
            max_steps=n,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(self.module, loader)
        return self.module.last.item()


def _lightning_installed() -> bool:
    try:
        import lightning.pytorch  # noqa: F401
    except ImportError:
        return False
    return True


# name: (class, warmup steps, steps per block, blocks)
LOOPS = {
    "demo": (DemoLoop, 20, 100, 3),
    "gpt2": (GPT2Loop, 10, 40, 3),
    "llama": (LlamaLoop, 10, 40, 3),
    "resnet18": (ResNetLoop, 5, 20, 3),
    "lightning": (LightningLoop, 20, 500, 3),
}


# --- one process ------------------------------------------------------------------
def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds of each thread of this process so far, by role."""
    tick = os.sysconf("SC_CLK_TCK")
    main = str(threading.get_native_id())
    roles: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        seconds = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        if tid == main:
            role = "host"
        elif name.startswith("openreg"):
            role = "device"  # a stream's worker and its OpenMP threads
        elif name.startswith("pt_autograd"):
            role = "autograd"
        else:
            role = "other"  # the main thread's OpenMP threads, tqdm, BLAS
        roles[role] = roles.get(role, 0.0) + seconds
    # Threads that ended are in the process's total only: on openreg the
    # device's OpenMP team threads, which end when the worker releases the
    # team (doc:call-threads) and start anew at its next team kernel.
    stat = Path("/proc/self/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    total = (int(fields[11]) + int(fields[12])) / tick
    roles["ended"] = max(0.0, total - sum(roles.values()))
    return roles


def warm_loop(name: str, device_name: str):
    """The loop `name` on the device, built from its seed and warmed up."""
    device = torch.device(device_name)
    if device.type == "openreg":
        torch.openreg.set_fallback_warnings(False)
    cls, warmup, _, _ = LOOPS[name]
    loop = cls(device)
    loop.run(warmup)
    return loop


def measure(name: str, device_name: str, breakdown: bool) -> dict:
    device = torch.device(device_name)
    _, _, steps, blocks = LOOPS[name]
    loop = warm_loop(name, device_name)
    if breakdown:
        if device.type == "openreg":
            torch.openreg._reset_launch_stats()
        before = thread_cpu_seconds()
        t0 = time.perf_counter()
        loop.run(steps)
        seconds = time.perf_counter() - t0
        after = thread_cpu_seconds()
        cpu = {k: (after[k] - before.get(k, 0.0)) / steps for k in after}
        stats = torch.openreg._launch_stats() if device.type == "openreg" else None
        return {
            "seconds_per_step": seconds / steps,
            "steps": steps,
            "stats": stats,
            "thread_cpu_per_step": cpu,
        }
    times = []
    before = thread_cpu_seconds()
    t_all = time.perf_counter()
    for _ in range(blocks):
        t0 = time.perf_counter()
        last = loop.run(steps)
        times.append((time.perf_counter() - t0) / steps)
        assert math.isfinite(last), f"{name}: loss {last}"
    wall = time.perf_counter() - t_all
    after = thread_cpu_seconds()
    host = sum(after.get(k, 0.0) - before.get(k, 0.0) for k in ("host", "autograd"))
    return {
        "seconds_per_step": statistics.median(times),
        "blocks": times,
        "host_share": host / wall,
    }


def serve(name: str, device_name: str) -> None:
    """A fresh process holding one loop, timing a block whenever the
    orchestrator asks (paired.serve)."""
    _, warmup, steps, _ = LOOPS[name]
    loop = warm_loop(name, device_name)

    def block() -> dict:
        # Untimed first: the process sat idle while the others ran (its
        # caches went to them, its device chose its team's spin afresh).
        loop.run(warmup)
        before = thread_cpu_seconds()
        t0 = time.perf_counter()
        last = loop.run(steps)
        wall = time.perf_counter() - t0
        after = thread_cpu_seconds()
        assert math.isfinite(last), f"{name}: loss {last}"
        host = sum(after.get(k, 0.0) - before.get(k, 0.0) for k in ("host", "autograd"))
        return {"seconds_per_step": wall / steps, "host_share": host / wall}

    paired.serve(block)


def start_server(name: str, side: str) -> paired.Server:
    """A serve() process for `side`: "cpu" or a driver's name."""
    device, driver = ("cpu", "thread") if side == "cpu" else ("openreg", side)
    cmd = [sys.executable, __file__, "--serve", name, "--device", device]
    env = dict(os.environ, OPENREG_DRIVER=driver)
    return paired.Server(cmd, env, f"{name} on {device} ({driver})")


def bound(host_share: float) -> float:
    """The least openreg / CPU ratio a loop whose host takes `host_share` of
    openreg's step can reach on this machine's cores (the docstring)."""
    n = os.cpu_count() or 1
    return 1 / (1 + host_share * (n - 1) / n)


def run_fresh(name: str, device: str, breakdown: bool = False, driver: str = "thread") -> dict:
    cmd = [sys.executable, __file__, "--measure", name, "--device", device]
    if breakdown:
        cmd.append("--breakdown")
    env = dict(os.environ, OPENREG_DRIVER=driver)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{name} on {device} ({driver}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- the orchestrator -------------------------------------------------------------
def compare(name: str, rounds: int, drivers: list[str]) -> list[dict]:
    """One row per driver. Each round starts a fresh process per side (the CPU
    and every driver), one after the other, then has them time their blocks
    in turn, in a rotating order, each while the others wait: this VM's cores
    have slow spells of tens of seconds (the CPU's own Llama step goes from 53
    to 64 ms and back), so a ratio compares blocks timed seconds apart, never
    processes timed a minute apart."""
    sides = ["cpu", *drivers]
    blocks = LOOPS[name][3]
    per = paired.paired_rounds(lambda side: start_server(name, side), sides, rounds, blocks)
    cpu_times = [m["seconds_per_step"] for m in per["cpu"]]
    cpu = statistics.median(cpu_times)
    rows = []
    for driver in drivers:
        times = [m["seconds_per_step"] for m in per[driver]]
        ratios = [o / c for o, c in zip(times, cpu_times, strict=True)]
        ratio = statistics.median(ratios)
        bounds = [bound(m["host_share"]) for m in per[driver]]
        b = statistics.median(bounds)
        rows.append(
            {
                "loop": name,
                "driver": driver,
                "cpu_ms_per_step": cpu * 1e3,
                "openreg_ms_per_step": statistics.median(times) * 1e3,
                "ratio": ratio,
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "best_ratio": min(times) / min(cpu_times),
                "host_share": statistics.median(m["host_share"] for m in per[driver]),
                "bound": b,
                "goal": SLACK * b,
                "meets_goal": ratio <= SLACK * b,
                "samples": {"cpu": cpu_times, "openreg": times, "bounds": bounds},
            }
        )
    return rows


def print_thread_cpu(device: str, result: dict) -> None:
    cpu = result["thread_cpu_per_step"]
    parts = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(cpu.items()) if v > 0)
    wall = result["seconds_per_step"]
    print(
        f"    {device}: {wall * 1e3:.2f} ms/step; CPU ms per step by thread: {parts} "
        f"(sum {sum(cpu.values()) * 1e3:.1f}, {sum(cpu.values()) / wall:.2f} cores)"
    )


def print_breakdown(name: str, result: dict, cpu_result: dict) -> None:
    s = result["stats"]
    n = result["steps"]
    print(
        f"  {name}: {result['seconds_per_step'] * 1e3:.2f} ms/step; per step: "
        f"{s['queued'] / n:.1f} queued, {s['synchronous'] / n:.2f} synchronous, "
        f"{s['learned'] / n:.2f} learning, {s['host_waits'] / n:.2f} host waits"
    )
    top = sorted(s["synchronous_by_op"].items(), key=lambda kv: -kv[1])[:6]
    if top:
        print("    synchronous: " + ", ".join(f"{op} {c / n:.2f}" for op, c in top))
    top = sorted(s["learned_by_op"].items(), key=lambda kv: -kv[1])[:6]
    if top:
        print("    learning: " + ", ".join(f"{op} {c / n:.2f}" for op, c in top))
    top = sorted(s["copied_by_op"].items(), key=lambda kv: -kv[1])[:8]
    if top:
        print(
            f"    results copied out of temporaries ({s['copied'] / n:.1f} calls): "
            + ", ".join(f"{op} {c / n:.2f}" for op, c in top)
        )
    for device, r in (("openreg", result), ("cpu", cpu_result)):
        print_thread_cpu(device, r)
    own = result["thread_cpu_per_step"]
    host = own.get("host", 0.0) + own.get("autograd", 0.0)
    h = host / result["seconds_per_step"]
    # Kernels filling n cores: the CPU takes K/n + H a step, openreg at
    # least (K + H)/n, so its ratio is at least 1 / (1 + h (n - 1) / n).
    n = os.cpu_count() or 1
    print(
        f"    host share of openreg's step: h = {h:.2f}; with kernels as costly as the "
        f"CPU's, its ratio is at least 1 / (1 + h (n-1)/n) = {1 / (1 + h * (n - 1) / n):.2f} "
        f"on these {n} cores"
    )


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loops = list(dict.fromkeys(r["loop"] for r in rows))
    drivers = list(dict.fromkeys(r["driver"] for r in rows))
    width = 0.8 / len(drivers)
    fig, ax = plt.subplots(figsize=(9, 4))
    for j, driver in enumerate(drivers):
        mine = {r["loop"]: r for r in rows if r["driver"] == driver}
        xs = [i + (j - (len(drivers) - 1) / 2) * width for i, loop in enumerate(loops)]
        ys = [mine[loop]["ratio"] for loop in loops]
        ax.bar(xs, ys, width=width * 0.9, label=f"OPENREG_DRIVER={driver}")
        ax.errorbar(
            xs,
            ys,
            yerr=[
                [mine[loop]["ratio"] - mine[loop]["ratio_min"] for loop in loops],
                [mine[loop]["ratio_max"] - mine[loop]["ratio"] for loop in loops],
            ],
            fmt="none",
            color="black",
        )
        ax.scatter(
            xs,
            [mine[loop]["goal"] for loop in loops],
            marker="_",
            s=400,
            color="tab:red",
            zorder=3,
            label="goal: 1.05 x bound" if j == 0 else None,
        )
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(range(len(loops)), loops)
    ax.set_ylabel("openreg time / CPU time")
    ax.set_title("Training loops against this machine's bound, fresh processes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--device", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loops", default="", help="comma-separated subset")
    parser.add_argument("--drivers", default=",".join(DRIVERS), help="comma-separated")
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.device, args.breakdown)))
        return
    if args.serve:
        serve(args.serve, args.device)
        return
    names = [n for n in (args.loops.split(",") if args.loops else LOOPS) if n]
    if "lightning" in names and not _lightning_installed():
        print("lightning is not installed: its loop is skipped")
        names.remove("lightning")
    if args.breakdown:
        print("where openreg's time goes (launch statistics and thread CPU over one block):")
        for name in names:
            cpu = run_fresh(name, "cpu", breakdown=True)
            for driver in args.drivers.split(","):
                print(f"OPENREG_DRIVER={driver}")
                print_breakdown(name, run_fresh(name, "openreg", True, driver), cpu)
        return
    drivers = [d for d in args.drivers.split(",") if d]
    rows = []
    print(
        f"{'loop':10} {'driver':8} {'cpu ms':>8} {'openreg':>8} {'ratio':>6} {'range':>11} "
        f"{'h':>5} {'bound':>6} {'goal':>5}"
    )
    for name in names:
        for r in compare(name, args.rounds, drivers):
            rows.append(r)
            ok = "ok" if r["meets_goal"] else "MISS"
            print(
                f"{name:10} {r['driver']:8} {r['cpu_ms_per_step']:8.2f} "
                f"{r['openreg_ms_per_step']:8.2f} {r['ratio']:6.2f} "
                f"{r['ratio_min']:5.2f}-{r['ratio_max']:<5.2f} {r['host_share']:5.2f} "
                f"{r['bound']:6.2f} {r['goal']:5.2f} {ok}",
                flush=True,
            )
    met = sum(r["meets_goal"] for r in rows)
    print(f"{met}/{len(rows)} rows within {SLACK:.2f} x their bound")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_loops.json").write_text(
        json.dumps(
            {"rounds": args.rounds, "cores": os.cpu_count(), "slack": SLACK, "rows": rows},
            indent=2,
        )
        + "\n"
    )
    plot(rows, args.out / "bench_loops.png")
    print(f"wrote {args.out / 'bench_loops.json'} and {args.out / 'bench_loops.png'}")


if __name__ == "__main__":
    main()
