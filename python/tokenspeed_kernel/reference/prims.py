"""Executable spec of the bit-exact primitives shared by every backend.

Everything the sampler decides is built from the functions in this file, and the CUDA
(``csrc/common/*.cuh``) and Triton (``tokenspeed_kernel/triton/prims.py``) versions perform the
*same IEEE-754 float32 operations in the same order* (no FMA contraction, IEEE division), so a
token is a pure function of (seed, offset, processed logits row) on every backend.

* ``philox4x32_10``      -- Random123 Philox4x32 with 10 rounds, on int64 tensors holding u32.
* ``uniform_from_bits``  -- u = (2 * (bits >> 9) + 1) * 2**-24: 23-bit grid, never 0, never 1.
* ``soft_ln``            -- musl's ``logf`` (same reduction, same polynomial, same op order).
* ``soft_exp_neg``       -- exp(y) for y <= 0: Cody-Waite reduction + degree-7 Horner,
                            0 for y < -64 (and -inf).
* ``key32`` / ``key56``  -- order-preserving integer keys: value descending, token id ascending.
* ``mass_fixed``         -- trunc(soft_exp_neg(x - m) * 2**38) as int64 (top-p mass, exact sums).

All helpers work on CPU and CUDA tensors and never use torch ops that may fuse mul+add.
"""
from __future__ import annotations

import torch

# ---------------------------------------------------------------------------------------------
# constants (bit patterns are the definition; the floats are only for reading)
# ---------------------------------------------------------------------------------------------
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
MASK32 = 0xFFFFFFFF

# Philox counter word 3 ("stream"): documented in docs/DESIGN.md
STREAM_SAMPLE = 0      # Gumbel noise of the sampler
STREAM_ACCEPT = 1      # verify: accept coin
STREAM_RESAMPLE = 2    # verify: Gumbel noise of the residual resample

MASS_FRAC_BITS = 38    # fixed-point fraction bits of the top-p mass; V <= 2**24 keeps sums < 2**62
MAX_VOCAB = 1 << 24    # token ids live in 24 bits of the 56-bit key
ID_MASK = (1 << 24) - 1
SOFT_EXP_CUTOFF = -64.0

F32 = {
    "LN2_HI_LOG": 0x3F317180, "LN2_LO_LOG": 0x3717F7D1,
    "LG1": 0x3F2AAAAA, "LG2": 0x3ECCCE13, "LG3": 0x3E91E9EE, "LG4": 0x3E789E26,
    "LOG2E": 0x3FB8AA3B, "LN2_HI_EXP": 0x3F317200, "LN2_LO_EXP": 0x35BFBE8E,
    "C7": 0x39500D01, "C6": 0x3AB60B61, "C5": 0x3C088889, "C4": 0x3D2AAAAB, "C3": 0x3E2AAAAB,
}


def f32_from_bits(bits: int) -> float:
    return torch.tensor([bits], dtype=torch.int32 if bits < 2**31 else torch.int64).to(
        torch.int64).to(torch.int32).view(torch.float32).item()


_C = {k: f32_from_bits(v) for k, v in F32.items()}


def _c(name: str, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(_C[name], dtype=torch.float32, device=like.device)


# ---------------------------------------------------------------------------------------------
# Philox4x32-10
# ---------------------------------------------------------------------------------------------
def _mulhilo(a: int, b: torch.Tensor):
    """(hi, lo) 32-bit halves of the 64-bit product of constant a and u32 tensor b (int64)."""
    b_lo = b & 0xFFFF
    b_hi = b >> 16
    p1 = b_lo * a                       # < 2**48
    p2 = b_hi * a                       # < 2**48
    mid = p1 + ((p2 & 0xFFFF) << 16)    # < 2**49
    lo = mid & MASK32
    hi = ((p2 >> 16) + (mid >> 32)) & MASK32
    return hi, lo


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Random123 Philox4x32-10. All arguments int64 tensors (or ints) holding u32 values."""
    ref = next(t for t in (c0, c1, c2, c3, k0, k1) if isinstance(t, torch.Tensor))

    def t(v):
        if isinstance(v, torch.Tensor):
            return v.to(torch.int64) & MASK32
        return torch.full_like(ref, v, dtype=torch.int64) & MASK32

    c0, c1, c2, c3, k0, k1 = (t(v) for v in (c0, c1, c2, c3, k0, k1))
    for r in range(10):
        if r:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def philox_bits(seed: torch.Tensor, offset: torch.Tensor, token: torch.Tensor, stream: int):
    """u32 random word for (seed, offset, token id, stream), broadcast over the inputs.

    key = (seed lo, seed hi); counter = (token >> 2, offset lo, offset hi, stream);
    the word is output lane ``token & 3`` (one Philox call serves 4 consecutive tokens).
    """
    seed = seed.to(torch.int64)
    offset = offset.to(torch.int64)
    token = token.to(torch.int64)
    seed, offset, token = torch.broadcast_tensors(seed, offset, token)
    out = philox4x32_10(token >> 2, offset & MASK32, (offset >> 32) & MASK32, stream,
                         seed & MASK32, (seed >> 32) & MASK32)
    lane = token & 3
    return torch.where(lane == 0, out[0], torch.where(lane == 1, out[1],
                       torch.where(lane == 2, out[2], out[3])))


def uniform_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """u = (2*(bits>>9)+1) * 2**-24 in float32: exact, in [2**-24, 1-2**-24]."""
    k = (bits >> 9) * 2 + 1                          # < 2**24: exact in float32
    return k.to(torch.float32) * (2.0 ** -24)        # power-of-two scale: exact


# ---------------------------------------------------------------------------------------------
# soft_ln / soft_exp_neg: fixed float32 op sequences
# ---------------------------------------------------------------------------------------------
def _i2f(i: torch.Tensor) -> torch.Tensor:
    return i.to(torch.int32).view(torch.float32)


def _f2i(f: torch.Tensor) -> torch.Tensor:
    return f.contiguous().view(torch.int32).to(torch.int64) & MASK32


def soft_ln(x: torch.Tensor) -> torch.Tensor:
    """Natural log of positive normal float32 x, musl logf's exact op sequence."""
    x = x.to(torch.float32)
    ix = _f2i(x) + (0x3F800000 - 0x3F3504F3)
    k = (ix >> 23) - 0x7F
    ix = (ix & 0x007FFFFF) + 0x3F3504F3
    xm = _i2f(ix)
    one = torch.ones((), dtype=torch.float32, device=x.device)
    f = xm - one
    s = f / (f + 2.0 * one)
    z = s * s
    w = z * z
    t1 = w * (_c("LG2", x) + w * _c("LG4", x))
    t2 = z * (_c("LG1", x) + w * _c("LG3", x))
    R = t2 + t1
    hfsq = (0.5 * one * f) * f
    dk = k.to(torch.float32)
    r = s * (hfsq + R)
    r = r + dk * _c("LN2_LO_LOG", x)
    r = r - hfsq
    r = r + f
    r = r + dk * _c("LN2_HI_LOG", x)
    return r


def soft_exp_neg(y: torch.Tensor) -> torch.Tensor:
    """exp(y) for float32 y <= 0; 0 where y < -64 (incl. -inf). Fixed op sequence."""
    y = y.to(torch.float32)
    live = y >= SOFT_EXP_CUTOFF
    ys = torch.where(live, y, torch.zeros_like(y))
    kf = torch.floor(ys * _c("LOG2E", y) + 0.5)
    hi = ys - kf * _c("LN2_HI_EXP", y)
    lo = kf * _c("LN2_LO_EXP", y)
    r = hi - lo
    p = _c("C7", y).expand_as(r)
    for c in ("C6", "C5", "C4", "C3"):
        p = p * r + _c(c, y)
    one = torch.ones((), dtype=torch.float32, device=y.device)
    p = p * r + 0.5 * one
    p = p * r + one
    p = p * r + one
    scale = _i2f((kf.to(torch.int64) + 127) << 23)
    return torch.where(live, p * scale, torch.zeros_like(p))


def gumbel_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """G = -soft_ln(-soft_ln(u)) with u = uniform_from_bits(bits)."""
    u = uniform_from_bits(bits)
    e = -soft_ln(u)
    return -soft_ln(e)


# ---------------------------------------------------------------------------------------------
# keys and fixed-point mass
# ---------------------------------------------------------------------------------------------
def key32(x: torch.Tensor) -> torch.Tensor:
    """Order-preserving u32 key of float32 x (as int64); -0.0 maps like +0.0."""
    b = _f2i(x.to(torch.float32))
    b = torch.where(b == 0x80000000, torch.zeros_like(b), b)
    neg = (b >> 31) == 1
    return torch.where(neg, b ^ MASK32, b | 0x80000000)


def key32_to_float(k: torch.Tensor) -> torch.Tensor:
    k = k.to(torch.int64)
    b = torch.where((k >> 31) == 1, k & 0x7FFFFFFF, k ^ MASK32)
    return _i2f(b)


def key56(x: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Unique 56-bit key: (key32(x) << 24) | (2**24 - 1 - id). Larger = earlier in the order."""
    return (key32(x) << 24) | (ID_MASK - token.to(torch.int64))


def mass_fixed(y: torch.Tensor) -> torch.Tensor:
    """trunc(soft_exp_neg(y) * 2**38) as int64, for y = x - max <= 0."""
    e = soft_exp_neg(y) * float(2 ** MASS_FRAC_BITS)   # power-of-two scale: exact
    return e.to(torch.int64)                           # truncation toward zero


def top_p_limit(top_p: torch.Tensor, total_mass: torch.Tensor) -> torch.Tensor:
    """P' = max(1, trunc(double(p) * double(S))): keep a token iff mass before it < P'."""
    lim = (top_p.to(torch.float64) * total_mass.to(torch.float64)).to(torch.int64)
    return torch.clamp(lim, min=1)


def inv_temperature(t: torch.Tensor) -> torch.Tensor:
    """fl32(1 / T) with IEEE division; 1 for greedy rows (T == 0). +inf for T < ~2.9e-39."""
    t = t.to(torch.float32)
    one = torch.ones((), dtype=torch.float32, device=t.device)
    return torch.where(t > 0, one / torch.where(t > 0, t, one), one)


def centered(z: torch.Tensor, zmax: torch.Tensor, inv_t: torch.Tensor) -> torch.Tensor:
    """The processed logit ``y = fl32(fl32(z - zmax) * inv_t)``, and ``y = 0`` where
    ``z == zmax`` (so a 1/T that overflowed to +inf gives 0 / -inf, the T -> 0 limit, not NaN).

    ``z`` float32 [..., V], ``zmax`` / ``inv_t`` float32 broadcastable to it. ``y <= 0``; the
    max token has ``y = 0``. Relative to the row max, so the scores ``y + G`` keep the Gumbel
    noise at every logit magnitude and temperature (docs/DESIGN.md, randomness contract).
    """
    d = z.to(torch.float32) - zmax
    y = d * inv_t
    return torch.where(d == 0, torch.zeros_like(y), y)
