// Torch adapter of the comm family: argument checks, device guard, current stream, launch.
// Kernels: all_gather_hidden.cuh (torch-free). Workspace / protocol: docs/COMM.md.
#include "common/check.h"
#include "comm_ops.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <optional>

#include "all_gather_hidden.cuh"

namespace tokenspeed_kernel::comm {

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void check_matrix(const at::Tensor& t, const char* name, int64_t elt) {
  TS_CHECK(t.dim() == 2, "all_gather_hidden: ", name, " must be 2-D, got ", t.dim(), "-D");
  TS_CHECK(t.size(1) <= 1 || t.stride(1) == 1, "all_gather_hidden: ", name,
           " must have a contiguous last dimension, got strides ", t.strides());
  TS_CHECK(t.size(0) <= 1 || (t.stride(0) * elt) % 16 == 0, "all_gather_hidden: ", name,
           " row stride must be a multiple of 16 bytes, got ", t.stride(0), " elements");
  TS_CHECK(t.numel() == 0 || aligned16(t.data_ptr()), "all_gather_hidden: ", name,
           " data pointer must be 16-byte aligned");
}

}  // namespace

void all_gather_hidden(const at::Tensor& x, const std::optional<at::Tensor>& out,
                       const at::Tensor& state, const at::Tensor& symm, at::IntArrayRef peer_data,
                       at::IntArrayRef peer_flags, int64_t mc_data, at::IntArrayRef col_offsets,
                       int64_t rank, int64_t buf_bytes, int64_t num_blocks, int64_t flags,
                       int64_t timeout_ns, int64_t ll_off, int64_t ll_bytes) {
  TS_CHECK(x.is_cuda(), "all_gather_hidden: x must be a CUDA tensor");
  const auto dt = x.scalar_type();
  TS_CHECK(dt == at::kBFloat16 || dt == at::kHalf || dt == at::kFloat,
           "all_gather_hidden: x dtype must be bfloat16, float16 or float32, got ", dt);
  const int64_t elt = x.element_size();
  const int64_t vec = 16 / elt;  // elements per 16-byte vector
  check_matrix(x, "x", elt);
  const int64_t world = static_cast<int64_t>(peer_data.size());
  TS_CHECK(world >= 1 && world <= kAgMaxRanks, "all_gather_hidden: world size must be in [1, ",
           kAgMaxRanks, "], got ", world);
  TS_CHECK(static_cast<int64_t>(peer_flags.size()) == world,
           "all_gather_hidden: peer_flags must have one entry per rank");
  TS_CHECK(static_cast<int64_t>(col_offsets.size()) == world + 1,
           "all_gather_hidden: col_offsets must have world + 1 entries");
  TS_CHECK(rank >= 0 && rank < world, "all_gather_hidden: rank ", rank, " out of range");
  TS_CHECK(col_offsets[0] == 0, "all_gather_hidden: col_offsets[0] must be 0");
  for (int64_t s = 0; s < world; ++s) {
    TS_CHECK(col_offsets[s + 1] >= col_offsets[s] && col_offsets[s + 1] % vec == 0,
             "all_gather_hidden: col_offsets must be non-decreasing multiples of 16 bytes");
  }
  const int64_t rows = x.size(0);
  const int64_t H = col_offsets[world];
  TS_CHECK(col_offsets[rank + 1] - col_offsets[rank] == x.size(1), "all_gather_hidden: x has ",
           x.size(1), " columns but this rank's width is ",
           col_offsets[rank + 1] - col_offsets[rank]);
  TS_CHECK(rows * (H / vec) <= std::numeric_limits<int32_t>::max(),
           "all_gather_hidden: rows * H is too large for one call");
  TS_CHECK(buf_bytes > 0 && buf_bytes % 16 == 0, "all_gather_hidden: bad buf_bytes");
  TS_CHECK(rows * H * elt <= buf_bytes, "all_gather_hidden: ", rows, " x ", H,
           " does not fit the communicator's buffer (", buf_bytes, " bytes)");
  TS_CHECK(num_blocks >= 1 && num_blocks <= kAgMaxBlocks,
           "all_gather_hidden: num_blocks must be in [1, ", kAgMaxBlocks, "]");
  const bool view = (flags & kAgFlagView) != 0;
  const bool mm = (flags & kAgFlagMultimem) != 0;
  const bool ll = (flags & kAgFlagLL) != 0;
  TS_CHECK((flags & ~(kAgFlagMultimem | kAgFlagView | kAgFlagTrap | kAgFlagLL | kAgFlagNoPipe |
                      kAgFlagPDL | kAgFlagLL4 | kAgFlagLLPaired)) == 0,
           "all_gather_hidden: unknown flag bits ", flags);
  if (ll) {
    TS_CHECK(!view && !mm, "all_gather_hidden: the LL protocol is copy-out and P2P only");
    const int64_t ll_need = ll_region_bytes(rows * (H * elt / 16), static_cast<int>(world));
    TS_CHECK(ll_off >= 0 && ll_off % 16 == 0 && ll_bytes >= ll_need,
             "all_gather_hidden: LL region (", ll_bytes, " bytes per parity) too small for ", rows,
             " x ", H, " (needs ", ll_need, ")");
  }

  if (view) {
    TS_CHECK(!out.has_value(), "all_gather_hidden: out must be None in view mode");
  } else {
    TS_CHECK(out.has_value(), "all_gather_hidden: out is required (copy-out mode)");
    const at::Tensor& o = *out;
    TS_CHECK(o.device() == x.device(), "all_gather_hidden: out must be on ", x.device());
    TS_CHECK(o.scalar_type() == dt, "all_gather_hidden: out dtype must be ", dt);
    check_matrix(o, "out", elt);
    TS_CHECK(o.size(0) == rows && o.size(1) == H, "all_gather_hidden: out must have shape [", rows,
             ", ", H, "], got ", o.sizes());
  }
  TS_CHECK(state.device() == x.device() && state.scalar_type() == at::kLong &&
               state.is_contiguous() && state.numel() >= kAgStateWords,
           "all_gather_hidden: state must be a contiguous int64 CUDA tensor of ", kAgStateWords,
           " words on ", x.device());
  const int64_t nbuf = view ? 3 : 2;
  const int64_t need = kAgFlagBytes + (ll ? ll_off + 2 * ll_bytes : nbuf * buf_bytes);
  TS_CHECK(symm.device() == x.device() && symm.scalar_type() == at::kByte && symm.is_contiguous() &&
               symm.numel() >= need,
           "all_gather_hidden: symm must be the communicator's uint8 workspace on ", x.device(),
           " (", need, " bytes)");
  // The kernel addresses the workspace through the peer tables only; `symm` is in the schema to
  // order the op against other users of the workspace. (It is not required to be the same
  // storage: torch.library.opcheck and functionalization pass copies of mutated arguments.)
  TS_CHECK(peer_data[rank] == peer_flags[rank] + kAgFlagBytes,
           "all_gather_hidden: peer tables do not match this rank's workspace layout");
  for (int64_t s = 0; s < world; ++s) {
    TS_CHECK(peer_data[s] != 0 && peer_flags[s] != 0 && peer_data[s] % 16 == 0 &&
                 peer_flags[s] % 16 == 0,
             "all_gather_hidden: peer ", s, " has no (16-byte aligned) P2P mapping");
  }

  const c10::cuda::CUDAGuard guard(x.device());
  if (flags & kAgFlagPDL) {
    const auto* prop = at::cuda::getCurrentDeviceProperties();
    TS_CHECK(prop->major >= 9, "all_gather_hidden: enable_pdl needs sm_90+, got sm_", prop->major,
             prop->minor);
  }
  if (mm) {
    TS_CHECK(mc_data != 0 && mc_data % 16 == 0,
             "all_gather_hidden: multimem requested without a multicast address");
    const auto* prop = at::cuda::getCurrentDeviceProperties();
    TS_CHECK(prop->major >= 9, "all_gather_hidden: multimem needs sm_90+, got sm_", prop->major,
             prop->minor);
  }
  if (rows == 0 || H == 0) return;

  AllGatherHiddenParams p{};
  p.x = static_cast<const uint8_t*>(x.data_ptr());
  p.ldx = x.stride(0) * elt;
  if (!view) {
    p.out = static_cast<uint8_t*>(out->data_ptr());
    p.ldo = out->stride(0) * elt;
  }
  for (int64_t s = 0; s < world; ++s) {
    p.peer_data[s] = reinterpret_cast<uint8_t*>(peer_data[s]);
    p.peer_flags[s] = reinterpret_cast<uint64_t*>(peer_flags[s]);
  }
  for (int64_t s = 0; s <= world; ++s) p.col_vec[s] = static_cast<int32_t>(col_offsets[s] / vec);
  p.my_data = p.peer_data[rank];
  p.my_flags = p.peer_flags[rank];
  p.mc_data = mm ? reinterpret_cast<uint8_t*>(mc_data) : nullptr;
  p.state = state.data_ptr<int64_t>();
  p.buf_bytes = buf_bytes;
  p.rows = static_cast<int32_t>(rows);
  p.row_vec = static_cast<int32_t>(H / vec);
  p.world = static_cast<int32_t>(world);
  p.rank = static_cast<int32_t>(rank);
  p.num_blocks = static_cast<int32_t>(num_blocks);
  p.flags = static_cast<int32_t>(flags);
  p.timeout_ns = timeout_ns;
  p.ll_off = ll ? ll_off : 0;
  p.ll_bytes = ll ? ll_bytes : 0;
  // everything a peer must agree on (call_signature.h); checked on the device against every
  // peer's header word of the call
  p.sig = ag_signature(kSigAllGatherCuda, static_cast<uint32_t>(flags & kAgSigFlags), elt, rows,
                       num_blocks, static_cast<int>(world), col_offsets.data());
  C10_CUDA_CHECK(launch_all_gather_hidden(p, at::cuda::getCurrentCUDAStream(x.device().index())));
}

void define_ops(torch::Library& m) {
  // Out-variant; the Python wrapper (ops/comm.py) owns validation, workspace and backend choice.
  // `symm` is this rank's symmetric workspace (peers write into it through peer_data/peer_flags);
  // `state` holds the device-side call counter and the error flag.
  m.def(
      "all_gather_hidden(Tensor x, Tensor(a!)? out, Tensor(b!) state, Tensor(c!) symm, "
      "int[] peer_data, int[] peer_flags, int mc_data, int[] col_offsets, int rank, "
      "int buf_bytes, int num_blocks, int flags, int timeout_ns, int ll_off=0, "
      "int ll_bytes=0) -> ()");
}

void impl_cuda(torch::Library& m) { m.impl("all_gather_hidden", &all_gather_hidden); }

}  // namespace tokenspeed_kernel::comm
