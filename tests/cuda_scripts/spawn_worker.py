"""A CUDA script whose worker process is spawned: the worker runs on openreg too."""

import sys

import torch
import torch.multiprocessing as mp


def worker(queue):
    x = torch.arange(4.0, device="cuda") * 2
    queue.put((str(x.device), x.cpu().tolist(), torch.cuda.device_count()))


if __name__ == "__main__":
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=worker, args=(queue,))
    process.start()
    device, values, count = queue.get(timeout=120)
    process.join(timeout=60)
    assert process.exitcode == 0, process.exitcode
    print(device, values, count, file=sys.stdout)
