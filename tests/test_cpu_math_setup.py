"""The CPU math library's one-time set-up happens on one thread, before any
device kernel runs on a team ("cpu-math-setup" in
csrc/engine/kernels/OpenRegCpuMath.cpp).

MKL's vector math picks its code path for the CPU at its first call in a
process, without synchronization; two threads making that first call at once
computed one half of a device tanh with a low-accuracy path (about 1 run in
20 on busy cores). The test widens that window deterministically: a library
preloaded into the program and its device processes wraps MKL's detection,
holds the first call for 50 ms, and records any call that arrives meanwhile.
"""

import ctypes
import os
import shutil
import subprocess

import pytest
import torch
from conftest import describe

DETECT = "mkl_vml_serv_cpu_detect"


def _has_mkl_vector_math():
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        return hasattr(ctypes.CDLL(lib), DETECT)
    except OSError:
        return False


pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or not _has_mkl_vector_math(),
    reason="needs gcc and a torch built with MKL's vector math",
)

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int calls;     /* calls begun in this process */
static int holding;   /* 1 while the first call is held */

static void note(const char* what) {
  const char* path = getenv("CPU_MATH_LOG");
  if (path == NULL) return;
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
  if (fd < 0) return;
  char line[64];
  int n = snprintf(line, sizeof line, "%d %s\n", (int)getpid(), what);
  if (write(fd, line, (size_t)n) != n) { /* nothing to do */ }
  close(fd);
}

int MKL_DETECT(void) {
  static int (*real)(void);
  if (real == NULL) {  /* torch's libraries are loaded RTLD_LOCAL: not RTLD_NEXT */
    void* torch_cpu = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
    if (torch_cpu == NULL) abort();
    real = (int (*)(void))dlsym(torch_cpu, "MKL_DETECT");
    if (real == NULL || real == MKL_DETECT) abort();
  }
  if (__atomic_fetch_add(&calls, 1, __ATOMIC_SEQ_CST) == 0) {
    __atomic_store_n(&holding, 1, __ATOMIC_SEQ_CST);
    note("first");
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
    int type = real();
    __atomic_store_n(&holding, 0, __ATOMIC_SEQ_CST);
    return type;
  }
  if (__atomic_load_n(&holding, __ATOMIC_SEQ_CST)) note("during-first");
  return real();
}
""".replace("MKL_DETECT", DETECT)

PROGRAM = """
import torch
torch.set_num_threads(2)   # a team of two on the device
torch.manual_seed(0)
x, w = torch.randn(256, 256), torch.randn(256, 256)
m = x.to("openreg") @ w.to("openreg")
m.tanh_()                  # the device's first vector-math call
expected = torch.tanh(x @ w)
print("equal" if torch.equal(m.cpu(), expected) else "DIFFERENT")
"""


@pytest.mark.parametrize("driver", ["thread", "process"])
def test_the_first_vector_math_call_is_made_alone(tmp_path, py, driver):
    shim = tmp_path / "detect_shim.so"
    source = tmp_path / "detect_shim.c"
    source.write_text(SHIM)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", shim, source, "-ldl"],
                   check=True, timeout=120)  # fmt: skip
    log = tmp_path / "calls.log"
    proc = py(PROGRAM, OPENREG_DRIVER=driver, LD_PRELOAD=shim, CPU_MATH_LOG=log, timeout=180)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.strip() == "equal", describe(proc)
    lines = [line.split() for line in log.read_text().splitlines()]
    firsts = {pid for pid, what in lines if what == "first"}
    # The program, and with the process driver its device process too.
    assert len(firsts) >= (2 if driver == "process" else 1), lines
    assert all(what == "first" for _, what in lines), (
        f"a thread called MKL's vector math while its first call was being made: {lines}"
    )
