// DP sampling: the vocab -> batch swap and the results gather (one-sided pushes over P2P).
//
// Torch-free: raw pointers, byte strides, a cudaStream_t; returns cudaError_t. The torch adapter
// is dp_ops.cu; workspace, validation and backend choice are python/tokenspeed_kernel/ops/dp.py;
// the protocol is written down in docs/COMM.md ("DP sampling").
//
// Every rank r of a tensor-parallel group of W ranks holds x_r[B, w] (its vocab shard, the same
// width w on every rank). Destination d owns the rows [d Bl, d Bl + n_d) (Bl = rows per rank,
// n_d = clamp(B - d Bl, 0, Bl)) and wants them whole: recv_d[i, r w : (r + 1) w] = x_r[d Bl + i, :].
//
// Workspace of one communicator, identical layout on every rank (symmetric memory):
//   flags [kDpFlagBytes]      uint64 words, see below
//   recv  [recv_bytes]        the swap buffer: this rank's rows (pitch row_bytes); the swap's
//                             output is a view of it
//   res   [2][res_bytes]      results sections of the gather, rotating by call parity
// Flag words (on rank p, written by peers with st.release.sys, read by p with ld.acquire.sys):
//   swap  [b][s] = e : rank s has stored its pieces b of swap call e into p's recv buffer
//   ready [b][s] = e : rank s has entered swap call e, so it is done with its view of call e - 1
//   swap' / ready'   : the Triton swap's flags (its partition differs)
//   gather [s]   = g : rank s has stored its results of gather call g into p's res buffer (g & 1)
//   hdr [e & 1][b][s] = (e << 32) | sig : swap call e's signature of rank s's CTA b (either
//                  backend; call_signature.h), written before the entry handshake's ready flag and
//                  compared before anything is pushed
//   ghdr [g & 1][s]    : the same for gather call g, written before gather[s], compared before the
//                  copy-out
// Local (non-symmetric) state, int64[kDpStateWords]: the swap's words at 0, the gather's at
// kDpGatherState: [seq, err, err_block, err_src, err_epoch, err_sig, err_peer_sig, err_rows,
// done-counter, err_per_rank, err_extra, ...]. seq counts completed calls; call e = seq + 1 is
// read on the device (CUDA-graph replays advance it).
//
// Safety. The swap's output is a view of recv, read by kernels the caller enqueues after the
// swap (the sampler), so its address must not depend on the call (graph replays): one buffer
// and an entry handshake, like the all-gather's view mode. CTA b of rank p first publishes
// ready[b][p] = e on every rank -- p's kernel runs only after everything p enqueued before it,
// so p's readers of view e - 1 are done -- and pushes into rank d only after it has seen
// ready[b][d] >= e. Then it publishes swap[b][p] = e and waits for swap[b][s] >= e of every s:
// together the CTAs cover every piece, so when the grid has finished the view is complete. The
// view of call e is valid for all work enqueued on p's stream before p's next swap. The gather
// copies its results out inside the kernel, so it uses two rotating buffers and no handshake
// (the all-gather's copy-out argument: a rank runs at most one call ahead of any peer).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "call_signature.h"

namespace tokenspeed_kernel::comm {

constexpr int kDpMaxRanks = 16;
constexpr int kDpMaxBlocks = 256;
constexpr int kDpThreads = 512;
constexpr int kDpUnroll = 4;
constexpr int kDpMaxFields = 8;
constexpr int64_t kDpSlots = int64_t(kDpMaxBlocks) * kDpMaxRanks;  // one [b][s] table
constexpr int64_t kDpSwapFlags = 0;                                // uint64 words
constexpr int64_t kDpReadyFlags = kDpSlots;
constexpr int64_t kDpTritonSwapFlags = 2 * kDpSlots;
constexpr int64_t kDpTritonReadyFlags = 3 * kDpSlots;
constexpr int64_t kDpGatherFlags = 4 * kDpSlots;
constexpr int64_t kDpHeaders = kDpGatherFlags + 256;             // [2 parities][b][s]
constexpr int64_t kDpGatherHeaders = kDpHeaders + 2 * kDpSlots;  // [2 parities][s]
constexpr int64_t kDpFlagBytes = (kDpGatherHeaders + 256) * 8;   // 196 KiB
constexpr int kDpStateWords = 32;
constexpr int kDpGatherState = 16;
// words within a kernel's state block (the all-gather's layout)
constexpr int kDpSeq = 0, kDpErr = 1, kDpErrBlock = 2, kDpErrSrc = 3, kDpErrEpoch = 4, kDpDone = 8;
// mismatch details: this rank's signature, the source's, B (items), rows (items) per rank, and
// the slot (swap) / the number of fields (gather)
constexpr int kDpErrSig = 5, kDpErrPeerSig = 6, kDpErrRows = 7, kDpErrPerRank = 9, kDpErrExtra = 10;
constexpr int kDpErrTimeoutSwap = 1;
constexpr int kDpErrTimeoutReady = 2;
constexpr int kDpErrTimeoutGather = 3;
constexpr int kDpErrMismatch = 4;  // a peer's header of this call carries another signature
constexpr int kDpFlagTrap = 4;     // __trap() after recording a timeout (default: flag only)

struct DpSwapParams {
  const uint8_t* x;  // [rows, shard] (byte row stride ldx)
  int64_t ldx;
  uint8_t* peer_recv[kDpMaxRanks];    // recv buffer of each rank, in this address space
  uint64_t* peer_flags[kDpMaxRanks];  // flag region of each rank
  int64_t* state;                     // local int64[kDpStateWords]
  int64_t row_bytes;                  // recv row pitch
  int32_t shard_units;                // units of U bytes per shard row
  int32_t rows;                       // B
  int32_t rows_per_rank;              // Bl
  int32_t world;
  int32_t rank;
  int32_t num_blocks;  // the same on every rank for a given call
  int32_t flags;
  int64_t timeout_ns;  // bounded wait; <= 0 waits forever
  uint32_t sig;        // the call's signature (dp_swap_signature)
  int32_t slot;        // the swap buffer's slot (for error reports; part of sig)
};

struct DpGatherParams {
  const uint8_t* src[kDpMaxFields];  // this rank's items of field f: [n_rank * item_bytes[f]]
  uint8_t* out[kDpMaxFields];        // every rank's items: [items * item_bytes[f]]
  int64_t res_off[kDpMaxFields];     // byte offset of field f in a res buffer
  int32_t item_bytes[kDpMaxFields];
  int32_t nfields;
  uint8_t* peer_res[kDpMaxRanks];     // res buffer 0 of each rank
  uint64_t* peer_flags[kDpMaxRanks];  // flag region of each rank
  int64_t* state;                     // local int64[kDpStateWords] (the gather uses its block)
  int64_t res_bytes;                  // one res buffer (the parity stride)
  int32_t items;                      // B
  int32_t items_per_rank;             // Bl
  int32_t world;
  int32_t rank;
  int32_t flags;
  int64_t timeout_ns;
  uint32_t sig;  // the call's signature (dp_gather_signature)
};

namespace dp {

// (The all-gather's primitives, repeated: all_gather_hidden.cuh defines a non-inline device
// function and cannot be included by a second translation unit.)
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
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

// header words (self-validating: they carry the epoch)
__device__ __forceinline__ void st_relaxed_sys(uint64_t* addr, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(addr), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* addr) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(addr) : "memory");
  return v;
}

// What a mismatch record says about this rank's call.
struct CallInfo {
  uint32_t sig;
  int32_t rows, per_rank, extra;
};

// floor(n * b / g) without 64-bit division (g <= kDpMaxBlocks, so (n % g) * b < 2^16).
__device__ __forceinline__ uint32_t chunk_begin(uint32_t n, int b, int g) {
  const uint32_t ug = static_cast<uint32_t>(g), ub = static_cast<uint32_t>(b);
  const uint32_t q = n / ug;
  return q * ub + ((n - q * ug) * ub) / ug;
}

template <int U>
struct Unit;
template <>
struct Unit<16> {
  using T = uint4;
};
template <>
struct Unit<4> {
  using T = uint32_t;
};
template <>
struct Unit<2> {
  using T = uint16_t;
};

// Either kernel's error makes the communicator unusable: both kernels check both words.
__device__ __forceinline__ bool poisoned(const int64_t* state) {
  return ld_relaxed_gpu(state + kDpErr) != 0 ||
         ld_relaxed_gpu(state + kDpGatherState + kDpErr) != 0;
}

static __device__ __noinline__ void record_timeout(int64_t* st, int code, int src, uint64_t epoch,
                                                   int rank, int64_t timeout_ns, int flags) {
  unsigned long long* err = reinterpret_cast<unsigned long long*>(st + kDpErr);
  if (atomicCAS(err, 0ull, static_cast<unsigned long long>(code)) == 0ull) {
    st[kDpErrBlock] = blockIdx.x;
    st[kDpErrSrc] = src;
    st[kDpErrEpoch] = static_cast<int64_t>(epoch);
    __threadfence_system();
    printf(
        "[tokenspeed_kernel] %s: rank %d block %d gave up after %lld ns waiting for rank %d "
        "(call %llu); the communicator is now unusable\n",
        code == kDpErrTimeoutGather ? "dp gather" : "swap_vocab_to_batch", rank,
        static_cast<int>(blockIdx.x), static_cast<long long>(timeout_ns), src,
        static_cast<unsigned long long>(epoch));
  }
  if (flags & kDpFlagTrap) __trap();
}

static __device__ __noinline__ void record_mismatch(int64_t* st, int src, uint64_t epoch,
                                                    uint64_t peer_hdr, const CallInfo& ci,
                                                    bool gather, int rank, int flags) {
  unsigned long long* err = reinterpret_cast<unsigned long long*>(st + kDpErr);
  if (atomicCAS(err, 0ull, static_cast<unsigned long long>(kDpErrMismatch)) == 0ull) {
    st[kDpErrBlock] = blockIdx.x;
    st[kDpErrSrc] = src;
    st[kDpErrEpoch] = static_cast<int64_t>(epoch);
    st[kDpErrSig] = ci.sig;
    st[kDpErrPeerSig] = static_cast<int64_t>(peer_hdr & 0xFFFFFFFFull);
    st[kDpErrRows] = ci.rows;
    st[kDpErrPerRank] = ci.per_rank;
    st[kDpErrExtra] = ci.extra;
    __threadfence_system();
    printf(
        "[tokenspeed_kernel] %s: rank %d block %d: rank %d joined call %llu with other arguments "
        "(signature %08x, this rank %08x, %d rows); the communicator is now unusable\n",
        gather ? "dp gather" : "swap_vocab_to_batch", rank, static_cast<int>(blockIdx.x), src,
        static_cast<unsigned long long>(epoch), static_cast<unsigned>(peer_hdr & 0xFFFFFFFFull),
        ci.sig, ci.rows);
  }
  if (flags & kDpFlagTrap) __trap();
}

// Spin until *flag >= target and, with `hdr`, until the header slot holds this call's word
// `want` (polled together with the flag; a header of this call with another signature fails at
// once: record_mismatch); bounded by timeout_ns (%globaltimer), or until another block of this
// rank recorded an error.
__device__ __forceinline__ bool wait_ge(const uint64_t* flag, uint64_t target, int64_t* st,
                                        const int64_t* state0, int code, int src, uint64_t epoch,
                                        int rank, int64_t timeout_ns, int flags,
                                        const uint64_t* hdr = nullptr, uint64_t want = 0,
                                        const CallInfo* ci = nullptr) {
  bool hok = hdr == nullptr;
  uint64_t h = 0;
  if (!hok) h = ld_relaxed_sys(hdr);
  bool fok = ld_acquire_sys(flag) >= target;
  uint64_t start = 0;
  for (uint32_t it = 0;; ++it) {
    if (!hok) {
      const int hs = header_state(h, want);
      if (hs < 0) {
        record_mismatch(st, src, epoch, h, *ci, code == kDpErrTimeoutGather, rank, flags);
        return false;
      }
      hok = hs > 0;
    }
    if (fok && hok) return true;
    if (it == 0) start = globaltimer_ns();
    if (!hok) h = ld_relaxed_sys(hdr);
    if (!fok) fok = ld_acquire_sys(flag) >= target;
    if ((it & 63u) == 63u) {
      if (poisoned(state0)) return false;
      if (timeout_ns > 0 && globaltimer_ns() - start > static_cast<uint64_t>(timeout_ns)) {
        record_timeout(st, code, src, epoch, rank, timeout_ns, flags);
        return false;
      }
    }
  }
}

// Last CTA of a launch advances the call counter (each CTA counts itself in after reading seq).
__device__ __forceinline__ void advance_seq(int64_t* st, int num_blocks, uint64_t epoch) {
  if (num_blocks == 1) {
    st[kDpSeq] = static_cast<int64_t>(epoch);
    return;
  }
  const unsigned long long prev =
      atomicAdd(reinterpret_cast<unsigned long long*>(st + kDpDone), 1ull);
  if (prev == static_cast<unsigned long long>(num_blocks - 1)) {
    st[kDpDone] = 0;
    st[kDpSeq] = static_cast<int64_t>(epoch);
  }
}

// Copies nbytes from src to dst with this CTA's threads: U-byte units when both addresses and
// the size allow, else bytes. (The gather's sections are small: tokens, flags, logprobs.)
__device__ __forceinline__ void cta_copy(uint8_t* dst, const uint8_t* src, int64_t nbytes,
                                         bool src_remote_written) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) |
                      static_cast<uintptr_t>(nbytes);
  if ((a & 15u) == 0) {
    const int64_t n = nbytes >> 4;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint4 v = src_remote_written ? __ldcg(reinterpret_cast<const uint4*>(src) + i)
                                         : reinterpret_cast<const uint4*>(src)[i];
      reinterpret_cast<uint4*>(dst)[i] = v;
    }
  } else if ((a & 3u) == 0) {
    const int64_t n = nbytes >> 2;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const unsigned int v = src_remote_written
                                 ? __ldcg(reinterpret_cast<const unsigned int*>(src) + i)
                                 : reinterpret_cast<const unsigned int*>(src)[i];
      reinterpret_cast<unsigned int*>(dst)[i] = v;
    }
  } else {
    for (int64_t i = threadIdx.x; i < nbytes; i += blockDim.x) {
      const unsigned char v =
          src_remote_written ? __ldcg(reinterpret_cast<const unsigned char*>(src) + i) : src[i];
      dst[i] = v;
    }
  }
}

// Zeroes nbytes at dst with this CTA's threads (16- / 4- / 1-byte stores as alignment allows).
__device__ __forceinline__ void cta_zero(uint8_t* dst, int64_t nbytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst) | static_cast<uintptr_t>(nbytes);
  if ((a & 15u) == 0) {
    for (int64_t i = threadIdx.x; i < (nbytes >> 4); i += blockDim.x)
      reinterpret_cast<uint4*>(dst)[i] = make_uint4(0u, 0u, 0u, 0u);
  } else if ((a & 3u) == 0) {
    for (int64_t i = threadIdx.x; i < (nbytes >> 2); i += blockDim.x)
      reinterpret_cast<unsigned int*>(dst)[i] = 0u;
  } else {
    for (int64_t i = threadIdx.x; i < nbytes; i += blockDim.x) dst[i] = 0;
  }
}

__host__ __device__ __forceinline__ int32_t rows_of(int32_t rows, int32_t per_rank, int32_t d) {
  const int64_t n = int64_t(rows) - int64_t(d) * per_rank;
  return n <= 0 ? 0 : (n < per_rank ? static_cast<int32_t>(n) : per_rank);
}

}  // namespace dp

// CTA b: entry handshake (ready[b][*], see Safety above), then pushes units
// [chunk_begin(n, b, G), chunk_begin(n, b + 1, G)) of the (row, unit) space of one destination's
// block (n = Bl * shard_units) to every destination d (its rows d Bl + i), then publishes
// swap[b][rank] = e on every rank and waits until swap[b][s] >= e for every s.
template <int U>
__global__ void __launch_bounds__(kDpThreads, 1)
    dp_swap_kernel(const __grid_constant__ DpSwapParams p) {
  using T = typename dp::Unit<U>::T;
  __shared__ uint64_t s_epoch;
  __shared__ int s_abort;
  __shared__ int s_fail;
  const int tid = threadIdx.x;
  const int b = blockIdx.x;
  if (tid == 0) {
    s_abort = dp::poisoned(p.state);
    s_epoch = static_cast<uint64_t>(dp::ld_relaxed_gpu(p.state + kDpSeq)) + 1;
    s_fail = 0;
  }
  __syncthreads();
  if (s_abort) return;
  const uint64_t epoch = s_epoch;
  uint64_t* my_flags = p.peer_flags[p.rank];
  if (tid < p.world) {  // entry handshake, with this call's header (compared before any push)
    const uint64_t hw = header_word(epoch, p.sig);
    const int64_t hslot = kDpHeaders + static_cast<int64_t>(epoch & 1) * kDpSlots + b * kDpMaxRanks;
    const dp::CallInfo ci{p.sig, p.rows, p.rows_per_rank, p.slot};
    dp::st_relaxed_sys(p.peer_flags[tid] + hslot + p.rank, hw);
    dp::st_release_sys(p.peer_flags[tid] + kDpReadyFlags + b * kDpMaxRanks + p.rank, epoch);
    if (!dp::wait_ge(my_flags + kDpReadyFlags + b * kDpMaxRanks + tid, epoch, p.state, p.state,
                     kDpErrTimeoutReady, tid, epoch, p.rank, p.timeout_ns, p.flags,
                     my_flags + hslot + tid, hw, &ci))
      atomicOr(&s_fail, 1);
  }
  __syncthreads();
  if (s_fail) return;
  const uint32_t su = static_cast<uint32_t>(p.shard_units);
  const uint32_t n = static_cast<uint32_t>(p.rows_per_rank) * su;
  const uint32_t lo = dp::chunk_begin(n, b, p.num_blocks);
  const uint32_t hi = dp::chunk_begin(n, b + 1, p.num_blocks);
  const int64_t col_off = static_cast<int64_t>(p.rank) * su * U;
  for (int k = 0; k < p.world; ++k) {
    const int d = (p.rank + 1 + k) % p.world;  // peers first, my own rows last
    const uint32_t nd = static_cast<uint32_t>(dp::rows_of(p.rows, p.rows_per_rank, d)) * su;
    const uint32_t hid = hi < nd ? hi : nd;
    const uint8_t* xs = p.x + static_cast<int64_t>(d) * p.rows_per_rank * p.ldx;
    uint8_t* dst = p.peer_recv[d] + col_off;
    for (uint32_t base = lo + tid; base < hid; base += kDpThreads * kDpUnroll) {
      T v[kDpUnroll];
      uint32_t t[kDpUnroll], c[kDpUnroll];
#pragma unroll
      for (int u = 0; u < kDpUnroll; ++u) {
        const uint32_t i = base + u * kDpThreads;
        if (i < hid) {
          t[u] = i / su;
          c[u] = i - t[u] * su;
          v[u] = *reinterpret_cast<const T*>(xs + static_cast<int64_t>(t[u]) * p.ldx +
                                             static_cast<int64_t>(c[u]) * U);
        }
      }
#pragma unroll
      for (int u = 0; u < kDpUnroll; ++u) {
        if (base + u * kDpThreads < hid)
          *reinterpret_cast<T*>(dst + static_cast<int64_t>(t[u]) * p.row_bytes +
                                static_cast<int64_t>(c[u]) * U) = v[u];
      }
    }
  }
  __syncthreads();  // every thread's stores precede the releases below (cumulativity)
  if (tid == 32 % kDpThreads) dp::advance_seq(p.state, p.num_blocks, epoch);
  if (tid < p.world) {
    dp::st_release_sys(p.peer_flags[tid] + kDpSwapFlags + b * kDpMaxRanks + p.rank, epoch);
    dp::wait_ge(my_flags + kDpSwapFlags + b * kDpMaxRanks + tid, epoch, p.state, p.state,
                kDpErrTimeoutSwap, tid, epoch, p.rank, p.timeout_ns, p.flags);
  }
  // (Nothing follows: the grid's completion publishes the acquired data to the next kernels.)
}

// One CTA: stores this rank's items of every field into every peer's res buffer (g & 1) at the
// rank's section (its own straight into the outputs), publishes gather[rank] = g on every rank,
// waits for gather[s] >= g of every s, then copies the peers' sections into the outputs. A
// failed wait zeroes the peers' sections instead; on a poisoned communicator the kernel
// zeroes every output and moves nothing (zero bytes: token 0, valid false, logprob 0).
__global__ void __launch_bounds__(kDpThreads, 1)
    dp_gather_kernel(const __grid_constant__ DpGatherParams p) {
  __shared__ uint64_t s_epoch;
  __shared__ int s_abort;
  __shared__ int s_fail;
  const int tid = threadIdx.x;
  int64_t* st = p.state + kDpGatherState;
  if (tid == 0) {
    s_abort = dp::poisoned(p.state);
    s_epoch = static_cast<uint64_t>(dp::ld_relaxed_gpu(st + kDpSeq)) + 1;
    s_fail = 0;
  }
  __syncthreads();
  if (s_abort) {  // poisoned (this call's swap or an earlier call failed): every item invalid
    for (int f = 0; f < p.nfields; ++f)
      dp::cta_zero(p.out[f], static_cast<int64_t>(p.items) * p.item_bytes[f]);
    return;
  }
  const uint64_t epoch = s_epoch;
  const int64_t par_off = static_cast<int64_t>(epoch & 1) * p.res_bytes;
  const int32_t n_me = dp::rows_of(p.items, p.items_per_rank, p.rank);
  for (int f = 0; f < p.nfields; ++f) {
    const int64_t ib = p.item_bytes[f];
    const int64_t sec = static_cast<int64_t>(p.rank) * p.items_per_rank * ib;
    for (int k = 0; k < p.world; ++k) {
      const int d = (p.rank + 1 + k) % p.world;
      uint8_t* dst = d == p.rank ? p.out[f] + sec : p.peer_res[d] + par_off + p.res_off[f] + sec;
      dp::cta_copy(dst, p.src[f], n_me * ib, false);
    }
  }
  __syncthreads();
  if (tid == 32 % kDpThreads) dp::advance_seq(st, 1, epoch);
  if (tid < p.world) {  // publish with this call's header; wait, comparing the peers' headers
    const uint64_t hw = header_word(epoch, p.sig);
    const int64_t hslot = kDpGatherHeaders + static_cast<int64_t>(epoch & 1) * kDpMaxRanks;
    const dp::CallInfo ci{p.sig, p.items, p.items_per_rank, p.nfields};
    dp::st_relaxed_sys(p.peer_flags[tid] + hslot + p.rank, hw);
    dp::st_release_sys(p.peer_flags[tid] + kDpGatherFlags + p.rank, epoch);
    if (!dp::wait_ge(p.peer_flags[p.rank] + kDpGatherFlags + tid, epoch, st, p.state,
                     kDpErrTimeoutGather, tid, epoch, p.rank, p.timeout_ns, p.flags,
                     p.peer_flags[p.rank] + hslot + tid, hw, &ci))
      atomicOr(&s_fail, 1);
  }
  __syncthreads();
  // Copy the peers' sections out; after a failed wait (timeout, mismatch) zero them instead:
  // the outputs never hold a peer's stale or foreign bytes (tokens 0, valid false).
  const bool fail = s_fail != 0;
  const uint8_t* mine = p.peer_res[p.rank] + par_off;
  for (int s = 0; s < p.world; ++s) {
    if (s == p.rank) continue;
    const int32_t ns = dp::rows_of(p.items, p.items_per_rank, s);
    for (int f = 0; f < p.nfields; ++f) {
      const int64_t ib = p.item_bytes[f];
      const int64_t sec = static_cast<int64_t>(s) * p.items_per_rank * ib;
      if (fail)
        dp::cta_zero(p.out[f] + sec, ns * ib);
      else
        dp::cta_copy(p.out[f] + sec, mine + p.res_off[f] + sec, ns * ib, true);
    }
  }
}

// Unit size of a swap call: the widest of 16 / 4 / 2 bytes that divides the shard row, the row
// strides and the addresses.
inline int dp_swap_unit(const DpSwapParams& p) {
  const int64_t sb = static_cast<int64_t>(p.shard_units);  // (in bytes when called by the host)
  const uintptr_t a = reinterpret_cast<uintptr_t>(p.x) | static_cast<uintptr_t>(p.ldx) |
                      static_cast<uintptr_t>(sb) | static_cast<uintptr_t>(p.row_bytes);
  if ((a & 15u) == 0) return 16;
  if ((a & 3u) == 0) return 4;
  return (a & 1u) == 0 ? 2 : 1;
}

// p.shard_units holds the shard row's BYTES on entry; the launcher converts it to units.
inline cudaError_t launch_dp_swap(DpSwapParams p, cudaStream_t stream) {
  if (p.world < 1 || p.world > kDpMaxRanks || p.rank < 0 || p.rank >= p.world || p.num_blocks < 1 ||
      p.num_blocks > kDpMaxBlocks || p.rows < 0 || p.rows_per_rank < 0 || p.state == nullptr ||
      p.shard_units < 0)
    return cudaErrorInvalidValue;
  const int U = dp_swap_unit(p);
  if (U == 1) return cudaErrorInvalidValue;  // element sizes are 2 or 4 bytes
  if (int64_t(p.rows_per_rank) * (p.shard_units / U) >= (int64_t(1) << 31))
    return cudaErrorInvalidValue;
  p.shard_units /= U;
  const dim3 grid(p.num_blocks), block(kDpThreads);
  if (U == 16)
    dp_swap_kernel<16><<<grid, block, 0, stream>>>(p);
  else if (U == 4)
    dp_swap_kernel<4><<<grid, block, 0, stream>>>(p);
  else
    dp_swap_kernel<2><<<grid, block, 0, stream>>>(p);
  return cudaGetLastError();
}

inline cudaError_t launch_dp_gather(const DpGatherParams& p, cudaStream_t stream) {
  if (p.world < 1 || p.world > kDpMaxRanks || p.rank < 0 || p.rank >= p.world || p.nfields < 1 ||
      p.nfields > kDpMaxFields || p.items < 0 || p.items_per_rank < 0 || p.state == nullptr)
    return cudaErrorInvalidValue;
  dp_gather_kernel<<<1, kDpThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tokenspeed_kernel::comm
