"""Triton versions of the bit-exact primitives of ``tokenspeed_kernel.reference.prims``.

Every function here performs the *same IEEE-754 float32 operations in the same order* as the
reference (and ``csrc/common/softmath.cuh``), so that a kernel built from them draws the same
token as the reference for the same (seed, offset, logits row). Two rules make that hold:

* kernels that use these helpers must be launched with ``enable_fp_fusion=False`` (no mul+add
  contraction into FMA; Triton then also passes ``--fmad=false`` to ptxas), and every product and
  sum is written as its own operation;
* division is IEEE round-to-nearest (``tl.math.div_rn``; Triton's ``/`` on float32 lowers to an
  approximate ``div.full.f32`` on NVIDIA GPUs).

Philox runs on uint32 (``*`` wraps, ``tl.umulhi`` gives the high word), exact on the GPU and under
``TRITON_INTERPRET=1`` (numpy). Keys and fixed-point masses are int64 (key56 < 2**56 is positive).
"""
from __future__ import annotations

import struct

import triton
import triton.language as tl

from ..reference import prims as _ref


_CFALSE = tl.constexpr(False)
_CTRUE = tl.constexpr(True)


class Const(tl.constexpr):
    """A module-level constant of the kernels (a ``tl.constexpr``). On every launch Triton checks
    each global a kernel uses against a deep copy taken at compile time with ``!=``; the base
    class builds new constexpr objects for that (~1 us per global on the host, ~25 globals per
    sampler call). Two ``Const`` compare by value directly; everything else is the base class."""
    __slots__ = ()

    def __ne__(self, other):
        if type(other) is Const:
            return _CFALSE if self.value == other.value else _CTRUE
        return super().__ne__(other)


def _f32(name: str) -> float:
    """The float32 constant ``name`` of the reference, as the (exactly equal) Python float."""
    return struct.unpack("<f", struct.pack("<I", _ref.F32[name]))[0]


# Philox constants
PHILOX_M0 = Const(_ref.PHILOX_M0)
PHILOX_M1 = Const(_ref.PHILOX_M1)
PHILOX_W0 = Const(_ref.PHILOX_W0)
PHILOX_W1 = Const(_ref.PHILOX_W1)
STREAM_SAMPLE = Const(_ref.STREAM_SAMPLE)
STREAM_ACCEPT = Const(_ref.STREAM_ACCEPT)
STREAM_RESAMPLE = Const(_ref.STREAM_RESAMPLE)

# float32 constants (exact float32 values held as Python floats)
LN2_HI_LOG = Const(_f32("LN2_HI_LOG"))
LN2_LO_LOG = Const(_f32("LN2_LO_LOG"))
LG1 = Const(_f32("LG1"))
LG2 = Const(_f32("LG2"))
LG3 = Const(_f32("LG3"))
LG4 = Const(_f32("LG4"))
LOG2E = Const(_f32("LOG2E"))
LN2_HI_EXP = Const(_f32("LN2_HI_EXP"))
LN2_LO_EXP = Const(_f32("LN2_LO_EXP"))
C7 = Const(_f32("C7"))
C6 = Const(_f32("C6"))
C5 = Const(_f32("C5"))
C4 = Const(_f32("C4"))
C3 = Const(_f32("C3"))
TWO_POW_M24 = Const(2.0 ** -24)
MASS_SCALE = Const(float(2 ** _ref.MASS_FRAC_BITS))
SOFT_EXP_CUTOFF = Const(_ref.SOFT_EXP_CUTOFF)
ID_MASK = Const(_ref.ID_MASK)


# ---------------------------------------------------------------------------------------------
# Philox4x32-10
# ---------------------------------------------------------------------------------------------
@triton.jit
def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Random123 Philox4x32-10 on uint32 tensors (broadcastable). Returns the 4 output words."""
    m0 = tl.full([], PHILOX_M0, tl.uint32)
    m1 = tl.full([], PHILOX_M1, tl.uint32)
    w0 = tl.full([], PHILOX_W0, tl.uint32)
    w1 = tl.full([], PHILOX_W1, tl.uint32)
    for r in tl.static_range(10):
        if r > 0:
            k0 = k0 + w0
            k1 = k1 + w1
        hi0 = tl.umulhi(m0, c0)
        lo0 = m0 * c0
        hi1 = tl.umulhi(m1, c2)
        lo1 = m1 * c2
        n0 = hi1 ^ c1 ^ k0
        n2 = hi0 ^ c3 ^ k1
        c0 = n0
        c1 = lo1
        c2 = n2
        c3 = lo0
    return c0, c1, c2, c3


@triton.jit
def split_u64(v):
    """int64 -> (low u32, high u32)."""
    v = v.to(tl.int64)
    return v.to(tl.uint32), (v >> 32).to(tl.uint32)


@triton.jit
def philox_word(seed, offset, token, stream: tl.constexpr):
    """u32 random word of (seed int64, offset int64, token id int32 tensor, stream).

    key = (seed lo, seed hi); counter = (token >> 2, offset lo, offset hi, stream); the word is
    output lane ``token & 3``.
    """
    k0, k1 = split_u64(seed)
    o0, o1 = split_u64(offset)
    tok = token.to(tl.uint32)
    c0 = tok >> 2
    # broadcast every word to the common shape (e.g. seed [R, 1] x token [1, B] -> [R, B])
    zero = tl.zeros_like(c0) + tl.zeros_like(k0) + tl.zeros_like(o0)
    c0 = c0 + zero
    c3 = zero + tl.full([], stream, tl.uint32)
    r0, r1, r2, r3 = philox4x32_10(c0, zero + o0, zero + o1, c3, zero + k0, zero + k1)
    lane = (tok & 3) + zero
    return tl.where(lane == 0, r0, tl.where(lane == 1, r1, tl.where(lane == 2, r2, r3)))


@triton.jit
def uniform_from_bits(bits):
    """u = (2*(bits>>9)+1) * 2**-24 (float32, exact)."""
    k = (bits.to(tl.uint32) >> 9) * 2 + 1
    return k.to(tl.float32) * TWO_POW_M24


# ---------------------------------------------------------------------------------------------
# soft_ln / soft_exp_neg
# ---------------------------------------------------------------------------------------------
@triton.jit
def soft_ln(x):
    """musl logf op sequence for positive normal float32 x."""
    x = x.to(tl.float32)
    ix = x.to(tl.int32, bitcast=True) + 0x004AFB0D          # + (0x3F800000 - 0x3F3504F3)
    k = (ix >> 23) - 0x7F
    ix = (ix & 0x007FFFFF) + 0x3F3504F3
    xm = ix.to(tl.float32, bitcast=True)
    f = xm - 1.0
    s = tl.math.div_rn(f, f + 2.0)
    z = s * s
    w = z * z
    t1 = w * (LG2 + w * LG4)
    t2 = z * (LG1 + w * LG3)
    R = t2 + t1
    hfsq = (0.5 * f) * f
    dk = k.to(tl.float32)
    r = s * (hfsq + R)
    r = r + dk * LN2_LO_LOG
    r = r - hfsq
    r = r + f
    r = r + dk * LN2_HI_LOG
    return r


@triton.jit
def soft_exp_neg(y):
    """exp(y) for float32 y <= 0; 0 where y < -64, -inf or NaN."""
    y = y.to(tl.float32)
    live = y >= SOFT_EXP_CUTOFF
    ys = tl.where(live, y, 0.0)
    kf = tl.floor(ys * LOG2E + 0.5)
    hi = ys - kf * LN2_HI_EXP
    lo = kf * LN2_LO_EXP
    r = hi - lo
    p = r * C7 + C6   # C7 * r == r * C7 (IEEE multiplication is commutative)
    p = p * r + C5
    p = p * r + C4
    p = p * r + C3
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    scale = ((kf.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(live, p * scale, 0.0)


@triton.jit
def gumbel_from_bits(bits):
    """G = -soft_ln(-soft_ln(u)), u = uniform_from_bits(bits)."""
    u = uniform_from_bits(bits)
    e = -soft_ln(u)
    return -soft_ln(e)


# ---------------------------------------------------------------------------------------------
# keys, fixed-point mass, parameters
# ---------------------------------------------------------------------------------------------
@triton.jit
def key32(x):
    """Order-preserving u32 key of float32 x, as int64 in [0, 2**32); -0.0 keys like +0.0."""
    i = x.to(tl.float32).to(tl.int32, bitcast=True)
    i = tl.where(i == -2147483648, 0, i)                 # -0.0 -> +0.0
    k = tl.where(i < 0, ~i, i ^ -2147483648)             # negatives: invert; else set sign bit
    return k.to(tl.uint32, bitcast=True).to(tl.int64)


@triton.jit
def key32_to_float(k):
    """Inverse of key32 (float32)."""
    i = k.to(tl.int64).to(tl.int32)                      # low 32 bits
    b = tl.where(i < 0, i & 0x7FFFFFFF, ~i)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def key56(x, token):
    """Unique 56-bit key (int64): (key32(x) << 24) | (2**24 - 1 - id). Larger = earlier."""
    return (key32(x) << 24) | (token.to(tl.int64) ^ ID_MASK)   # == ID_MASK - id


@triton.jit
def key56_id(k):
    """Token id of a key56."""
    return (k.to(tl.int64) & ID_MASK) ^ ID_MASK


@triton.jit
def mass_fixed(y):
    """trunc(soft_exp_neg(y) * 2**38) as int64 (y = x - max <= 0)."""
    return (soft_exp_neg(y) * MASS_SCALE).to(tl.int64)


@triton.jit
def top_p_limit(p, s):
    """max(1, trunc(double(p) * double(s))) as int64."""
    lim = (p.to(tl.float64) * s.to(tl.float64)).to(tl.int64)
    return tl.maximum(lim, 1)


@triton.jit
def inv_temperature(t):
    """fl32(1 / T) with IEEE division; 1 where T <= 0 (greedy)."""
    t = t.to(tl.float32)
    pos = t > 0.0
    return tl.where(pos, tl.math.div_rn(1.0 + tl.zeros_like(t), tl.where(pos, t, 1.0)), 1.0)


@triton.jit
def centered(z, zmax, inv_t):
    """Processed logit ``y = fl32(fl32(z - zmax) * inv_t)``, 0 where ``z == zmax`` (reference
    ``prims.centered``): relative to the row max, never NaN for ``inv_t = +inf``."""
    d = z.to(tl.float32) - zmax
    return tl.where(d == 0.0, 0.0, d * inv_t)


# ---------------------------------------------------------------------------------------------
# bounds of unvalidated inputs (the CUDA kernels' rules: never an out-of-bounds access)
# ---------------------------------------------------------------------------------------------
@triton.jit
def csr_range(indptr_ptr, q, nnz):
    """Entries [b0, b1) of list q of a CSR: b0 = clamp(indptr[q], 0, nnz), b1 =
    clamp(indptr[q + 1], b0, nnz) (int64); a well-formed CSR gives its own range."""
    n = nnz.to(tl.int64)
    b0 = tl.minimum(tl.maximum(tl.load(indptr_ptr + q).to(tl.int64), 0), n)
    b1 = tl.minimum(tl.maximum(tl.load(indptr_ptr + q + 1).to(tl.int64), b0), n)
    return b0, b1


@triton.jit
def slot_in(slots_ptr, i, N):
    """(slots[i] if in [0, N) else 0, whether it is) (int64, bool): a slot outside is never
    dereferenced."""
    slot = tl.load(slots_ptr + i).to(tl.int64)
    ok = (slot >= 0) & (slot < N)
    return tl.where(ok, slot, 0), ok
