"""Every way CUDA code names a device, under the shim (the import form).

Run by tests/test_migration.py as ``python entry_points.py DIR``; DIR holds
``cuda_tagged.pt``, a checkpoint whose storages are tagged ``cuda:1`` as one
saved on a CUDA machine. Prints ``OK`` at the end; any failed check raises.
"""

import contextlib
import io
import os
import pickle
import sys
import threading
import warnings

import torch

made_before = torch.device("cuda", 1)  # a CUDA device object built before the shim

import torch_openreg.transfer_to_openreg  # noqa: E402, F401
from torch_openreg.migration import CudaApiNotSupportedError  # noqa: E402

data_dir = sys.argv[1]
OR0, OR1 = torch.device("openreg", 0), torch.device("openreg", 1)


def main():
    # Device objects stay CUDA devices (made before or after the shim) and are
    # mapped where they are used.
    assert torch.device("cuda:1").type == "cuda" and made_before.type == "cuda"
    assert torch.ones(1, device=torch.device("cuda:1")).device == OR1
    assert torch.zeros(2, device="cuda").device == OR0
    assert torch.ones(2, device=made_before).device == OR1
    assert torch.tensor([1.0], device="cuda:1").device == OR1
    assert torch.ones(2).to(made_before).device == OR1
    assert torch.ones(2).to("cuda", torch.float16).dtype == torch.float16
    assert torch.ones(2).cuda().device == OR0
    assert torch.ones(2).cuda(1).device == OR1
    assert torch.ones(2).cuda(device=made_before, non_blocking=True).device == OR1
    assert torch.ones(2, device="cuda").new_zeros(3, device="cuda:1").device == OR1
    assert torch.empty_like(torch.ones(2), device="cuda").device == OR0
    model = torch.nn.Linear(3, 2).cuda()
    assert {p.device for p in model.parameters()} == {OR0}
    model.to(made_before)
    assert {p.device for p in model.parameters()} == {OR1}
    pinned = torch.arange(6.0).pin_memory()
    assert pinned.is_pinned()
    copied = pinned.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert copied.cpu().tolist() == list(range(6))

    # Default devices.
    torch.set_default_device("cuda")
    assert torch.ones(1).device == OR0
    torch.set_default_device(None)
    with torch.device("cuda:1"):
        assert torch.ones(1).device == OR1
    assert torch.ones(1).device.type == "cpu"

    # torch.cuda: the stand-in, its device arguments mapped.
    assert torch.get_device_module("cuda") is torch.cuda
    assert torch.cuda.is_available() and torch.cuda.device_count() == 2
    torch.cuda.set_device("cuda:1")
    assert torch.cuda.current_device() == 1 and torch.ones(1, device="cuda").device == OR1
    torch.cuda.set_device(0)
    with torch.cuda.device(made_before):
        assert torch.cuda.current_device() == 1
    assert torch.cuda.get_device_properties("cuda:1").total_memory > 0
    x = torch.empty(1024, device="cuda:1")
    assert torch.cuda.memory_allocated(made_before) >= 4096
    assert torch.cuda.memory.memory_allocated("cuda:1") == torch.openreg.memory_allocated(1)
    del x
    torch.cuda.empty_cache()
    stream = torch.cuda.Stream("cuda:1")
    assert stream.device == OR1 and isinstance(stream, torch.cuda.Stream)
    assert isinstance(torch.cuda.current_stream(), torch.cuda.streams.Stream)
    from torch.cuda import Event, memory_reserved

    assert Event is torch.openreg.Event and memory_reserved(0) >= 0

    # Random numbers: seeding, states and fork_rng (whose device_type is "cuda").
    torch.cuda.manual_seed_all(3)
    a = torch.randn(4, device="cuda")
    torch.cuda.manual_seed_all(3)
    assert torch.equal(a, torch.randn(4, device="cuda"))
    state = torch.cuda.get_rng_state("cuda")
    with torch.random.fork_rng(devices=[0], device_type="cuda"):
        torch.randn(4, device="cuda")
    assert torch.equal(state, torch.cuda.get_rng_state(0))

    # AMP: every spelling.
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("cuda") and torch.is_autocast_enabled()
        assert torch.get_autocast_dtype("cuda") == torch.bfloat16
        assert (model(torch.ones(1, 3, device="cuda:1"))).dtype == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with torch.cuda.amp.autocast():
            assert (
                torch.mm(torch.ones(2, 2, device="cuda"), torch.ones(2, 2, device="cuda")).dtype
                == torch.float16
            )
        from torch.cuda.amp import GradScaler

        assert GradScaler()._device == "openreg"
    assert torch.amp.GradScaler()._device == "openreg"
    assert torch.amp.GradScaler("cuda")._device == "openreg"
    assert torch.amp.is_autocast_available("cuda")

    # Threads started after activation, and autograd through .cuda().
    found = []
    thread = threading.Thread(target=lambda: found.append(torch.ones(1, device="cuda").device))
    thread.start()
    thread.join()
    assert found == [OR0], found
    w = torch.ones(3, requires_grad=True)
    (w.cuda() * 2).sum().backward()
    assert w.grad.tolist() == [2.0, 2.0, 2.0]

    # DataParallel over both devices (its CUDA scatter/gather as copies).
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    reference.load_state_dict(net.state_dict())
    inputs = torch.randn(16, 4)
    parallel = torch.nn.DataParallel(net.cuda())
    out = parallel(inputs.cuda())
    out.sum().backward()
    reference(inputs).sum().backward()
    assert out.device == OR0
    torch.testing.assert_close(out.cpu(), reference(inputs))
    torch.testing.assert_close(net[0].weight.grad.cpu(), reference[0].weight.grad)

    # Known limits (docs/migration.md): tensors are openreg tensors.
    assert not torch.ones(1, device="cuda").is_cuda
    assert torch.ones(1, device="cuda").device.type == "openreg"
    assert torch.ones(1, device="cuda").device != torch.device("cuda:0")

    # Pickling devices and generators still works (the classes are PyTorch's).
    assert pickle.loads(pickle.dumps(made_before)) == made_before
    pickle.loads(pickle.dumps(torch.Generator()))

    # Checkpoints: map_location in every form, and a CUDA-tagged file.
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(3.0, device="cuda")}, buffer)
    for location, want in (
        ("cuda:1", OR1),
        (made_before, OR1),
        (torch.device("cuda"), OR0),
        ({"openreg:0": "cuda:1"}, OR1),
        (lambda storage, loc: storage.cuda(1), OR1),
        ("cpu", torch.device("cpu")),
    ):
        buffer.seek(0)
        loaded = torch.load(buffer, map_location=location)["w"]
        assert loaded.device == want, (location, loaded.device)
        assert loaded.cpu().tolist() == [0.0, 1.0, 2.0]
    loaded = torch.load(os.path.join(data_dir, "cuda_tagged.pt"))
    assert loaded["w"].device == OR1 and loaded["w"].cpu().tolist() == [1.0, 2.0]
    loaded = torch.load(os.path.join(data_dir, "cuda_tagged.pt"), map_location={"cuda:1": "cuda:0"})
    assert loaded["w"].device == OR0

    # CUDA-only names: looking them up works (libraries annotate with them),
    # using them raises an error naming the call.
    uses = {
        "CUDAGraph": lambda: torch.cuda.CUDAGraph(),
        "nvtx.range_push": lambda: torch.cuda.nvtx.range_push("step"),
        "FloatTensor": lambda: torch.cuda.FloatTensor(3),
        "memory.MemPool": lambda: torch.cuda.memory.MemPool(),
        "check_error": lambda: torch.cuda.check_error(0),
        "jiterator._create_jit_fn": lambda: torch.cuda.jiterator._create_jit_fn("x"),
    }
    for name, use in uses.items():
        try:
            use()
        except CudaApiNotSupportedError as e:
            assert f"torch.cuda.{name} " in str(e), e
        else:
            raise AssertionError(f"torch.cuda.{name} did not raise")
    assert not isinstance(torch.ones(1, device="cuda"), torch.cuda.FloatTensor)
    assert torch.cuda.has_magma is False
    assert (torch.cuda.CUDAGraph | None) is not None  # an annotation at import time
    assert torch.cuda._is_compiled() is False  # private names are the real module's

    # "nccl" names openreg's torch.distributed backend (an error while there is none).
    import torch.distributed as dist

    if "openreg" in dist.Backend.default_device_backend_map:
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
        # openreg's backend for openreg tensors only, as NCCL serves CUDA tensors only
        from torch_openreg.distributed import DEVICE_ONLY_BACKEND

        assert dist.get_backend() == DEVICE_ONLY_BACKEND
        summed = torch.arange(3.0, device="cuda")
        dist.all_reduce(summed)
        assert summed.device == OR0 and summed.cpu().tolist() == [0.0, 1.0, 2.0]
        dist.destroy_process_group()
    else:
        with contextlib.suppress(CudaApiNotSupportedError):
            dist.init_process_group("nccl", init_method="tcp://127.0.0.1:1", rank=0, world_size=1)
            raise AssertionError("init_process_group('nccl') did not raise")
    print("OK")


main()
