// Tensor-parallel all-gather along the hidden / vocab dimension (push over P2P or multicast).
//
// Torch-free: raw pointers, byte strides, a cudaStream_t; returns cudaError_t. The torch adapter
// is comm_ops.cu; the Python side (workspace, validation, backend choice) is
// python/tokenspeed_kernel/ops/comm.py; the protocol is written down in docs/COMM.md.
//
// Every rank r holds x_r[T, w_r] and wants y[T, H] (H = sum of w) with x_r at column offset
// off_r. The kernel is dtype-free: it moves 16-byte vectors (every width, offset, row stride and
// pointer is a multiple of 16 bytes).
//
// Workspace of one communicator, identical layout on every rank (symmetric memory):
//   flags  [kAgFlagBytes]   uint64 words (160 KiB), see below
//   data   [nbuf][buf_bytes] gather buffers: buffer 0 and 1 rotate by epoch parity (copy-out
//                           mode), buffer 2 is the view buffer (only when views are enabled).
// Flag words (on rank p, written by peers with st.release.sys, read by p with ld.acquire.sys):
//   data  [b][s] = (e << 20) | (k + 1) : rank s has stored rounds 0..k of its pieces b of call e
//                    into p's buffer (e & 1) (single-round kernels: k = 0)
//   ready [b][s] = e : rank s has entered call e (view mode: s is done reading its view buffer)
//   data' [b][s]     : the Triton kernel's data flags (its chunking differs, so ranks that
//                      disagree on the backend of a call time out instead of reading partial
//                      data; both kernels share seq, so backends can alternate between calls)
//   hdr [e & 1][b][s] = (e << 32) | sig : the call signature of rank s's CTA b in call e
//                      (call_signature.h; every kernel of this file and the Triton kernel; written
//                      before the CTA's first flag, compared by the receiver before it copies
//                      anything of s into the output: ranks that call with different arguments
//                      get kAgErrMismatch instead of garbage)
// Local (non-symmetric) state, int64[kAgStateWords]: [seq, err, err_block, err_src, err_epoch,
// err_sig, err_peer_sig, err_rows, done-counter, err_width, err_total, err_variant, ...].
// seq = number of completed calls; call e = seq + 1 is read on the device, so CUDA-graph replays
// advance it without the host.
//
// Safety argument (why two rotating buffers + monotonic epoch flags, no entry barrier):
// a rank can run at most one call ahead of any peer. To finish call e a rank needs a data flag
// of call e from every peer, and a peer only sends those after its own call e-1 kernel ended --
// including its copy-out of buffer (e-1)&1. So when rank r writes buffer (e+1)&1 of peer p in
// call e+1, p has finished reading that buffer (call e-1). Flags are monotonic (>= test), so a
// peer that is one call ahead (flag = e+1) also releases call e's data. View mode returns the
// buffer itself to the caller, whose reads are not inside our kernel: it uses one fixed buffer
// and an entry handshake (ready flags) so nobody writes it before its owner entered the next call.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "call_signature.h"

namespace tokenspeed_kernel::comm {

constexpr int kAgMaxRanks = 16;    // flag slots per block; the widest supported world
constexpr int kAgMaxBlocks = 256;  // flag slots per rank; grid size cap
constexpr int kAgThreads = 512;
constexpr int kAgUnroll = 4;  // 16-byte vectors in flight per thread
constexpr int64_t kAgReadyOffset = int64_t(kAgMaxBlocks) * kAgMaxRanks;  // in uint64 words
constexpr int64_t kAgTritonOffset = 2 * kAgReadyOffset;                  // Triton data flags
constexpr int64_t kAgHeaderOffset = 3 * kAgReadyOffset;   // call headers, [2 parities][b][s]
constexpr int64_t kAgFlagBytes = 5 * kAgReadyOffset * 8;  // 160 KiB
// Data flag values (CUDA kernels): (epoch << kAgRoundBits) | (round + 1). Monotonic across calls
// and across the rounds of a call, so ">=" waits work for both kernels sharing the slots. 20 bits:
// < 2^20 - 1 rounds per CTA (checked by the launcher: a 30 GiB chunk), and 2^44 calls before
// the epoch field wraps (about 2 years of back-to-back 3.5 us calls).
constexpr int kAgRoundBits = 20;
// Pipelined copy-out kernel: warp 0 signals, the other warps move data.
constexpr int kAgDataThreads = kAgThreads - 32;
constexpr int kAgRoundVec = kAgDataThreads * kAgUnroll;  // default round (vectors per CTA)

// int64 state words (local memory of each rank)
constexpr int kAgStateSeq = 0;
constexpr int kAgStateErr = 1;
constexpr int kAgStateErrBlock = 2;
constexpr int kAgStateErrSrc = 3;
constexpr int kAgStateErrEpoch = 4;
constexpr int kAgStateErrSig = 5;      // mismatch: this rank's signature of the call
constexpr int kAgStateErrPeerSig = 6;  // mismatch: the source's signature
constexpr int kAgStateErrRows = 7;     // mismatch: this rank's T
constexpr int kAgStateDone = 8;
constexpr int kAgStateErrWidth = 9;     // mismatch: this rank's width, in 16-byte vectors
constexpr int kAgStateErrTotal = 10;    // mismatch: this rank's H, in 16-byte vectors
constexpr int kAgStateErrVariant = 11;  // mismatch: (kind << 16) | this rank's kAgSigFlags bits
constexpr int kAgStateWords = 16;

// error codes (state[kAgStateErr])
constexpr int kAgErrTimeoutData = 1;
constexpr int kAgErrTimeoutReady = 2;
constexpr int kAgErrMismatch = 3;  // a peer's header of this call carries another signature

// flags
constexpr int kAgFlagMultimem = 1;    // push through the multicast address (sm_90+, opt-in only)
constexpr int kAgFlagView = 2;        // no copy-out; result stays in buffer 2 (entry handshake)
constexpr int kAgFlagTrap = 4;        // __trap() after recording a timeout (default: flag only)
constexpr int kAgFlagLL = 8;          // low-latency protocol: flag-carrying packets, no barrier
constexpr int kAgFlagNoPipe = 16;     // testing / A-B only: copy-out through the unpipelined kernel
constexpr int kAgFlagPDL = 32;        // launch with programmatic dependent launch (sm_90+, opt-in)
constexpr int kAgFlagLL4 = 64;        // LL with 4-byte packets (the host's pick for small outputs)
constexpr int kAgFlagLLPaired = 128;  // testing / A-B only, with kAgFlagLL4: a vector's two LL
                                      // units adjacent (the first LL kernel's layout)
// The flag bits that change what a call moves where (part of the call signature); PDL and trap
// do not.
constexpr int kAgSigFlags =
    kAgFlagMultimem | kAgFlagView | kAgFlagLL | kAgFlagNoPipe | kAgFlagLL4 | kAgFlagLLPaired;

// LL protocol with 6-byte packets (all_gather_hidden_ll_kernel): 3 data vectors (48 bytes) travel
// as 4 LL units of 16 bytes = 8 packets of {6 data bytes | 16-bit stamp}.
constexpr int kLLGroupVec = 3;
constexpr int kLLGroupUnits = 4;
constexpr int kLLUnroll = 2;  // groups in flight per thread

// Bytes of one LL parity region that a call of n_vec 16-byte output vectors over `world` ranks
// needs, for either LL kernel: 6-byte packets place source s's groups at 64 * (floor(rows *
// col_vec[s] / 3) + s) (the "+ s" absorbs the rounding of each source's group count), 4-byte
// packets at 32 * rows * col_vec[s].
__host__ __device__ inline int64_t ll_region_bytes(int64_t n_vec, int world) {
  const int64_t ll6 = 64 * (n_vec / kLLGroupVec + world);
  const int64_t ll4 = 32 * n_vec;
  return ll6 > ll4 ? ll6 : ll4;
}

struct AllGatherHiddenParams {
  const uint8_t* x;  // [rows, my width] (byte row stride ldx)
  int64_t ldx;
  uint8_t* out;  // [rows, H] (byte row stride ldo); unused in view mode
  int64_t ldo;
  uint8_t* peer_data[kAgMaxRanks];    // data region (buffer 0) of each rank, in this address space
  uint64_t* peer_flags[kAgMaxRanks];  // flag region of each rank
  uint8_t* my_data;                   // == peer_data[rank]
  uint64_t* my_flags;                 // == peer_flags[rank]
  uint8_t* mc_data;                   // multicast address of the data region (multimem only)
  int64_t* state;                     // local int64[kAgStateWords]
  int64_t buf_bytes;                  // bytes of one gather buffer (multiple of 16)
  int32_t col_vec[kAgMaxRanks + 1];   // column offsets in 16-byte vectors (prefix sums)
  int32_t rows;                       // T
  int32_t row_vec;                    // H in 16-byte vectors: the buffer's row pitch
  int32_t world;
  int32_t rank;
  int32_t num_blocks;  // grid size; the same on every rank for a given call
  int32_t flags;
  int64_t timeout_ns;  // bounded wait; <= 0 waits forever
  int64_t ll_off;      // LL protocol: byte offset of the LL region in data
  int64_t ll_bytes;    // LL protocol: bytes of one LL parity region
  uint32_t sig;        // the call's signature (ag_signature; the same on every rank of a call)
};

namespace detail {

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Programmatic dependent launch (PDL, sm_90+). Every kernel of this file calls pdl_enter() before
// its first memory access (only arithmetic on the parameters precedes it: the LL kernels' first
// batch of (row, column) math): griddepcontrol.wait returns once the previous kernel in the
// stream has completed and its memory is visible (at once when this launch did not allow PDL),
// so nothing below it -- the loads of x, the call counter -- can see a half-written input.
// launch_dependents then lets the next kernel of the stream (if launched with PDL) get
// scheduled while this one runs; that kernel's own griddepcontrol.wait still waits for this
// grid's completion. The trigger requires
// every CTA of this grid to be resident already, so early dependents cannot starve the CTAs
// that wait for peers.
__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void st_release_sys(uint64_t* addr, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(addr), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* addr) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(addr) : "memory");
  return v;
}

__device__ __forceinline__ int64_t ld_relaxed_gpu(const int64_t* addr) {
  int64_t v;
  asm volatile("ld.relaxed.gpu.global.s64 %0, [%1];" : "=l"(v) : "l"(addr) : "memory");
  return v;
}

// Header words (call_signature.h): self-validating (they carry the epoch), so relaxed accesses.
__device__ __forceinline__ void st_relaxed_sys(uint64_t* addr, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(addr), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* addr) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(addr) : "memory");
  return v;
}

// The header slot [epoch & 1][b][s] in the flag region `flags` (of any rank).
__device__ __forceinline__ uint64_t* hdr_slot(uint64_t* flags, uint64_t epoch, int b, int s) {
  return flags + kAgHeaderOffset + static_cast<int64_t>(epoch & 1) * kAgReadyOffset +
         b * kAgMaxRanks + s;
}

__device__ __forceinline__ uint4 ld_v4(const uint8_t* p) {
  return *reinterpret_cast<const uint4*>(p);
}

// Loads of the local gather buffer: written by peers over NVLink, so skip L1 (ld.global.cg).
__device__ __forceinline__ uint4 ld_v4_cg(const uint8_t* p) {
  return __ldcg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ void st_v4(uint8_t* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

// One 16-byte store to the same offset of every rank's buffer, through the multicast address.
__device__ __forceinline__ void multimem_st_v4(uint8_t* mc, uint4 v) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("multimem.st.relaxed.sys.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(mc), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
#else
  (void)mc;
  (void)v;
  __trap();  // the host never selects multimem below sm_90
#endif
}

// Orders this thread's accesses through different virtual aliases of the same memory
// (multicast vs unicast mapping) before what follows.
__device__ __forceinline__ void fence_proxy_alias() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("fence.proxy.alias;" ::: "memory");
#endif
}

// Named CTA barriers (ids 1..4; 0 is __syncthreads). bar.arrive does not wait; bar.sync waits
// for `n` threads' arrivals. Producer warps arrive after their stores, consumer warps sync before
// their reads: the PTX barrier orders the producers' prior accesses before the consumers' later
// ones (the CUTLASS named-barrier producer/consumer pattern).
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

// floor(n * b / g) without 64-bit division: n = q g + r, so n b / g = q b + r b / g with
// r b < g^2 <= 2^16 (g <= kAgMaxBlocks).
__device__ __forceinline__ uint32_t chunk_begin(uint32_t n, int b, int g) {
  const uint32_t ug = static_cast<uint32_t>(g), ub = static_cast<uint32_t>(b);
  const uint32_t q = n / ug;
  return q * ub + ((n - q * ug) * ub) / ug;
}

// Interleaved partition of a source's n vectors over the grid (flag kernels). With
// R = ceil(n / (G max_span)) rounds and span = ceil(n / (G R)) <= max_span, piece (r, b) -- round
// r of CTA b -- is [(r G + b) span, + span) clipped to n. A round's pieces are adjacent, so the
// grid writes one contiguous window of ~G span vectors at a time instead of G windows spread over
// the whole slice: a raw NVLink push took 1.08x the time with per-CTA contiguous chunks
// (bench/lab/tools/p2p_ceiling.cu, push2c vs push2; docs/COMM.md). 32-bit arithmetic: the launcher keeps
// n < 2^31 and G max_span <= 2^19, so (r G + b) span < n + G span never wraps.
__host__ __device__ __forceinline__ uint32_t ceil_div_u32(uint32_t a, uint32_t b) {
  const uint32_t q = a / b;
  return q + (a - q * b != 0u ? 1u : 0u);
}

__host__ __device__ __forceinline__ uint32_t piece_span(uint32_t n, int g, uint32_t max_span) {
  if (n == 0u) return 1u;
  const uint32_t ug = static_cast<uint32_t>(g);
  return ceil_div_u32(n, ug * ceil_div_u32(n, ug * max_span));
}

// Pieces of CTA b (rounds r with (r G + b) span < n).
__host__ __device__ __forceinline__ uint32_t piece_rounds(uint32_t n, int g, int b, uint32_t span) {
  const uint32_t lo = static_cast<uint32_t>(b) * span;
  return lo < n ? ceil_div_u32(n - lo, static_cast<uint32_t>(g) * span) : 0u;
}

__device__ __noinline__ void record_timeout(const AllGatherHiddenParams& p, int code, int src,
                                            uint64_t epoch) {
  unsigned long long* err = reinterpret_cast<unsigned long long*>(p.state + kAgStateErr);
  if (atomicCAS(err, 0ull, static_cast<unsigned long long>(code)) == 0ull) {
    p.state[kAgStateErrBlock] = blockIdx.x;
    p.state[kAgStateErrSrc] = src;
    p.state[kAgStateErrEpoch] = static_cast<int64_t>(epoch);
    __threadfence_system();
    printf(
        "[tokenspeed_kernel] all_gather_hidden: rank %d block %d gave up after %lld ns waiting "
        "for the %s flag of rank %d (call %llu); the communicator is now unusable\n",
        p.rank, static_cast<int>(blockIdx.x), static_cast<long long>(p.timeout_ns),
        code == kAgErrTimeoutData ? "data" : "ready", src, static_cast<unsigned long long>(epoch));
  }
  if (p.flags & kAgFlagTrap) __trap();
}

// Mismatch: source `src`'s header of call `epoch` carries another signature (`peer_hdr`).
// Records (code, block, source, call, both signatures, this rank's shape) like a timeout (first
// CAS wins) and poisons the communicator. Traps with kAgFlagTrap, like a timeout.
__device__ __noinline__ void record_mismatch(const AllGatherHiddenParams& p, int src,
                                             uint64_t epoch, uint64_t peer_hdr, uint32_t kind) {
  unsigned long long* err = reinterpret_cast<unsigned long long*>(p.state + kAgStateErr);
  if (atomicCAS(err, 0ull, static_cast<unsigned long long>(kAgErrMismatch)) == 0ull) {
    p.state[kAgStateErrBlock] = blockIdx.x;
    p.state[kAgStateErrSrc] = src;
    p.state[kAgStateErrEpoch] = static_cast<int64_t>(epoch);
    p.state[kAgStateErrSig] = p.sig;
    p.state[kAgStateErrPeerSig] = static_cast<int64_t>(peer_hdr & 0xFFFFFFFFull);
    p.state[kAgStateErrRows] = p.rows;
    p.state[kAgStateErrWidth] = p.col_vec[p.rank + 1] - p.col_vec[p.rank];
    p.state[kAgStateErrTotal] = p.row_vec;
    p.state[kAgStateErrVariant] = static_cast<int64_t>((kind << 16) | (p.flags & kAgSigFlags));
    __threadfence_system();
    printf(
        "[tokenspeed_kernel] all_gather_hidden: rank %d block %d: rank %d joined call %llu with "
        "other arguments (signature %08x, this rank %08x, T = %d); the communicator is now "
        "unusable\n",
        p.rank, static_cast<int>(blockIdx.x), src, static_cast<unsigned long long>(epoch),
        static_cast<unsigned>(peer_hdr & 0xFFFFFFFFull), p.sig, p.rows);
  }
  if (p.flags & kAgFlagTrap) __trap();
}

// Spin until *flag >= target and, with `hdr`, until the header slot holds this call's header
// `want` (both polled in the same iteration: the header is self-validating, so it needs no order
// against the flag). A header of this call with another signature fails at once
// (record_mismatch). Bounded: gives up after timeout_ns (%globaltimer) and records the error, or
// as soon as another block of this rank recorded one.
__device__ __forceinline__ bool wait_flag_ge(const AllGatherHiddenParams& p, const uint64_t* flag,
                                             uint64_t target, int code, int src, uint64_t epoch,
                                             const uint64_t* hdr = nullptr, uint64_t want = 0) {
  bool hok = hdr == nullptr;
  uint64_t h = 0;
  if (!hok) h = ld_relaxed_sys(hdr);
  bool fok = ld_acquire_sys(flag) >= target;
  uint64_t start = 0;
  for (uint32_t it = 0;; ++it) {
    if (!hok) {
      const int hs = header_state(h, want);
      if (hs < 0) {
        record_mismatch(p, src, epoch, h, kSigAllGatherCuda);
        return false;
      }
      hok = hs > 0;
    }
    if (fok && hok) return true;
    if (it == 0) start = globaltimer_ns();
    if (!hok) h = ld_relaxed_sys(hdr);
    if (!fok) fok = ld_acquire_sys(flag) >= target;
    if ((it & 63u) == 63u) {
      if (ld_relaxed_gpu(p.state + kAgStateErr) != 0) return false;
      if (p.timeout_ns > 0 && globaltimer_ns() - start > static_cast<uint64_t>(p.timeout_ns)) {
        record_timeout(p, code, src, epoch);
        return false;
      }
    }
  }
}

// Thread 0 of every CTA, first thing: is the communicator poisoned (an earlier timeout), and
// this call's number e = seq + 1 (seq lives in device memory, so graph replays advance it).
__device__ __forceinline__ void read_call(const AllGatherHiddenParams& p, int& abort,
                                          uint64_t& epoch) {
  abort = ld_relaxed_gpu(p.state + kAgStateErr) != 0;
  epoch = static_cast<uint64_t>(ld_relaxed_gpu(p.state + kAgStateSeq)) + 1;
}

// Advances the call counter once every CTA of this launch has read it (the next launch, stream-
// ordered after this one, reads seq + 1). One CTA: a plain store. Several: the last CTA to count
// itself in (done-counter) stores it -- each CTA counts itself in only after reading seq. One
// thread per CTA calls this right after the push, so its latency overlaps the waits instead of
// adding a tail to the kernel.
__device__ __forceinline__ void advance_seq(const AllGatherHiddenParams& p, uint64_t epoch) {
  if (p.num_blocks == 1) {
    p.state[kAgStateSeq] = static_cast<int64_t>(epoch);
    return;
  }
  const unsigned long long prev =
      atomicAdd(reinterpret_cast<unsigned long long*>(p.state + kAgStateDone), 1ull);
  if (prev == static_cast<unsigned long long>(p.num_blocks - 1)) {
    p.state[kAgStateDone] = 0;
    p.state[kAgStateSeq] = static_cast<int64_t>(epoch);
  }
}

// Loads this thread's batch of the own slice: vectors base + u * kAgThreads (u < kAgUnroll)
// below hi, vector i being (row i / wv, column i % wv) of x.
__device__ __forceinline__ void load_x_batch(const AllGatherHiddenParams& p, uint32_t base,
                                             uint32_t hi, uint32_t wv, uint4 (&v)[kAgUnroll]) {
#pragma unroll
  for (int u = 0; u < kAgUnroll; ++u) {
    const uint32_t i = base + u * kAgThreads;
    if (i < hi) {
      const uint32_t t = i / wv;
      const uint32_t c = i - t * wv;
      v[u] = ld_v4(p.x + static_cast<int64_t>(t) * p.ldx + static_cast<int64_t>(c) * 16);
    }
  }
}

// Copies CTA b's pieces of source s's columns (piece_span) from the local gather buffer to the
// caller's output.
__device__ __forceinline__ void copy_out_pieces(const AllGatherHiddenParams& p, int s,
                                                int64_t buf_off) {
  const uint32_t col0 = static_cast<uint32_t>(p.col_vec[s]);
  const uint32_t wv = static_cast<uint32_t>(p.col_vec[s + 1]) - col0;
  if (wv == 0) return;
  const uint32_t n = static_cast<uint32_t>(p.rows) * wv;
  const uint32_t span = piece_span(n, p.num_blocks, kAgThreads * kAgUnroll);
  const uint8_t* buf = p.my_data + buf_off;
  for (uint32_t lo = blockIdx.x * span; lo < n; lo += p.num_blocks * span) {
    const uint32_t hi = min(n, lo + span), base = lo + threadIdx.x;
    uint4 v[kAgUnroll];
    uint8_t* dst[kAgUnroll];
#pragma unroll
    for (int u = 0; u < kAgUnroll; ++u) {
      const uint32_t i = base + u * kAgThreads;
      if (i < hi) {
        const uint32_t t = i / wv;
        const uint32_t c = col0 + (i - t * wv);
        v[u] = ld_v4_cg(buf + (static_cast<int64_t>(t) * p.row_vec + c) * 16);
        dst[u] = p.out + static_cast<int64_t>(t) * p.ldo + static_cast<int64_t>(c) * 16;
      }
    }
#pragma unroll
    for (int u = 0; u < kAgUnroll; ++u) {
      if (base + u * kAgThreads < hi) st_v4(dst[u], v[u]);
    }
  }
}

// ---- LL ("low latency") packets --------------------------------------------------------------
// An LL packet is 8 bytes: data next to a stamp of the call. Packets are the u64 elements of
// v2.u64 accesses, and an aligned 64-bit access is single-copy atomic (PTX memory model: a vector
// access is a set of scalar accesses of its elements), so a reader that sees a packet's stamp
// also sees that packet's data: no fence and no separate flag store. A 16-byte LL unit holds two
// packets. Two packings:
//   6-byte packets (all_gather_hidden_ll_kernel): {48 data bits | 16-bit stamp}; 3 vectors ->
//     4 units.
//   4-byte packets (all_gather_hidden_ll4_kernel, kAgFlagLL4): {32 data bits | 32-bit stamp};
//     1 vector -> 2 units.
// The host picks one by output size (ops/comm.py ll_packing, measured crossover).
__device__ __forceinline__ void st_ll(uint8_t* p, uint64_t a, uint64_t b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

__device__ __forceinline__ ulonglong2 ld_ll(const uint8_t* p) {
  ulonglong2 v;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(v.x), "=l"(v.y)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ uint64_t pk(uint32_t lo, uint32_t hi) {
  return uint64_t(lo) | (uint64_t(hi) << 32);
}

// 6-byte packets: the 12 words w of 3 vectors as 24 half-words h; packet k = h[3k] | h[3k+1] << 16
// | h[3k+2] << 32 | f << 48 (f: 16-bit stamp). Unit j = packets 2j, 2j+1.
__device__ __forceinline__ void ll6_pack(const uint4 (&v)[kLLGroupVec], uint32_t f,
                                         ulonglong2 (&u)[kLLGroupUnits]) {
  const uint32_t w[12] = {v[0].x, v[0].y, v[0].z, v[0].w, v[1].x, v[1].y,
                          v[1].z, v[1].w, v[2].x, v[2].y, v[2].z, v[2].w};
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const uint32_t a = w[3 * m], b = w[3 * m + 1], c = w[3 * m + 2];
    u[m].x = pk(a, __byte_perm(b, f, 0x5410));  // a | b.lo16 | f
    u[m].y =
        pk(__byte_perm(b, c, 0x5432), __byte_perm(c, f, 0x5432));  // b.hi16 c.lo16 | c.hi16 | f
  }
}

__device__ __forceinline__ void ll6_unpack(const ulonglong2 (&u)[kLLGroupUnits],
                                           uint4 (&v)[kLLGroupVec]) {
  uint32_t w[12];
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const uint32_t lo0 = uint32_t(u[m].x), hi0 = uint32_t(u[m].x >> 32);
    const uint32_t lo1 = uint32_t(u[m].y), hi1 = uint32_t(u[m].y >> 32);
    w[3 * m] = lo0;
    w[3 * m + 1] = __byte_perm(hi0, lo1, 0x5410);
    w[3 * m + 2] = __byte_perm(lo1, hi1, 0x5432);
  }
#pragma unroll
  for (int j = 0; j < kLLGroupVec; ++j)
    v[j] = make_uint4(w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]);
}

__device__ __forceinline__ bool ll6_ready(const ulonglong2 (&u)[kLLGroupUnits], uint32_t f) {
  bool ok = true;
#pragma unroll
  for (int j = 0; j < kLLGroupUnits; ++j)
    ok &= (uint32_t(u[j].x >> 48) == f) & (uint32_t(u[j].y >> 48) == f);
  return ok;
}

__device__ __forceinline__ bool ll4_ready(const ulonglong2& a, const ulonglong2& b, uint32_t f) {
  return uint32_t(a.x >> 32) == f && uint32_t(a.y >> 32) == f && uint32_t(b.x >> 32) == f &&
         uint32_t(b.y >> 32) == f;
}

// Spin until poll() (which reloads the units it checks, and the source's header until it is
// this call's) returns > 0; < 0: a mismatching header (poll recorded it). Bounded like
// wait_flag_ge.
template <typename Poll>
__device__ __forceinline__ bool spin_ll(const AllGatherHiddenParams& p, Poll poll, int src,
                                        uint64_t epoch) {
  const uint64_t start = globaltimer_ns();
  for (uint32_t it = 1;; ++it) {
    const int r = poll();
    if (r != 0) return r > 0;
    if ((it & 63u) == 0u) {
      if (ld_relaxed_gpu(p.state + kAgStateErr) != 0) return false;
      if (p.timeout_ns > 0 && globaltimer_ns() - start > static_cast<uint64_t>(p.timeout_ns)) {
        record_timeout(p, kAgErrTimeoutData, src, epoch);
        return false;
      }
    }
  }
}

// (row, column) of vector i of a slice w vectors wide, and the same for i + d given d's
// (row, column) without a division. The LL kernels divide once per group or batch and step the
// other members, and do it before the dependency wait where only parameters are involved: each
// 32-bit division is a ~30-instruction dependent chain (reciprocal, multiply-high, fix-ups), and
// the 6-byte kernel's three chains before its loads plus three before its output stores made its
// load-and-push phase ~0.5 us longer than the 4-byte kernel's at T = 1 (bench/lab/tools/ag_micro.cu trace,
// 2x H200; docs/COMM.md).
struct RowCol {
  uint32_t t, c;
};

__device__ __forceinline__ RowCol row_col(uint32_t i, uint32_t w) {
  const uint32_t t = i / w;
  return {t, i - t * w};
}

__device__ __forceinline__ RowCol step_rc(RowCol a, RowCol d, uint32_t w) {
  uint32_t c = a.c + d.c, t = a.t + d.t;  // d.c < w and a.c < w
  if (c >= w) {
    c -= w;
    ++t;
  }
  return {t, c};
}

// Members g, g + ng, g + 2 ng of group g (step = row_col(ng, w)).
__device__ __forceinline__ void group_rc(uint32_t g, uint32_t w, RowCol step,
                                         RowCol (&rc)[kLLGroupVec]) {
  rc[0] = row_col(g, w);
#pragma unroll
  for (int j = 1; j < kLLGroupVec; ++j) rc[j] = step_rc(rc[j - 1], step, w);
}

// Vectors base + u * kAgThreads, u < kAgUnroll (step = row_col(kAgThreads, w)).
__device__ __forceinline__ void batch_rc(uint32_t base, uint32_t w, RowCol step,
                                         RowCol (&rc)[kAgUnroll]) {
  rc[0] = row_col(base, w);
#pragma unroll
  for (int u = 1; u < kAgUnroll; ++u) rc[u] = step_rc(rc[u - 1], step, w);
}

__device__ __forceinline__ const uint8_t* x_at(const AllGatherHiddenParams& p, RowCol rc) {
  return p.x + static_cast<int64_t>(rc.t) * p.ldx + static_cast<int64_t>(rc.c) * 16;
}

// Loads vectors base + u * kAgThreads below hi at their (row, column) rc (batch_rc).
__device__ __forceinline__ void load_x_rc(const AllGatherHiddenParams& p, uint32_t base,
                                          uint32_t hi, const RowCol (&rc)[kAgUnroll],
                                          uint4 (&v)[kAgUnroll]) {
#pragma unroll
  for (int u = 0; u < kAgUnroll; ++u)
    if (base + u * kAgThreads < hi) v[u] = ld_v4(x_at(p, rc[u]));
}

__device__ __forceinline__ uint8_t* out_at(const AllGatherHiddenParams& p, RowCol rc,
                                           uint32_t col0) {
  return p.out + static_cast<int64_t>(rc.t) * p.ldo + static_cast<int64_t>(col0 + rc.c) * 16;
}

// Loads group g's vectors g, g + ng, g + 2 ng of this rank's slice (those below n; the others
// are 0) at their (row, column) rc. Consecutive threads take consecutive groups, so each of the
// three loads is coalesced.
__device__ __forceinline__ void load_x_group(const AllGatherHiddenParams& p, uint32_t g,
                                             uint32_t ng, uint32_t n,
                                             const RowCol (&rc)[kLLGroupVec],
                                             uint4 (&v)[kLLGroupVec]) {
#pragma unroll
  for (int j = 0; j < kLLGroupVec; ++j) {
    v[j] = make_uint4(0, 0, 0, 0);
    if (g + j * ng < n) v[j] = ld_v4(x_at(p, rc[j]));
  }
}

}  // namespace detail

// CTA b moves pieces b of every source (piece_span: batches of at most kAgThreads * kAgUnroll
// vectors, interleaved over the grid). Phases: [view: entry handshake] -> push own pieces b to
// every rank -> release data flag [b][rank] on every rank -> acquire data flags [b][*] ->
// [copy-out pieces b of every source] -> the last CTA advances seq.
template <int kW, bool kMultimem>
__global__ void __launch_bounds__(kAgThreads)
    all_gather_hidden_kernel(const __grid_constant__ AllGatherHiddenParams p) {
  __shared__ uint64_t s_epoch;
  __shared__ int s_abort;
  __shared__ int s_fail;
  const int tid = threadIdx.x;
  const int b = blockIdx.x;
  // My pieces (piece_span: one batch of kAgThreads * kAgUnroll vectors at most, interleaved over
  // the grid), and the first one loaded before the call counter is known (the two loads overlap;
  // at small T the first piece is all there is).
  const uint32_t wv = static_cast<uint32_t>(p.col_vec[p.rank + 1] - p.col_vec[p.rank]);
  const uint32_t my_col0 = static_cast<uint32_t>(p.col_vec[p.rank]);
  const uint32_t n = static_cast<uint32_t>(p.rows) * wv;
  const uint32_t span = detail::piece_span(n, p.num_blocks, kAgThreads * kAgUnroll);
  const uint32_t lo0 = static_cast<uint32_t>(b) * span;
  uint4 v[kAgUnroll];
  detail::pdl_enter();
  detail::load_x_batch(p, lo0 + tid, min(n, lo0 + span), wv, v);
  if (tid == 0) {
    detail::read_call(p, s_abort, s_epoch);
    s_fail = 0;
  }
  __syncthreads();
  if (s_abort) return;
  const uint64_t epoch = s_epoch;
  const bool view = (p.flags & kAgFlagView) != 0;
  const int64_t buf_off = view ? 2 * p.buf_bytes : static_cast<int64_t>(epoch & 1) * p.buf_bytes;
  // this call's header into every rank's slot [epoch & 1][b][rank] (before any flag of the call)
  const uint64_t hw = header_word(epoch, p.sig);
  if (tid < p.world)
    detail::st_relaxed_sys(detail::hdr_slot(p.peer_flags[tid], epoch, b, p.rank), hw);

  if (view) {  // entry handshake: every rank entered call `epoch`, so it is done with its view
    // (the headers are compared here, before anything is pushed into a peer's view buffer)
    if (tid < p.world) {
      detail::st_release_sys(p.peer_flags[tid] + kAgReadyOffset + b * kAgMaxRanks + p.rank, epoch);
      if (!detail::wait_flag_ge(p, p.my_flags + kAgReadyOffset + b * kAgMaxRanks + tid, epoch,
                                kAgErrTimeoutReady, tid, epoch,
                                detail::hdr_slot(p.my_flags, epoch, b, tid), hw))
        atomicOr(&s_fail, 1);  // shared atomic: no WAW race between waiting threads
    }
    __syncthreads();
  }

  if (!s_fail) {
    // ---- push: pieces b of my slice, 16-byte vectors, to the same place in every buffer ----
    // unicast copy-out mode: my own slice goes straight to my output (not through my buffer)
    const bool direct = !kMultimem && !view;
    for (uint32_t lo = lo0; lo < n; lo += p.num_blocks * span) {
      const uint32_t hi = min(n, lo + span), base = lo + tid;
      if (lo != lo0) detail::load_x_batch(p, base, hi, wv, v);
      int64_t dst[kAgUnroll];
      uint8_t* own[kAgUnroll];
#pragma unroll
      for (int u = 0; u < kAgUnroll; ++u) {
        const uint32_t i = base + u * kAgThreads;
        if (i < hi) {
          const uint32_t t = i / wv;
          const uint32_t c = i - t * wv;
          dst[u] = buf_off + (static_cast<int64_t>(t) * p.row_vec + my_col0 + c) * 16;
          own[u] = p.out + static_cast<int64_t>(t) * p.ldo + static_cast<int64_t>(my_col0 + c) * 16;
        }
      }
#pragma unroll
      for (int u = 0; u < kAgUnroll; ++u) {
        if (base + u * kAgThreads < hi) {
          if constexpr (kMultimem) {
            detail::multimem_st_v4(p.mc_data + dst[u], v[u]);
          } else {
#pragma unroll
            for (int q = 0; q < kW; ++q) {
              if (q < p.world) {
                if (direct && q == p.rank)
                  detail::st_v4(own[u], v[u]);
                else
                  detail::st_v4(p.peer_data[q] + dst[u], v[u]);
              }
            }
          }
        }
      }
    }
    if constexpr (kMultimem) detail::fence_proxy_alias();
    __syncthreads();  // every thread's stores precede the release below (cumulativity)
    if (tid == 32 % kAgThreads) detail::advance_seq(p, epoch);  // (not the publishing warp)

    // ---- publish: data flag [b][rank] = epoch on every rank ----
    if (tid < p.world) {
      const uint64_t fv = (epoch << kAgRoundBits) | 1u;  // one round
      detail::st_release_sys(p.peer_flags[tid] + b * kAgMaxRanks + p.rank, fv);
      // ---- wait: data flags [b][*] of this rank reach epoch, headers equal to mine ----
      if (!detail::wait_flag_ge(p, p.my_flags + b * kAgMaxRanks + tid, fv, kAgErrTimeoutData, tid,
                                epoch, view ? nullptr : detail::hdr_slot(p.my_flags, epoch, b, tid),
                                hw))
        atomicOr(&s_fail, 1);  // shared atomic: no WAW race between waiting threads
    }
    __syncthreads();

    // ---- copy-out: pieces b of every source, local buffer -> caller's output ----
    if (!s_fail && !view) {
#pragma unroll
      for (int s = 0; s < kW; ++s) {  // (my own slice is already there, unless multimem)
        if (s < p.world && (kMultimem || s != p.rank)) detail::copy_out_pieces(p, s, buf_off);
      }
    }
  }
}

// Pipelined copy-out variant (P2P, copy-out mode, chunks of more than two rounds). Same buffers,
// flags and safety argument as all_gather_hidden_kernel, but CTA b's share of every source moves
// in rounds of at most kAgDataThreads * kU vectors (30 KiB at kU = 4; piece_span: round k of CTA
// b is piece (k, b), interleaved over the grid) so that the copy-out of round k - 1
// (local HBM) overlaps the NVLink push of round k, and the release fence of each round's flag
// stalls only a signalling warp instead of the whole CTA:
//   data warps (1..15): push round k -> bar.arrive(A[k&1]) -> bar.sync(B[(k-1)&1]) -> copy-out
//                       of round k - 1 of every peer;   after the loop: copy-out of round K - 1
//   warp 0 (signals):   bar.sync(A[k&1]) -> data flag [b][rank] = (epoch, k) on every peer
//                       (st.release.sys: cumulative over the data warps' stores, which the named
//                       barrier ordered before it) -> wait data flags [b][s] >= (epoch, k) ->
//                       bar.arrive(B[k&1]) (the acquire is ordered before the data warps' reads).
// Two barrier ids per direction alternate by round parity: a warp can run at most one round
// ahead of the other side, so an id is never re-armed before its previous phase completed.
// Rounds of source s: piece_rounds(n_s, G, b, piece_span(n_s, G, kAgDataThreads * kU)) -- every
// rank computes the same counts from col_vec, so a receiver waits only for rounds its source
// will publish. Keeping the data warps two or three rounds ahead of their copy-out (more barrier
// ids) was measured and is slower (docs/COMM.md).
template <int kW, int kU>
__global__ void __launch_bounds__(kAgThreads, 1)
    all_gather_hidden_pipe_kernel(const __grid_constant__ AllGatherHiddenParams p) {
  __shared__ uint64_t s_epoch;
  __shared__ int s_abort;
  __shared__ int s_fail;
  constexpr uint32_t kRoundVec = kAgDataThreads * kU;  // 16-byte vectors per round per CTA
  const int tid = threadIdx.x;
  const int b = blockIdx.x;
  detail::pdl_enter();
  if (tid == 0) {
    detail::read_call(p, s_abort, s_epoch);
    s_fail = 0;
  }
  __syncthreads();
  if (s_abort) return;
  const uint64_t epoch = s_epoch;
  const int64_t buf_off = static_cast<int64_t>(epoch & 1) * p.buf_bytes;
  // Source s's n_s vectors in (t, c) order, in pieces of span_s <= kRoundVec interleaved over the
  // grid (piece_span): round k of CTA b is [(k G + b) span_s, + span_s) clipped to n_s, and CTA b
  // has piece_rounds(...) of them. Every rank computes the same spans and counts from col_vec.
  const int G = p.num_blocks;
  auto src_n = [&](int s) {
    return static_cast<uint32_t>(p.rows) * static_cast<uint32_t>(p.col_vec[s + 1] - p.col_vec[s]);
  };
  uint32_t nrounds = 0;  // K: rounds of this CTA (max over sources; the same on every rank)
#pragma unroll
  for (int s = 0; s < kW; ++s) {
    if (s < p.world) {
      const uint32_t n = src_n(s);
      const uint32_t r = detail::piece_rounds(n, G, b, detail::piece_span(n, G, kRoundVec));
      nrounds = r > nrounds ? r : nrounds;
    }
  }
  const uint32_t my_n = src_n(p.rank);
  const uint32_t my_span = detail::piece_span(my_n, G, kRoundVec);
  const uint32_t my_rounds = detail::piece_rounds(my_n, G, b, my_span);

  if (tid < 32) {
    // ---------------- signalling warp ----------------
    const int lane = tid;
    const bool peer = lane < p.world && lane != p.rank;
    uint32_t s_rounds = 0;
    const uint64_t hw = header_word(epoch, p.sig);
    if (peer) {
      const uint32_t n = src_n(lane);
      s_rounds = detail::piece_rounds(n, G, b, detail::piece_span(n, G, kRoundVec));
      // this call's header (before the first flag; also where this CTA publishes no round)
      detail::st_relaxed_sys(detail::hdr_slot(p.peer_flags[lane], epoch, b, p.rank), hw);
    }
    bool failed = false;
    for (uint32_t k = 0; k < nrounds; ++k) {
      detail::bar_sync(1 + (k & 1), kAgThreads);  // round k of my pieces pushed (data warps)
      const uint64_t fv = (epoch << kAgRoundBits) | (k + 1);
      if (peer && k < my_rounds)
        detail::st_release_sys(p.peer_flags[lane] + b * kAgMaxRanks + p.rank, fv);
      if (peer && !failed && k < s_rounds) {
        // round 0 also waits for the source's header (before any of its rounds is copied out)
        if (!detail::wait_flag_ge(
                p, p.my_flags + b * kAgMaxRanks + lane, fv, kAgErrTimeoutData, lane, epoch,
                k == 0 ? detail::hdr_slot(p.my_flags, epoch, b, lane) : nullptr, hw)) {
          failed = true;
          atomicOr(&s_fail, 1);  // shared atomic: no WAW race between waiting lanes
        }
      }
      __syncwarp();
      detail::bar_arrive(3 + (k & 1), kAgThreads);  // round k of every peer is here
    }
    return;
  }

  // ---------------- data warps ----------------
  const int dt = tid - 32;
  const uint32_t my_col0 = static_cast<uint32_t>(p.col_vec[p.rank]);
  const uint32_t my_wv = static_cast<uint32_t>(p.col_vec[p.rank + 1]) - my_col0;
  auto copy_out_round = [&](uint32_t k) {
#pragma unroll 1
    for (int s = 0; s < kW; ++s) {
      if (s >= p.world || s == p.rank) continue;
      const uint32_t col0 = static_cast<uint32_t>(p.col_vec[s]);
      const uint32_t wv = static_cast<uint32_t>(p.col_vec[s + 1]) - col0;
      const uint32_t n = src_n(s);
      const uint32_t span = detail::piece_span(n, G, kRoundVec);
      const uint32_t rlo = (k * G + b) * span;
      if (rlo >= n) continue;
      const uint32_t rhi = min(n, rlo + span);
      const uint8_t* buf = p.my_data + buf_off;
      uint4 v[kU];
      uint32_t tt[kU], cc[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const uint32_t i = rlo + dt + u * kAgDataThreads;
        if (i < rhi) {
          tt[u] = i / wv;
          cc[u] = col0 + (i - tt[u] * wv);
          v[u] = detail::ld_v4_cg(buf + (static_cast<int64_t>(tt[u]) * p.row_vec + cc[u]) * 16);
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (rlo + dt + u * kAgDataThreads < rhi)
          detail::st_v4(
              p.out + static_cast<int64_t>(tt[u]) * p.ldo + static_cast<int64_t>(cc[u]) * 16, v[u]);
      }
    }
  };
  for (uint32_t k = 0; k < nrounds; ++k) {
    // ---- push round k of my pieces: peers' buffers, and my own output directly ----
    const uint32_t rlo = (k * G + b) * my_span;
    if (k < my_rounds) {
      const uint32_t rhi = min(my_n, rlo + my_span);
      uint4 v[kU];
      uint32_t tt[kU], cc[kU];  // (row, column) of each vector: fewer live registers than pointers
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const uint32_t i = rlo + dt + u * kAgDataThreads;
        if (i < rhi) {
          tt[u] = i / my_wv;
          cc[u] = i - tt[u] * my_wv;
          v[u] = detail::ld_v4(p.x + static_cast<int64_t>(tt[u]) * p.ldx +
                               static_cast<int64_t>(cc[u]) * 16);
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (rlo + dt + u * kAgDataThreads < rhi) {
          const int64_t dst =
              buf_off + (static_cast<int64_t>(tt[u]) * p.row_vec + my_col0 + cc[u]) * 16;
#pragma unroll
          for (int q = 0; q < kW; ++q) {
            if (q < p.world) {
              if (q == p.rank)
                detail::st_v4(p.out + static_cast<int64_t>(tt[u]) * p.ldo +
                                  static_cast<int64_t>(my_col0 + cc[u]) * 16,
                              v[u]);
              else
                detail::st_v4(p.peer_data[q] + dst, v[u]);
            }
          }
        }
      }
    }
    detail::bar_arrive(1 + (k & 1), kAgThreads);
    // Every CTA read seq before the first barrier. Here the done-counter atomic's round trip
    // overlaps the signalling warp's publish and wait instead of delaying either.
    if (k == 0 && dt == 0) detail::advance_seq(p, epoch);
    if (k > 0) {
      detail::bar_sync(3 + ((k - 1) & 1), kAgThreads);
      if (!s_fail) copy_out_round(k - 1);
    }
  }
  if (nrounds == 0 && dt == 0) detail::advance_seq(p, epoch);
  if (nrounds > 0) {
    detail::bar_sync(3 + ((nrounds - 1) & 1), kAgThreads);
    if (!s_fail) copy_out_round(nrounds - 1);
  }
}

// Low-latency variant (flag kAgFlagLL; copy-out mode, P2P only): no barrier at all. The data
// travels in LL packets stamped with the call (6 data bytes + a 16-bit stamp f per 8-byte packet)
// into the LL region of parity epoch & 1 on every peer; the reader polls its own LL region until
// every packet of a group carries f, writes the group's vectors to the caller's output and zeroes
// the units. Costs 4/3 of the data bytes on the wire, saves the release/acquire round trip: the
// choice between the two protocols is the auto policy's (ops/comm.py, measured crossover).
//
// Groups: source s's n_s = rows * w_s vectors in (t, c) order make ng_s = ceil(n_s / 3) groups;
// group g holds vectors g, g + ng_s and g + 2 ng_s (zero-padded past n_s; strided, so that a
// warp's loads and output stores of each member are coalesced), chunked over the grid like the
// flag kernel's vectors (the sender's CTA b and every receiver's CTA b take the same groups).
// LL region (one parity, the same layout on every rank): source s's area starts at byte 64 * (floor(rows * col_vec[s] / 3)
// + s) (ll_region_bytes) and holds 4 planes of ng_s units: unit j of group g at (j * ng_s + g) *
// 16, so one warp-wide store or load of a plane covers 512 contiguous bytes -- whole 32-byte
// sectors. (The first LL kernel, kept as the kAgFlagLLPaired testing variant of the 4-byte one,
// put a vector's two units side by side, so that each instruction wrote half of every sector it
// touched; see COMM.md.)
//
// Stamps: f = ((epoch - 1 + sig) mod 65535) + 1, never 0 (sig: the call signature, so that a
// peer's packets of a call with other arguments do not match). Every unit a call writes is read
// and zeroed by its receiver in the same call, so between calls the regions hold zeros only: a
// unit that carries f was written in this call (a stale unit is 0; the zeroing, not a change of
// the stamp, is the guarantee). Ranks that call with different arguments are caught by the
// header word (each receiving thread checks its source's header of the call before its first
// output store; call_signature.h), which leaves the regions dirty: the communicator is then
// poisoned and must be recreated. Reuse of
// a parity region is safe by the same argument as the rotating gather buffers (header): a rank
// writes p's parity (e + 1) & 1 in call e + 1 only after finishing call e, which needed p's
// call-e packets, which p sent after its call e - 1 kernel (the last reader and zeroer of that
// parity) had ended.
template <int kW>
__global__ void __launch_bounds__(kAgThreads)
    all_gather_hidden_ll_kernel(const __grid_constant__ AllGatherHiddenParams p) {
  __shared__ uint64_t s_epoch;
  __shared__ int s_abort;
  const int tid = threadIdx.x;
  const int b = blockIdx.x;
  // My groups of chunk b, and their first batch loaded before the call counter is known (the two
  // loads overlap; at small T the first batch is all there is).
  const uint32_t my_col0 = static_cast<uint32_t>(p.col_vec[p.rank]);
  const uint32_t my_wv = static_cast<uint32_t>(p.col_vec[p.rank + 1]) - my_col0;
  const uint32_t my_n = static_cast<uint32_t>(p.rows) * my_wv;
  const uint32_t my_ng = (my_n + kLLGroupVec - 1) / kLLGroupVec;
  const uint32_t my_lo = detail::chunk_begin(my_ng, b, p.num_blocks);
  const uint32_t my_hi = detail::chunk_begin(my_ng, b + 1, p.num_blocks);
  // (row, column) of the first batch's vectors: parameters only, so before the dependency wait
  detail::RowCol my_step{0, 0}, rc[kLLUnroll][kLLGroupVec];
  if (my_wv) {
    my_step = detail::row_col(my_ng, my_wv);
#pragma unroll
    for (int u = 0; u < kLLUnroll; ++u) {
      const uint32_t g = my_lo + tid + u * kAgThreads;
      if (g < my_hi) detail::group_rc(g, my_wv, my_step, rc[u]);
    }
  }
  uint4 v[kLLUnroll][kLLGroupVec];
  detail::pdl_enter();
#pragma unroll
  for (int u = 0; u < kLLUnroll; ++u) {
    const uint32_t g = my_lo + tid + u * kAgThreads;
    if (g < my_hi) detail::load_x_group(p, g, my_ng, my_n, rc[u], v[u]);
  }
  if (tid == 0) detail::read_call(p, s_abort, s_epoch);
  __syncthreads();
  if (s_abort) return;
  const uint64_t epoch = s_epoch;
  // stamp: the call and its signature, so packets of a call with other arguments never match
  const uint32_t f = static_cast<uint32_t>((epoch - 1 + p.sig) % 0xFFFFull) + 1u;
  const int64_t par = p.ll_off + static_cast<int64_t>(epoch & 1) * p.ll_bytes;
  const int64_t rows = p.rows;
  const uint64_t hw = header_word(epoch, p.sig);
  if (tid < p.world && tid != p.rank)
    detail::st_relaxed_sys(detail::hdr_slot(p.peer_flags[tid], epoch, b, p.rank), hw);

  // ---- push my groups of chunk b: LL units to every peer, the vectors to my output ----
  {
    const int64_t area = par + 64 * (rows * my_col0 / kLLGroupVec + p.rank);
    const int64_t plane = static_cast<int64_t>(my_ng) * 16;
    for (uint32_t base = my_lo + tid; base < my_hi; base += kAgThreads * kLLUnroll) {
      if (base != my_lo + tid) {
#pragma unroll
        for (int u = 0; u < kLLUnroll; ++u) {
          const uint32_t g = base + u * kAgThreads;
          if (g < my_hi) {
            detail::group_rc(g, my_wv, my_step, rc[u]);
            detail::load_x_group(p, g, my_ng, my_n, rc[u], v[u]);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kLLUnroll; ++u) {
        const uint32_t g = base + u * kAgThreads;
        if (g < my_hi) {
          ulonglong2 unit[kLLGroupUnits];
          detail::ll6_pack(v[u], f, unit);
          const int64_t dst = area + static_cast<int64_t>(g) * 16;
#pragma unroll
          for (int q = 0; q < kW; ++q) {
            if (q < p.world && q != p.rank) {
#pragma unroll
              for (int j = 0; j < kLLGroupUnits; ++j)
                detail::st_ll(p.peer_data[q] + dst + j * plane, unit[j].x, unit[j].y);
            }
          }
#pragma unroll
          for (int j = 0; j < kLLGroupVec; ++j)
            if (g + j * my_ng < my_n) detail::st_v4(detail::out_at(p, rc[u][j], my_col0), v[u][j]);
        }
      }
    }
  }
  if (tid == 0) detail::advance_seq(p, epoch);

  // ---- receive chunk b of every peer's groups from the local LL region ----
  bool ok = true;
#pragma unroll 1
  for (int s = 0; s < kW; ++s) {
    if (s >= p.world || s == p.rank || !ok) continue;
    const uint32_t col0 = static_cast<uint32_t>(p.col_vec[s]);
    const uint32_t wv = static_cast<uint32_t>(p.col_vec[s + 1]) - col0;
    if (wv == 0) continue;  // (no groups; and row_col below divides by wv)
    const uint32_t n = static_cast<uint32_t>(p.rows) * wv;
    const uint32_t ng = (n + kLLGroupVec - 1) / kLLGroupVec;
    const uint32_t lo = detail::chunk_begin(ng, b, p.num_blocks);
    const uint32_t hi = detail::chunk_begin(ng, b + 1, p.num_blocks);
    uint8_t* area = p.my_data + par + 64 * (rows * col0 / kLLGroupVec + s);
    const int64_t plane = static_cast<int64_t>(ng) * 16;
    const detail::RowCol step = detail::row_col(ng, wv);
    // s's header of this call: every thread checks it itself before its first output store of
    // s (loaded with its first units; one transaction per warp), so no byte of a source that
    // called with other arguments reaches the output
    const uint64_t* hslot = detail::hdr_slot(p.my_flags, epoch, b, s);
    bool hok = false;
    uint64_t h = 0;
    for (uint32_t base = lo + tid; ok && base < hi; base += kAgThreads * kLLUnroll) {
      ulonglong2 a[kLLUnroll][kLLGroupUnits];
      detail::RowCol rcr[kLLUnroll][kLLGroupVec];
#pragma unroll
      for (int u = 0; u < kLLUnroll; ++u) {  // issue every load first, then wait
        const uint32_t g = base + u * kAgThreads;
        if (g < hi) {
#pragma unroll
          for (int j = 0; j < kLLGroupUnits; ++j)
            a[u][j] = detail::ld_ll(area + static_cast<int64_t>(g) * 16 + j * plane);
        }
      }
      if (!hok) h = detail::ld_relaxed_sys(hslot);
#pragma unroll
      for (int u = 0; u < kLLUnroll; ++u) {  // (row, column) math while the loads are in flight
        const uint32_t g = base + u * kAgThreads;
        if (g < hi) detail::group_rc(g, wv, step, rcr[u]);
      }
      if (!hok) {
        const int hs = header_state(h, hw);
        if (hs < 0) {
          detail::record_mismatch(p, s, epoch, h, kSigAllGatherCuda);
          ok = false;
        }
        hok = hs > 0;
      }
#pragma unroll
      for (int u = 0; u < kLLUnroll; ++u) {
        const uint32_t g = base + u * kAgThreads;
        if (g < hi && ok) {
          uint8_t* at = area + static_cast<int64_t>(g) * 16;
          if (!hok || !detail::ll6_ready(a[u], f)) {
            ok = detail::spin_ll(
                p,
                [&]() -> int {
                  if (!hok) {
                    h = detail::ld_relaxed_sys(hslot);
                    const int t = header_state(h, hw);
                    if (t < 0) {
                      detail::record_mismatch(p, s, epoch, h, kSigAllGatherCuda);
                      return -1;
                    }
                    hok = t > 0;
                  }
#pragma unroll
                  for (int j = 0; j < kLLGroupUnits; ++j) a[u][j] = detail::ld_ll(at + j * plane);
                  return hok && detail::ll6_ready(a[u], f) ? 1 : 0;
                },
                s, epoch);
          }
          if (ok) {
            uint4 d[kLLGroupVec];
            detail::ll6_unpack(a[u], d);
#pragma unroll
            for (int j = 0; j < kLLGroupVec; ++j)
              if (g + j * ng < n) detail::st_v4(detail::out_at(p, rcr[u][j], col0), d[j]);
#pragma unroll
            for (int j = 0; j < kLLGroupUnits; ++j)  // consumed: zero the group's units
              detail::st_v4(at + j * plane, make_uint4(0, 0, 0, 0));
          }
        }
      }
    }
  }
}

// LL protocol with 4-byte packets (kAgFlagLL | kAgFlagLL4; the host's pick for small outputs,
// where one vector per thread beats three): {data32 | flag32}, so each 16-byte data vector
// travels as two LL units (2x the bytes on the wire), stamp
// f = ((epoch - 1 + sig) mod (2^32 - 1)) + 1. Source s's area starts at byte 32 * rows * col_vec[s]
// and holds its n_s = rows * w_s vectors in (t, c) order; the two units of vector i sit in two
// planes (16 i and 16 (n_s + i)), or side by side at 32 i with kAgFlagLLPaired (the layout of
// the first LL kernel: each warp-wide store then covers half of every sector it touches).
// Same zeroing and parity-reuse argument as all_gather_hidden_ll_kernel.
template <int kW>
__global__ void __launch_bounds__(kAgThreads)
    all_gather_hidden_ll4_kernel(const __grid_constant__ AllGatherHiddenParams p) {
  __shared__ uint64_t s_epoch;
  __shared__ int s_abort;
  const int tid = threadIdx.x;
  const int b = blockIdx.x;
  const uint32_t my_col0 = static_cast<uint32_t>(p.col_vec[p.rank]);
  const uint32_t my_wv = static_cast<uint32_t>(p.col_vec[p.rank + 1]) - my_col0;
  const uint32_t my_n = static_cast<uint32_t>(p.rows) * my_wv;
  const uint32_t my_lo = my_wv ? detail::chunk_begin(my_n, b, p.num_blocks) : 0;
  const uint32_t my_hi = my_wv ? detail::chunk_begin(my_n, b + 1, p.num_blocks) : 0;
  const bool paired = (p.flags & kAgFlagLLPaired) != 0;
  const int64_t ustride = paired ? 32 : 16;  // bytes between consecutive vectors' first units
  // (row, column) of the first batch's vectors: parameters only, so before the dependency wait
  detail::RowCol my_step{0, 0}, rc[kAgUnroll];
  if (my_wv) {
    my_step = detail::row_col(kAgThreads, my_wv);
    detail::batch_rc(my_lo + tid, my_wv, my_step, rc);
  }
  uint4 v[kAgUnroll];
  detail::pdl_enter();
  detail::load_x_rc(p, my_lo + tid, my_hi, rc, v);
  if (tid == 0) detail::read_call(p, s_abort, s_epoch);
  __syncthreads();
  if (s_abort) return;
  const uint64_t epoch = s_epoch;
  // stamp: the call and its signature, so packets of a call with other arguments never match
  const uint32_t f = static_cast<uint32_t>((epoch - 1 + p.sig) % 0xFFFFFFFFull) + 1u;
  const int64_t par = p.ll_off + static_cast<int64_t>(epoch & 1) * p.ll_bytes;
  const int64_t rows = p.rows;
  const uint64_t hw = header_word(epoch, p.sig);
  if (tid < p.world && tid != p.rank)
    detail::st_relaxed_sys(detail::hdr_slot(p.peer_flags[tid], epoch, b, p.rank), hw);

  {
    const int64_t area = par + 2 * rows * my_col0 * 16;
    const int64_t second = paired ? 16 : static_cast<int64_t>(my_n) * 16;
    for (uint32_t base = my_lo + tid; base < my_hi; base += kAgThreads * kAgUnroll) {
      if (base != my_lo + tid) {
        detail::batch_rc(base, my_wv, my_step, rc);
        detail::load_x_rc(p, base, my_hi, rc, v);
      }
#pragma unroll
      for (int u = 0; u < kAgUnroll; ++u) {
        const uint32_t i = base + u * kAgThreads;
        if (i < my_hi) {
          const int64_t dst = area + static_cast<int64_t>(i) * ustride;
#pragma unroll
          for (int q = 0; q < kW; ++q) {
            if (q < p.world && q != p.rank) {
              detail::st_ll(p.peer_data[q] + dst, detail::pk(v[u].x, f), detail::pk(v[u].y, f));
              detail::st_ll(p.peer_data[q] + dst + second, detail::pk(v[u].z, f),
                            detail::pk(v[u].w, f));
            }
          }
          detail::st_v4(detail::out_at(p, rc[u], my_col0), v[u]);
        }
      }
    }
  }
  if (tid == 0) detail::advance_seq(p, epoch);

  bool ok = true;
#pragma unroll 1
  for (int s = 0; s < kW; ++s) {
    if (s >= p.world || s == p.rank || !ok) continue;
    const uint32_t col0 = static_cast<uint32_t>(p.col_vec[s]);
    const uint32_t wv = static_cast<uint32_t>(p.col_vec[s + 1]) - col0;
    if (wv == 0) continue;
    const uint32_t n = static_cast<uint32_t>(p.rows) * wv;
    const uint32_t lo = detail::chunk_begin(n, b, p.num_blocks);
    const uint32_t hi = detail::chunk_begin(n, b + 1, p.num_blocks);
    uint8_t* area = p.my_data + par + 2 * rows * col0 * 16;
    const int64_t second = paired ? 16 : static_cast<int64_t>(n) * 16;
    const detail::RowCol step = detail::row_col(kAgThreads, wv);
    // s's header of this call, checked by every thread before its first output store of s
    // (as in all_gather_hidden_ll_kernel)
    const uint64_t* hslot = detail::hdr_slot(p.my_flags, epoch, b, s);
    bool hok = false;
    uint64_t h = 0;
    for (uint32_t base = lo + tid; ok && base < hi; base += kAgThreads * kAgUnroll) {
      ulonglong2 a0[kAgUnroll], a1[kAgUnroll];
#pragma unroll
      for (int u = 0; u < kAgUnroll; ++u) {  // issue every load first, then wait
        const uint32_t i = base + u * kAgThreads;
        if (i < hi) {
          a0[u] = detail::ld_ll(area + static_cast<int64_t>(i) * ustride);
          a1[u] = detail::ld_ll(area + static_cast<int64_t>(i) * ustride + second);
        }
      }
      if (!hok) h = detail::ld_relaxed_sys(hslot);
      detail::RowCol rcr[kAgUnroll];  // (row, column) math while the loads are in flight
      detail::batch_rc(base, wv, step, rcr);
      if (!hok) {
        const int hs = header_state(h, hw);
        if (hs < 0) {
          detail::record_mismatch(p, s, epoch, h, kSigAllGatherCuda);
          ok = false;
        }
        hok = hs > 0;
      }
#pragma unroll
      for (int u = 0; u < kAgUnroll; ++u) {
        const uint32_t i = base + u * kAgThreads;
        if (i < hi && ok) {
          uint8_t* a = area + static_cast<int64_t>(i) * ustride;
          if (!hok || !detail::ll4_ready(a0[u], a1[u], f)) {
            ok = detail::spin_ll(
                p,
                [&]() -> int {
                  if (!hok) {
                    h = detail::ld_relaxed_sys(hslot);
                    const int t = header_state(h, hw);
                    if (t < 0) {
                      detail::record_mismatch(p, s, epoch, h, kSigAllGatherCuda);
                      return -1;
                    }
                    hok = t > 0;
                  }
                  a0[u] = detail::ld_ll(a);
                  a1[u] = detail::ld_ll(a + second);
                  return hok && detail::ll4_ready(a0[u], a1[u], f) ? 1 : 0;
                },
                s, epoch);
          }
          if (ok) {
            const uint4 d =
                make_uint4(static_cast<uint32_t>(a0[u].x), static_cast<uint32_t>(a0[u].y),
                           static_cast<uint32_t>(a1[u].x), static_cast<uint32_t>(a1[u].y));
            detail::st_v4(detail::out_at(p, rcr[u], col0), d);
            detail::st_v4(a, make_uint4(0, 0, 0, 0));  // consumed: zero both units
            detail::st_v4(a + second, make_uint4(0, 0, 0, 0));
          }
        }
      }
    }
  }
}

namespace detail {

// <<<grid, block, 0, stream>>>, plus the PDL launch attribute when `pdl` (flag kAgFlagPDL).
template <typename Kernel>
inline void launch(Kernel kernel, dim3 grid, dim3 block, cudaStream_t stream, bool pdl,
                   const AllGatherHiddenParams& p) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  (void)cudaLaunchKernelEx(&cfg, kernel, p);  // the caller reads cudaGetLastError()
}

}  // namespace detail

// Host launcher. The caller guarantees (and comm_ops.cu checks) the 16-byte alignment of every
// pointer, stride and column offset, that the buffers hold rows * row_vec vectors, and that every
// rank launches its calls in the same order. Calls with different rows, widths, num_blocks or
// kAgSigFlags bits on different ranks are detected through p.sig (ag_signature: the kernels
// record kAgErrMismatch or, where a peer's CTA or flag never comes, a timeout) as long as every
// rank computes p.sig from its own arguments.
inline cudaError_t launch_all_gather_hidden(const AllGatherHiddenParams& p, cudaStream_t stream) {
  if (p.world < 1 || p.world > kAgMaxRanks || p.rank < 0 || p.rank >= p.world || p.num_blocks < 1 ||
      p.num_blocks > kAgMaxBlocks || p.rows < 0 || p.state == nullptr)
    return cudaErrorInvalidValue;
  // Vector indices of a slice are 32-bit (piece_span). comm_ops.cu refuses such calls with a named
  // error (the whole output < 2^31 vectors); this guards direct callers such as bench/lab/tools/ag_micro.cu.
  for (int s = 0; s < p.world; ++s)
    if (int64_t(p.rows) * (p.col_vec[s + 1] - p.col_vec[s]) >= (int64_t(1) << 31))
      return cudaErrorInvalidValue;
  const bool view = (p.flags & kAgFlagView) != 0;
  const bool mm = (p.flags & kAgFlagMultimem) != 0;
  const bool ll = (p.flags & kAgFlagLL) != 0;
  if ((!view && p.out == nullptr && p.rows > 0) || (mm && p.mc_data == nullptr))
    return cudaErrorInvalidValue;
  const dim3 grid(p.num_blocks), block(kAgThreads);
  const bool pdl = (p.flags & kAgFlagPDL) != 0;
  if (ll) {
    if (view || mm || p.ll_bytes < ll_region_bytes(int64_t(p.rows) * p.row_vec, p.world) ||
        p.ll_off < 0 || p.ll_off % 16 != 0)
      return cudaErrorInvalidValue;
    const bool ll4 = (p.flags & kAgFlagLL4) != 0;
#define TS_AG_LAUNCH_LL(W)                                                          \
  do {                                                                              \
    if (ll4)                                                                        \
      detail::launch(all_gather_hidden_ll4_kernel<W>, grid, block, stream, pdl, p); \
    else                                                                            \
      detail::launch(all_gather_hidden_ll_kernel<W>, grid, block, stream, pdl, p);  \
  } while (0)
    if (p.world <= 2)
      TS_AG_LAUNCH_LL(2);
    else if (p.world <= 4)
      TS_AG_LAUNCH_LL(4);
    else if (p.world <= 8)
      TS_AG_LAUNCH_LL(8);
    else
      TS_AG_LAUNCH_LL(16);
#undef TS_AG_LAUNCH_LL
    return cudaGetLastError();
  }
  // Copy-out calls whose CTA chunks span more than two rounds go through the pipelined kernel.
  // Measured on 2x H200 (bench/lab/tools/comm_sweep.py): with 1.2 rounds it lost (22.1 -> 23.5 us, bf16
  // T = 32 x 151936), with 2.4 rounds it won (39.0 -> 38.5 us, fp32 T = 32), with 5-10 rounds
  // it won 7-11 % (bf16 / fp32 T = 128 x 151936); a single round gains nothing.
  int64_t max_chunk = 0;
  for (int s = 0; s < p.world; ++s)
    max_chunk = std::max<int64_t>(
        max_chunk,
        (int64_t(p.rows) * (p.col_vec[s + 1] - p.col_vec[s]) + p.num_blocks - 1) / p.num_blocks);
  const bool pipe = !mm && !view && !(p.flags & kAgFlagNoPipe) && max_chunk > 2 * kAgRoundVec;
  if (pipe && max_chunk / kAgRoundVec >= (int64_t(1) << kAgRoundBits) - 2)
    return cudaErrorInvalidValue;  // round numbers would overflow the flag's round field
#define TS_AG_LAUNCH(W)                                                                         \
  do {                                                                                          \
    if (pipe)                                                                                   \
      detail::launch(all_gather_hidden_pipe_kernel<W, kAgUnroll>, grid, block, stream, pdl, p); \
    else if (mm)                                                                                \
      detail::launch(all_gather_hidden_kernel<W, true>, grid, block, stream, pdl, p);           \
    else                                                                                        \
      detail::launch(all_gather_hidden_kernel<W, false>, grid, block, stream, pdl, p);          \
  } while (0)
  if (p.world <= 1)
    TS_AG_LAUNCH(1);
  else if (p.world <= 2)
    TS_AG_LAUNCH(2);
  else if (p.world <= 4)
    TS_AG_LAUNCH(4);
  else if (p.world <= 8)
    TS_AG_LAUNCH(8);
  else
    TS_AG_LAUNCH(16);
#undef TS_AG_LAUNCH
  return cudaGetLastError();
}

}  // namespace tokenspeed_kernel::comm
