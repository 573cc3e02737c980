"""Spin-wait helpers of the P2P Triton kernels (all-gather, DP swap / gather).

Every value that decides a branch or a loop exit in those kernels must be the same in every
thread of a program: Triton executes a scalar atomic in one thread and broadcasts its result
through shared memory behind a barrier, so a loop holding such an atomic that some threads leave
and others do not pairs barriers of different iterations (undefined behaviour: seen on 2x H100 as
calls that stalled or whose flags went missing under CUDA-graph replay, where a peer's header
often lands while a program polls it). A scalar ``tl.load`` is issued by every thread and may
return different values to different warps when the word changes meanwhile, and each thread
reads ``%globaltimer`` at its own instant; hence:

* ``uniform_load``: a relaxed atomic read (``atomic_add(ptr, 0)``), broadcast to all threads;
* ``uniform_time``: ``%globaltimer`` read by every thread and reduced to its maximum, which all
  threads receive.
"""
import triton
import triton.language as tl

TIMER_LANES = tl.constexpr(256)   # >= the threads of a program (num_warps <= 8): no replicas


@triton.jit
def uniform_load(ptr, SCOPE: tl.constexpr):
    """``*ptr`` (int64), read once (atomically) and the same in every thread of the program."""
    return tl.atomic_add(ptr, 0, sem="relaxed", scope=SCOPE)


@triton.jit
def uniform_time():
    """``%globaltimer`` (ns) as one value every thread of the program agrees on."""
    z = tl.zeros([TIMER_LANES], dtype=tl.int64)
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,l", [z], dtype=tl.int64,
                                  is_pure=False, pack=1)
    return tl.max(t, axis=0)
