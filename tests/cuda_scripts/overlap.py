"""A CUDA-stream overlap idiom: the next batch is copied on a side stream while
the current one is computed; events time the loop."""

import sys

import torch

out = sys.argv[1]
use_cuda = torch.cuda.is_available()
torch.manual_seed(0)
batches = [torch.randn(128, 64) for _ in range(8)]
weight = torch.randn(64, 64)
result = torch.zeros(64)

if use_cuda:
    batches = [b.pin_memory() for b in batches]
    weight = weight.cuda()
    result = result.cuda()
    copy_stream = torch.cuda.Stream()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    with torch.cuda.stream(copy_stream):
        next_batch = batches[0].cuda(non_blocking=True)
    for i in range(len(batches)):
        torch.cuda.current_stream().wait_stream(copy_stream)
        batch = next_batch
        batch.record_stream(torch.cuda.current_stream())
        if i + 1 < len(batches):
            with torch.cuda.stream(copy_stream):
                next_batch = batches[i + 1].cuda(non_blocking=True)
        result += (batch @ weight).relu().sum(0)
    end.record()
    torch.cuda.synchronize()
    assert start.elapsed_time(end) >= 0
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
else:
    for batch in batches:
        result += (batch @ weight).relu().sum(0)

torch.save({"result": result.cpu(), "device": str(result.device)}, out)
