// Torch adapter of DP sampling's comm kernels (dp_swap.cuh): argument checks, device guard,
// current stream, launch. Workspace / protocol: python/tokenspeed_kernel/ops/dp.py, docs/COMM.md.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>

#include "common/check.h"
#include "comm_ops.h"
#include "dp_swap.cuh"

namespace tokenspeed_kernel::comm {

namespace {

void check_tables(at::IntArrayRef a, at::IntArrayRef b, int64_t rank, const char* op) {
  const int64_t world = static_cast<int64_t>(a.size());
  TS_CHECK(world >= 1 && world <= kDpMaxRanks, op, ": world size must be in [1, ", kDpMaxRanks,
           "], got ", world);
  TS_CHECK(static_cast<int64_t>(b.size()) == world, op,
           ": the peer tables must have one entry per rank");
  TS_CHECK(rank >= 0 && rank < world, op, ": rank ", rank, " out of range");
  for (int64_t s = 0; s < world; ++s)
    TS_CHECK(a[s] != 0 && b[s] != 0 && a[s] % 16 == 0 && b[s] % 16 == 0, op, ": peer ", s,
             " has no (16-byte aligned) P2P mapping");
}

void check_state(const at::Tensor& state, const at::Device& dev, const char* op) {
  TS_CHECK(state.device() == dev && state.scalar_type() == at::kLong && state.is_contiguous() &&
               state.numel() >= kDpStateWords,
           op, ": state must be a contiguous int64 tensor of ", kDpStateWords, " words on ", dev);
}

}  // namespace

void dp_swap(const at::Tensor& x, const at::Tensor& state, const at::Tensor& symm,
             at::IntArrayRef peer_recv, at::IntArrayRef peer_flags, int64_t rank,
             int64_t recv_bytes, int64_t row_bytes, int64_t rows_per_rank, int64_t num_blocks,
             int64_t flags, int64_t timeout_ns) {
  const char* op = "dp_swap";
  TS_CHECK(x.is_cuda(), op, ": x must be a CUDA tensor");
  const auto dt = x.scalar_type();
  TS_CHECK(dt == at::kBFloat16 || dt == at::kHalf || dt == at::kFloat, op,
           ": x dtype must be bfloat16, float16 or float32, got ", dt);
  TS_CHECK(x.dim() == 2, op, ": x must be 2-D [rows, shard], got ", x.dim(), "-D");
  TS_CHECK(x.size(1) <= 1 || x.stride(1) == 1, op, ": x must have a contiguous last dimension");
  check_tables(peer_recv, peer_flags, rank, op);
  check_state(state, x.device(), op);
  const int64_t world = static_cast<int64_t>(peer_recv.size());
  const int64_t elt = x.element_size();
  const int64_t rows = x.size(0), shard_bytes = x.size(1) * elt;
  TS_CHECK(rows_per_rank >= 0 && rows_per_rank * world >= rows, op, ": rows_per_rank ",
           rows_per_rank, " does not cover ", rows, " rows over ", world, " ranks");
  TS_CHECK(world * shard_bytes <= row_bytes && row_bytes % 16 == 0, op, ": row_bytes ", row_bytes,
           " too small for ", world, " shards of ", shard_bytes, " bytes");
  TS_CHECK(recv_bytes > 0 && rows_per_rank * row_bytes <= recv_bytes && recv_bytes % 16 == 0, op,
           ": recv buffer (", recv_bytes, " bytes) too small for ", rows_per_rank, " rows");
  TS_CHECK(num_blocks >= 1 && num_blocks <= kDpMaxBlocks, op, ": num_blocks must be in [1, ",
           kDpMaxBlocks, "]");
  TS_CHECK((flags & ~int64_t(kDpFlagTrap)) == 0, op, ": unknown flag bits ", flags);
  // peer_recv points at the call's swap slot: kDpFlagBytes + slot * recv_bytes into the workspace
  const int64_t slot_off = peer_recv[rank] - peer_flags[rank];
  TS_CHECK(symm.device() == x.device() && symm.scalar_type() == at::kByte, op,
           ": symm must be the communicator's uint8 workspace on ", x.device());
  TS_CHECK(slot_off >= kDpFlagBytes && (slot_off - kDpFlagBytes) % recv_bytes == 0 &&
               slot_off + recv_bytes <= symm.numel(),
           op, ": peer tables do not match this rank's workspace layout");
  const c10::cuda::CUDAGuard guard(x.device());
  if (rows == 0 || shard_bytes == 0) return;
  DpSwapParams p{};
  p.x = static_cast<const uint8_t*>(x.data_ptr());
  p.ldx = (rows <= 1 ? shard_bytes : x.stride(0) * elt);
  for (int64_t s = 0; s < world; ++s) {
    p.peer_recv[s] = reinterpret_cast<uint8_t*>(peer_recv[s]);
    p.peer_flags[s] = reinterpret_cast<uint64_t*>(peer_flags[s]);
  }
  p.state = state.data_ptr<int64_t>();
  p.row_bytes = row_bytes;
  TS_CHECK(shard_bytes <= std::numeric_limits<int32_t>::max(), op, ": shard too wide");
  p.shard_units = static_cast<int32_t>(shard_bytes);  // bytes: the launcher picks the unit
  p.rows = static_cast<int32_t>(rows);
  p.rows_per_rank = static_cast<int32_t>(rows_per_rank);
  p.world = static_cast<int32_t>(world);
  p.rank = static_cast<int32_t>(rank);
  p.num_blocks = static_cast<int32_t>(num_blocks);
  p.flags = static_cast<int32_t>(flags);
  p.timeout_ns = timeout_ns;
  // everything a peer must agree on (call_signature.h), compared on the device before the push
  const int64_t slot = (slot_off - kDpFlagBytes) / recv_bytes;
  p.slot = static_cast<int32_t>(slot);
  p.sig = dp_swap_signature(kSigDpSwapCuda, rows, rows_per_rank, shard_bytes, row_bytes, slot,
                            num_blocks, static_cast<int>(world));
  C10_CUDA_CHECK(launch_dp_swap(p, at::cuda::getCurrentCUDAStream(x.device().index())));
}

void dp_gather(at::TensorList src, at::TensorList out, const at::Tensor& state,
               const at::Tensor& symm, at::IntArrayRef peer_res, at::IntArrayRef peer_flags,
               at::IntArrayRef res_off, int64_t rank, int64_t res_bytes, int64_t items,
               int64_t items_per_rank, int64_t flags, int64_t timeout_ns) {
  const char* op = "dp_gather";
  const int64_t nf = static_cast<int64_t>(src.size());
  TS_CHECK(nf >= 1 && nf <= kDpMaxFields && static_cast<int64_t>(out.size()) == nf &&
               static_cast<int64_t>(res_off.size()) == nf,
           op, ": src, out and res_off must have the same length in [1, ", kDpMaxFields, "]");
  const at::Device dev = out[0].device();
  TS_CHECK(dev.is_cuda(), op, ": outputs must be CUDA tensors");
  check_tables(peer_res, peer_flags, rank, op);
  check_state(state, dev, op);
  const int64_t world = static_cast<int64_t>(peer_res.size());
  TS_CHECK(items >= 0 && items_per_rank >= 0 && items_per_rank * world >= items, op,
           ": items_per_rank ", items_per_rank, " does not cover ", items, " items");
  TS_CHECK((flags & ~int64_t(kDpFlagTrap)) == 0, op, ": unknown flag bits ", flags);
  TS_CHECK(symm.device() == dev && symm.scalar_type() == at::kByte, op,
           ": symm must be the communicator's uint8 workspace on ", dev);
  const int64_t n_me =
      dp::rows_of(static_cast<int32_t>(items), static_cast<int32_t>(items_per_rank),
                  static_cast<int32_t>(rank));
  DpGatherParams p{};
  int64_t ibs[kDpMaxFields] = {}, offs[kDpMaxFields] = {};
  for (int64_t f = 0; f < nf; ++f) {
    const at::Tensor& s = src[f];
    const at::Tensor& o = out[f];
    TS_CHECK(s.device() == dev && o.device() == dev, op, ": field ", f, " not on ", dev);
    TS_CHECK(s.is_contiguous() && o.is_contiguous(), op, ": field ", f, " must be contiguous");
    TS_CHECK(s.scalar_type() == o.scalar_type(), op, ": field ", f, " dtypes differ");
    TS_CHECK(o.dim() >= 1 && o.size(0) == items, op, ": out[", f, "] must have ", items, " rows");
    const int64_t ib = items == 0 ? 0 : o.numel() / items * o.element_size();
    TS_CHECK(s.dim() >= 1 && s.size(0) == n_me && s.numel() * s.element_size() == n_me * ib, op,
             ": src[", f, "] must hold this rank's ", n_me, " items of ", ib, " bytes");
    TS_CHECK(res_off[f] >= 0 && res_off[f] + items_per_rank * world * ib <= res_bytes, op,
             ": field ", f, " does not fit the results buffer");
    p.src[f] = static_cast<const uint8_t*>(s.data_ptr());
    p.out[f] = static_cast<uint8_t*>(o.data_ptr());
    p.res_off[f] = res_off[f];
    p.item_bytes[f] = static_cast<int32_t>(ib);
    ibs[f] = ib;
    offs[f] = res_off[f];
  }
  TS_CHECK(symm.numel() >= kDpFlagBytes + 2 * res_bytes, op, ": symm too small");
  for (int64_t s = 0; s < world; ++s) {
    p.peer_res[s] = reinterpret_cast<uint8_t*>(peer_res[s]);
    p.peer_flags[s] = reinterpret_cast<uint64_t*>(peer_flags[s]);
  }
  p.nfields = static_cast<int32_t>(nf);
  p.state = state.data_ptr<int64_t>();
  p.res_bytes = res_bytes;
  p.items = static_cast<int32_t>(items);
  p.items_per_rank = static_cast<int32_t>(items_per_rank);
  p.world = static_cast<int32_t>(world);
  p.rank = static_cast<int32_t>(rank);
  p.flags = static_cast<int32_t>(flags);
  p.timeout_ns = timeout_ns;
  // everything a peer must agree on (call_signature.h), compared on the device before the copy-out
  p.sig = dp_gather_signature(items, items_per_rank, static_cast<int>(world), static_cast<int>(nf),
                              ibs, offs);
  const c10::cuda::CUDAGuard guard(dev);
  if (items == 0) return;
  C10_CUDA_CHECK(launch_dp_gather(p, at::cuda::getCurrentCUDAStream(dev.index())));
}

void define_dp_ops(torch::Library& m) {
  // Out-variants; the Python wrapper (ops/dp.py) owns validation, workspace and backend choice.
  m.def(
      "dp_swap(Tensor x, Tensor(a!) state, Tensor(b!) symm, int[] peer_recv, int[] peer_flags, "
      "int rank, int recv_bytes, int row_bytes, int rows_per_rank, int num_blocks, int flags, "
      "int timeout_ns) -> ()");
  m.def(
      "dp_gather(Tensor[] src, Tensor(a!)[] out, Tensor(b!) state, Tensor(c!) symm, "
      "int[] peer_res, int[] peer_flags, int[] res_off, int rank, int res_bytes, int items, "
      "int items_per_rank, int flags, int timeout_ns) -> ()");
}

void impl_dp_cuda(torch::Library& m) {
  m.impl("dp_swap", &dp_swap);
  m.impl("dp_gather", &dp_gather);
}

}  // namespace tokenspeed_kernel::comm
