// Per-call signatures of the comm kernels: detection of ranks that call with different arguments.
//
// Torch-free, host and device. Shared by all_gather_hidden.cuh and dp_swap.cuh; mirrored in
// python/tokenspeed_kernel/ops/comm.py (call_signature, all_gather_signature) and ops/dp.py
// (swap_signature, gather_signature) -- tests/test_comm.py compiles this header on the host and
// compares the values. Protocol: docs/COMM.md ("Per-call mismatches").
//
// The host computes a 32-bit signature of everything a peer must agree on for one call (the
// kernel kind, the protocol / packing bits, T, the column offsets, the element size, the grid;
// DP: rows, rows per rank, slot, results layout): the CRC-32 of those values as little-endian
// 32-bit words. CRC-32 detects every error burst of at most 32 bits, so two argument lists that
// differ in one word always get different signatures; lists that differ in several words collide
// with probability ~2^-32.
//
// Every sender CTA stores a header word (epoch << 32) | signature into each peer's header slot
// [epoch & 1][block][sender] before it releases its first flag of the call; the receiver polls
// that slot together with the flag and compares it with its own word. The parity index keeps
// call e's header in place while a peer runs one call ahead (the rotating-buffer argument), and
// the epoch in the upper half tells a header of this call from one of call e - 2: the receiver
// needs no ordering of the header against the flag, it waits until the header carries this call.
#pragma once

#include <cstdint>

namespace tokenspeed_kernel::comm {

// Kernel kinds folded into the signature: kernels whose partitions or flags differ get different
// kinds, so ranks that disagree on the backend of one call are told so instead of timing out.
// (The CUDA and Triton results gathers share one layout and their flags, so they share a kind.)
constexpr uint32_t kSigAllGatherCuda = 1;
constexpr uint32_t kSigAllGatherTriton = 2;
constexpr uint32_t kSigDpSwapCuda = 3;
constexpr uint32_t kSigDpSwapTriton = 4;
constexpr uint32_t kSigDpGather = 5;

namespace sig {

struct Crc32Table {
  uint32_t t[256];
  constexpr Crc32Table() : t{} {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
      t[i] = c;
    }
  }
};
inline constexpr Crc32Table kCrc32{};

// zlib's crc32 of the little-endian bytes of w[0..n) (Python: zlib.crc32(struct.pack("<nI", ...)))
inline uint32_t crc32_words(const uint32_t* w, int n) {
  uint32_t c = 0xFFFFFFFFu;
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < 4; ++k) c = kCrc32.t[(c ^ (w[i] >> (8 * k))) & 0xFFu] ^ (c >> 8);
  }
  return ~c;
}

}  // namespace sig

// The all-gather: kind (kSigAllGatherCuda / kSigAllGatherTriton), the layout-changing flag bits
// (the caller masks them), element size, T, grid size, world and the world + 1 column offsets in
// elements.
inline uint32_t ag_signature(uint32_t kind, uint32_t variant, int64_t elt, int64_t rows,
                             int64_t num_blocks, int world, const int64_t* col_offsets) {
  uint32_t w[8 + 17];
  int n = 0;
  w[n++] = kind;
  w[n++] = variant;
  w[n++] = static_cast<uint32_t>(elt);
  w[n++] = static_cast<uint32_t>(rows);
  w[n++] = static_cast<uint32_t>(num_blocks);
  w[n++] = static_cast<uint32_t>(world);
  for (int s = 0; s <= world && s <= 16; ++s) w[n++] = static_cast<uint32_t>(col_offsets[s]);
  return sig::crc32_words(w, n);
}

// The DP swap: kind (kSigDpSwapCuda / kSigDpSwapTriton), B, rows per rank, shard bytes, the
// swap buffer's row pitch, the slot, grid size and world.
inline uint32_t dp_swap_signature(uint32_t kind, int64_t rows, int64_t rows_per_rank,
                                  int64_t shard_bytes, int64_t row_bytes, int64_t slot,
                                  int64_t num_blocks, int world) {
  const uint32_t w[8] = {kind,
                         static_cast<uint32_t>(rows),
                         static_cast<uint32_t>(rows_per_rank),
                         static_cast<uint32_t>(shard_bytes),
                         static_cast<uint32_t>(row_bytes),
                         static_cast<uint32_t>(slot),
                         static_cast<uint32_t>(num_blocks),
                         static_cast<uint32_t>(world)};
  return sig::crc32_words(w, 8);
}

// The DP results gather (either backend): items, items per rank, world, the number of fields and
// each field's item bytes and byte offset in a results buffer.
inline uint32_t dp_gather_signature(int64_t items, int64_t items_per_rank, int world, int nfields,
                                    const int64_t* item_bytes, const int64_t* res_off) {
  uint32_t w[5 + 2 * 8];
  int n = 0;
  w[n++] = kSigDpGather;
  w[n++] = static_cast<uint32_t>(items);
  w[n++] = static_cast<uint32_t>(items_per_rank);
  w[n++] = static_cast<uint32_t>(world);
  w[n++] = static_cast<uint32_t>(nfields);
  for (int f = 0; f < nfields && f < 8; ++f) {
    w[n++] = static_cast<uint32_t>(item_bytes[f]);
    w[n++] = static_cast<uint32_t>(res_off[f]);
  }
  return sig::crc32_words(w, n);
}

// Header word of call `epoch`: the epoch's low 32 bits over the signature.
__host__ __device__ __forceinline__ uint64_t header_word(uint64_t epoch, uint32_t signature) {
  return (epoch << 32) | signature;
}

// A polled header against this rank's word `want`: 0 = not this call's yet (0 or call e - 2),
// 1 = this call's and equal, -1 = this call's and different (the ranks' arguments differ).
__host__ __device__ __forceinline__ int header_state(uint64_t h, uint64_t want) {
  if ((h >> 32) != (want >> 32)) return 0;
  return h == want ? 1 : -1;
}

}  // namespace tokenspeed_kernel::comm
