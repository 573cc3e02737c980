"""Low-overhead launch of ``triton.jit`` kernels: ``launch(fn, grid, *args, **kwargs)`` runs the
same compiled kernel as ``fn[grid](*args, **kwargs)`` without the Python work of
``JITFunction.run`` on every call (one native ``specialize_impl`` call per argument, the check of
every global the kernel uses, option parsing, ...; docs/BENCHMARKS.md, "Host time").

**Fast path.** A module-level cache maps (id(fn), current device, our specialization key of the
arguments, the keyword arguments, Triton's global debug / instrumentation settings) to the
``CompiledKernel`` that Triton's own ``fn[grid](...)`` returned for that key (the entry keeps fn
and a reused id is a miss; hashing a JITFunction would compute its dependency hash, which raises
when its globals are interpreter objects), which is then launched directly: ``kernel[grid3](*all_params, stream=current stream)``. ``all_params`` is every
kernel parameter in signature order (positional arguments, then each remaining parameter from the
keyword arguments, else its default; constexprs included): since triton 3.3 ``JITFunction.run``
launches with ``kernel.run(..., *bound_args.values())``, the binder's dict of every parameter,
and ``CompiledKernel.__getitem__(grid)(*args, stream=...)`` forwards its ``args`` to the same
``kernel.run``. The stream is Triton's (``driver.active.get_current_stream``: with torch loaded,
torch's current raw stream, so CUDA-graph capture sees the launch as with ``fn[grid]``).

**Soundness of the key.** Triton picks a compiled kernel by (device, per-argument
specialization, options). Our key is at least as fine, so a hit returns the kernel Triton would
pick: per non-constexpr argument, a tensor gives (dtype, data_ptr() % 16 == 0) (Triton: dtype
and 16-byte alignment), a bool its value, an int (divisible by 16, == 1, in int32, >= 2**63)
(Triton: i32 / i64 / u64 and the divisibility and == 1 specializations), a float "f" (fp32),
None None; constexpr parameters and options (num_warps, ...) are keyed by type and value (so
True, 1 and 1.0 differ; floats by repr, as -0.0 == 0.0). Any other argument (tuples, descriptors,
jit functions, numpy scalars) bypasses the cache for that call. The current device, Triton's
global debug flag (``knobs.runtime.debug``, older: ``TRITON_DEBUG``), ``fn.debug`` and
``knobs.compilation.instrumentation_mode`` (both enter Triton's options) are in the key.

**Verification.** On a miss, ``fn[grid](...)`` launches normally (compiling if needed) and
returns the kernel; the entry is stored only if Triton's own binder
(``fn.device_caches[device][-1]``, triton 3.3-3.8) returns a 3-tuple whose bound-argument dict
holds exactly our ``all_params`` (same objects, same order). Otherwise (another triton version or
protocol) the key is marked off: it always takes ``fn[grid](...)``, and one warning says why.
The fast path skips two things of ``JITFunction.run``: its check that the globals a kernel uses
kept their compile-time values (a changed global raises there; it never selects another kernel),
and a kernel cache cleared behind Triton's back (``fn.device_caches``) keeps our entry.

**Raw pointers.** Positional tensor arguments (CUDA tensors: a CPU tensor takes Triton's path,
which refuses it) reach the launcher as their ``data_ptr()`` ints: Triton's launcher takes an int
pointer as it is, where for a tensor it calls ``data_ptr()`` and ``cuPointerGetAttribute`` once
per argument (its source, triton 3.x). The first fast launch of an entry is guarded: a launcher
that refused them would raise while parsing its arguments, before launching; the key is then
marked off, with one warning. (Not yet timed on a GPU.)

**Bypass** (always ``fn[grid](...)``): ``TOKENSPEED_TRITON_FAST_LAUNCH=0``, ``TRITON_INTERPRET=1``
(read on every call), a launch enter / exit hook (``triton.knobs.runtime``, older
``CompiledKernel``), a stages-inspection hook or ``fn.pre_run_hooks`` (they run inside
``JITFunction.run``), a callable grid, or an argument outside the key's types.
"""
from __future__ import annotations

import os
import warnings
from operator import itemgetter

import torch
import triton
import triton.language as tl
from triton.compiler import CompiledKernel
from triton.runtime import driver as _driver

_knobs = getattr(triton, "knobs", None)
_RT = getattr(_knobs, "runtime", None)
_COMP = getattr(_knobs, "compilation", None)
_HOOK_CHAIN = getattr(_knobs, "HookChain", None)   # 3.6 and 3.8: a hook chain, never None
_HOOK_OWNER = _RT if _RT is not None else CompiledKernel

_CACHE: dict = {}
_FN_INFO: dict = {}
_OFF = object()   # cache value: this key always takes fn[grid](...)
_MAX_ENTRIES = 4096
_PAD = (None, (1, 1), (1,), ())   # by len(grid): pads the grid to 3 dimensions
_WARNED = False
_Tensor = torch.Tensor
_PLAIN = frozenset((bool, int, str, type(None)))   # constexpr / option values keyed as-is
_I32_LO, _I32_HI, _U64_LO = -2 ** 31, 2 ** 31, 2 ** 63


class _Uncacheable(Exception):
    pass


def _hook_set(h) -> bool:
    if h is None:
        return False
    return bool(h.calls) if type(h) is _HOOK_CHAIN else True


def _bypass(fn) -> bool:
    env = os.environ
    if env.get("TOKENSPEED_TRITON_FAST_LAUNCH") == "0" or env.get("TRITON_INTERPRET") == "1":
        return True
    if _hook_set(_HOOK_OWNER.launch_enter_hook) or _hook_set(_HOOK_OWNER.launch_exit_hook):
        return True
    if getattr(_RT, "add_stages_inspection_hook", None) is not None:
        return True
    return bool(getattr(fn, "pre_run_hooks", None))


def _global_state(fn):
    """Triton state outside the arguments that enters its kernel cache key (via options)."""
    if _RT is not None:
        dbg = _RT.debug
    else:
        dbg = os.environ.get("TRITON_DEBUG", "0") == "1"
    return (getattr(fn, "debug", None), dbg, getattr(_COMP, "instrumentation_mode", None))


def _value(ap, v) -> None:
    """Appends the key parts of a constexpr / option value (type and value)."""
    t = v.__class__
    if t in _PLAIN:
        ap(t)
        ap(v)
    elif t is float:
        ap(t)
        ap(repr(v))
    elif isinstance(v, tl.constexpr):
        ap(tl.constexpr)
        _value(ap, v.value)
    elif isinstance(v, tl.dtype):
        ap(tl.dtype)
        ap(v.name)
    else:
        raise _Uncacheable


def _spec(ap, v) -> None:
    """Appends the key parts of a non-constexpr argument (module docstring: soundness)."""
    t = v.__class__
    if t is _Tensor or isinstance(v, _Tensor):
        ap(v.dtype)
        ap(v.data_ptr() & 15 == 0)
    elif t is int:
        ap("i")
        ap((v & 15 == 0, v == 1, _I32_LO <= v < _I32_HI, v >= _U64_LO))
    elif t is bool:
        ap("b")
        ap(v)
    elif t is float:
        ap("f")
    elif v is None:
        ap(None)
    else:
        _value(ap, v)


def _fn_info(fn):
    """(constexpr flag per parameter, names of non-constexpr parameters, parameter names,
    defaults by name) of a JITFunction, from ``fn.params`` (triton >= 3.0 ``KernelParam``)."""
    got = _FN_INFO.get(id(fn))
    if got is not None and got[0] is fn:
        return got[1]
    params = fn.params
    names = tuple(p.name for p in params)
    ce = tuple(bool(p.is_constexpr) for p in params)
    runtime = frozenset(n for n, c in zip(names, ce) if not c)
    defaults = {p.name: p.default for p in params if p.has_default}
    info = (ce, runtime, names, defaults)
    _FN_INFO[id(fn)] = (fn, info)
    return info


def _on_device(v) -> bool:
    return v.is_cuda


def _key(fn, info, device, args, kwargs):
    """(the cache key, the positional arguments with every tensor replaced by its data_ptr()).
    Tensors and ints, most of the arguments, are keyed inline (the same parts as ``_spec``)."""
    ce, runtime = info[0], info[1]
    parts = [id(fn), device, _global_state(fn), len(args)]
    ap = parts.append
    vals = list(args)
    for i, (v, c) in enumerate(zip(args, ce)):
        t = v.__class__
        if c:
            _value(ap, v)
        elif t is _Tensor:
            if not _on_device(v):   # Triton's path says "cpu tensor?"; a raw pointer would not
                raise _Uncacheable
            ptr = v.data_ptr()
            ap(v.dtype)
            ap(ptr & 15 == 0)
            vals[i] = ptr
        elif t is int:
            ap("i")
            ap((v & 15 == 0, v == 1, _I32_LO <= v < _I32_HI, v >= _U64_LO))
        else:
            _spec(ap, v)
    for k, v in kwargs.items():
        ap(k)
        if k in runtime:
            _spec(ap, v)
        else:
            _value(ap, v)
    return tuple(parts), vals


def _rest_getter(names):
    """The parameters after the positional ones, from {defaults, kwargs} as a tuple."""
    if not names:
        return lambda d: ()
    if len(names) == 1:
        name = names[0]
        return lambda d: (d[name],)
    return itemgetter(*names)


def launch(fn, grid, *args, **kwargs):
    """``fn[grid](*args, **kwargs)`` with the host cost of a cache hit (module docstring).
    ``grid``: a tuple of 1-3 ints; returns the launched ``CompiledKernel``."""
    if grid.__class__ is not tuple or not 0 < len(grid) < 4 or _bypass(fn):
        return fn[grid](*args, **kwargs)
    d = _driver.active
    device = d.get_current_device()
    try:
        info = _fn_info(fn)
        key, vals = _key(fn, info, device, args, kwargs)
        entry = _CACHE.get(key)
    except (_Uncacheable, TypeError, AttributeError):
        # an argument outside the key's types, an unhashable value, or fn has no params
        return fn[grid](*args, **kwargs)
    if entry is _OFF:
        return fn[grid](*args, **kwargs)
    if entry is None or entry[0] is not fn:   # (an id reused by another function: a miss)
        return _miss(fn, grid, info, device, key, args, kwargs)
    _, kernel, rest, defaults, tried = entry
    src = {**defaults, **kwargs} if defaults else kwargs
    run = kernel[grid + _PAD[len(grid)]]
    stream = d.get_current_stream(device)
    if tried:
        run(*vals, *rest(src), stream=stream)
        return kernel
    # first fast launch of this entry: a launcher that refuses the raw pointers raises while
    # parsing its arguments, before anything is launched; then Triton's path, for good
    try:
        run(*vals, *rest(src), stream=stream)
    except (TypeError, ValueError, OverflowError) as e:
        _CACHE[key] = _OFF
        _warn_off(fn, e)
        return fn[grid](*args, **kwargs)
    _CACHE[key] = (fn, kernel, rest, defaults, True)
    return kernel


def _warn_off(fn, e):
    global _WARNED
    if not _WARNED:
        _WARNED = True
        warnings.warn(f"tokenspeed_kernel: fast Triton launch off for {fn} with triton "
                      f"{triton.__version__} ({type(e).__name__}: {e}); using fn[grid]",
                      RuntimeWarning, stacklevel=4)


def _miss(fn, grid, info, device, key, args, kwargs):
    kernel = fn[grid](*args, **kwargs)
    if kernel is None:   # not launched (a compile hook declined): nothing to cache
        return kernel
    names, defaults = info[2], info[3]
    try:
        rest = _rest_getter(names[len(args):])
        ours = (*args, *rest({**defaults, **kwargs}))
        res = fn.device_caches[device][-1](*args, **kwargs)
        if not (isinstance(res, tuple) and len(res) == 3 and isinstance(res[0], dict)):
            raise RuntimeError("the binder does not return (bound_args, specialization, "
                               "options)")
        bound = tuple(res[0].values())
        if len(bound) != len(ours) or any(a is not b for a, b in zip(bound, ours)):
            raise RuntimeError(f"bound arguments of {names} differ from ours")
        entry = (fn, kernel, rest, defaults, False)
    except Exception as e:   # any failure: Triton's own path for this key
        entry = _OFF
        _warn_off(fn, e)
    if len(_CACHE) > _MAX_ENTRIES:
        _CACHE.clear()
    _CACHE[key] = entry
    return kernel
