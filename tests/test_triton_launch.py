"""``triton/launch.py``: the cached fast launch path of Triton kernels, checked without a GPU.

A Triton kernel cannot launch on the CPU and the interpreter bypasses the fast path, so the
logic runs against stand-ins: a fake JITFunction (``params``, ``fn[grid](...)`` returning a fake
CompiledKernel, a ``device_caches`` binder like triton 3.3-3.8's) and a fake driver. Checked:

* a second call with arguments of the same specialization hits the cache and launches the
  compiled kernel with the padded grid and every parameter in signature order (positional
  arguments, then keyword arguments by name, then defaults; constexprs included), positional
  tensors as raw pointers; CPU tensors always take Triton's path; a launcher that refuses raw
  pointers turns the key off at its first fast launch, with one warning;
* a change of a tensor's 16-byte alignment or dtype, of an int's divisibility by 16 or == 1, or
  of a constexpr / option value (also True vs 1) misses (Triton's normal path);
* a binder that disagrees with our argument list (or has another protocol) turns the fast path
  off for that key, with one warning;
* ``TOKENSPEED_TRITON_FAST_LAUNCH=0``, ``TRITON_INTERPRET=1`` and launch hooks bypass it;
* with the sampler's real kernels: ``launch`` reads their parameters in ``arg_names`` order, and
  every call site of ``triton/sampling.py`` binds (each keyword argument names a parameter or is
  a launch option) to the same ordered list as the Python signature.
"""
from __future__ import annotations

import inspect
import types
import warnings

import pytest
import torch
import triton
from triton.runtime.jit import JITFunction

from tokenspeed_kernel.triton import launch as L

EMPTY = inspect.Parameter.empty
OPTIONS = {"num_warps", "num_stages", "num_ctas", "enable_fp_fusion", "debug"}


class FakeParam:
    def __init__(self, name, constexpr=False, default=EMPTY):
        self.name = name
        self.is_constexpr = constexpr
        self.default = default
        self.has_default = default is not EMPTY


class FakeKernel:
    """CompiledKernel stand-in: ``kernel[grid](*args, stream=s)`` records the launch."""

    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        def runner(*args, stream=None):
            self.log.append((self, grid, args, stream))
        return runner


class FakeFn:
    """JITFunction stand-in for ``kernel(x, n, y, BLOCK: constexpr, FLAG: constexpr = True,
    z=None)``. ``fn[grid](...)`` (Triton's path) records the call and returns a new kernel."""

    def __init__(self, binder=None):
        self.params = [FakeParam("x"), FakeParam("n"), FakeParam("y"),
                       FakeParam("BLOCK", True), FakeParam("FLAG", True, True),
                       FakeParam("z", default=None)]
        self.arg_names = [p.name for p in self.params]
        self.debug = None
        self.pre_run_hooks = []
        self.launches = []    # fast-path launches
        self.slow = []        # calls of fn[grid](...)
        self.sig = inspect.Signature([
            inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=p.default)
            for p in self.params])
        self.device_caches = {0: ({}, {}, None, None, binder or self.binder)}

    def binder(self, *args, **kwargs):   # triton 3.3-3.8: (bound_args, specialization, options)
        names = set(self.arg_names)
        b = self.sig.bind(*args, **{k: v for k, v in kwargs.items() if k in names})
        b.apply_defaults()
        return dict(b.arguments), [], kwargs

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.slow.append((grid, args, kwargs))
            return FakeKernel(self.launches)
        return run


@pytest.fixture(autouse=True)
def fast_env(monkeypatch):
    """Fast path on (conftest sets TRITON_INTERPRET=1 on CPU machines), a fake driver, an empty
    cache."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("TOKENSPEED_TRITON_FAST_LAUNCH", raising=False)
    active = types.SimpleNamespace(get_current_device=lambda: 0,
                                   get_current_stream=lambda device: 777)
    monkeypatch.setattr(L, "_driver", types.SimpleNamespace(active=active))
    monkeypatch.setattr(L, "_CACHE", {})
    monkeypatch.setattr(L, "_FN_INFO", {})
    monkeypatch.setattr(L, "_WARNED", False)
    monkeypatch.setattr(L, "_on_device", lambda v: True)   # CPU tensors stand in for CUDA ones


def _t(dtype=torch.float32, aligned=True):
    t = torch.zeros(64, dtype=dtype)
    t = t if aligned else t[1:]
    assert (t.data_ptr() % 16 == 0) == aligned
    return t


def test_hit_passes_every_parameter_in_order_and_the_padded_grid():
    fn = FakeFn()
    x, y = _t(), _t()
    k1 = L.launch(fn, (3, 2), x, 32, y, BLOCK=64, num_warps=4)
    assert len(fn.slow) == 1 and fn.launches == []
    x2, y2 = _t(), _t()
    k2 = L.launch(fn, (5, 7), x2, 48, y2, BLOCK=64, num_warps=4)
    assert len(fn.slow) == 1, "same specialization: a cache hit"
    assert k2 is k1
    # positional tensors reach the launcher as raw pointers (ints)
    assert fn.launches == [(k1, (5, 7, 1), (x2.data_ptr(), 48, y2.data_ptr(), 64, True, None),
                            777)]
    # keyword arguments by name in signature order, whatever order they are given in
    L.launch(fn, (9,), x2, 48, z=y, FLAG=False, BLOCK=64, y=y2)
    L.launch(fn, (9,), x2, 48, z=y, FLAG=False, BLOCK=64, y=y2)
    assert len(fn.slow) == 2
    assert fn.launches[-1][1:] == ((9, 1, 1), (x2.data_ptr(), 48, y2, 64, False, y), 777)
    assert len(L._CACHE) == 2


@pytest.mark.parametrize("change", ["align", "dtype", "div16", "one", "int64", "constexpr",
                                    "bool_vs_int", "option", "kw_tensor_align"])
def test_specialization_change_misses(change):
    fn = FakeFn()
    base = dict(x=_t(), n=32, y=_t(), BLOCK=64, num_warps=4, z=_t())
    other = dict(base)
    if change == "align":
        other["x"] = _t(aligned=False)
    elif change == "dtype":
        other["y"] = _t(torch.bfloat16)
    elif change == "div16":
        other["n"] = 33
    elif change == "one":
        other["n"] = 1
    elif change == "int64":
        other["n"] = 2 ** 40
    elif change == "constexpr":
        other["BLOCK"] = 128
    elif change == "bool_vs_int":
        base["FLAG"], other["FLAG"] = True, 1
    elif change == "option":
        other["num_warps"] = 8
    else:   # a non-constexpr parameter passed by keyword is specialized, not keyed by identity
        other["z"] = _t(aligned=False)

    def call(a):
        kw = {k: v for k, v in a.items() if k not in ("x", "n", "y")}
        L.launch(fn, (1,), a["x"], a["n"], a["y"], **kw)

    call(base)
    call(base)
    assert len(fn.slow) == 1 and len(fn.launches) == 1
    call(other)
    assert len(fn.slow) == 2, f"{change}: must miss"
    call(other)
    assert len(fn.slow) == 2 and len(fn.launches) == 2
    if change == "kw_tensor_align":
        call(dict(base, z=_t()))   # another aligned tensor: a hit
        assert len(fn.slow) == 2


def test_binder_mismatch_turns_fast_path_off_and_warns_once():
    def copying_binder(*args, **kwargs):   # binds equal values, but not the same objects
        bound, spec, opts = fn.binder(*args, **kwargs)
        return {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                for k, v in bound.items()}, spec, opts

    fn = FakeFn()
    fn.device_caches[0] = fn.device_caches[0][:-1] + (copying_binder,)
    x, y = _t(), _t()
    with pytest.warns(RuntimeWarning, match="fast Triton launch off"):
        L.launch(fn, (1,), x, 32, y, BLOCK=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            L.launch(fn, (1,), x, 32, y, BLOCK=64)
        L.launch(fn, (1,), x, 32, y, BLOCK=128)   # another key, also off: no second warning
    assert len(fn.slow) == 4 and fn.launches == []
    assert all(v is L._OFF for v in L._CACHE.values())


def test_binder_of_another_protocol_turns_fast_path_off():
    fn = FakeFn()
    fn.device_caches[0] = fn.device_caches[0][:-1] + (  # triton <= 3.2: a 5-tuple
        lambda *a, **k: (fn.binder(*a, **k)[0], None, None, None, None),)
    with pytest.warns(RuntimeWarning, match="binder"):
        L.launch(fn, (1,), _t(), 32, _t(), BLOCK=64)
    L.launch(fn, (1,), _t(), 32, _t(), BLOCK=64)
    assert len(fn.slow) == 2 and fn.launches == []


@pytest.mark.parametrize("how", ["fast_launch_0", "interpret", "hook", "pre_run_hook",
                                 "callable_grid", "odd_arg"])
def test_bypass(monkeypatch, how):
    fn = FakeFn()
    args = [_t(), 32, _t()]
    grid = (1,)
    if how == "fast_launch_0":
        monkeypatch.setenv("TOKENSPEED_TRITON_FAST_LAUNCH", "0")
    elif how == "interpret":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    elif how == "hook":
        def hook(*a, **k):
            pass
        if L._HOOK_CHAIN is not None:   # triton 3.6 / 3.8: a HookChain, never None
            monkeypatch.setattr(L._HOOK_OWNER.launch_enter_hook, "calls", [hook])
        else:
            monkeypatch.setattr(L._HOOK_OWNER, "launch_enter_hook", hook)
    elif how == "pre_run_hook":
        fn.pre_run_hooks.append(lambda *a, **k: None)
    elif how == "callable_grid":
        grid = lambda meta: (1,)   # noqa: E731
    else:
        args[1] = (1, 2)   # a tuple argument: outside the key's types
    for _ in range(3):
        L.launch(fn, grid, *args, BLOCK=64)
    assert len(fn.slow) == 3 and fn.launches == [] and L._CACHE == {}


def test_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(L, "_MAX_ENTRIES", 3)
    fn = FakeFn()
    for b in range(10):
        L.launch(fn, (1,), _t(), 32, _t(), BLOCK=b)
        assert len(L._CACHE) <= 4


# ---------------------------------------------------------------------------------------------
# the sampler's real kernels and call sites
# ---------------------------------------------------------------------------------------------
def _jit(fn):
    """The JITFunction of a sampler kernel (under TRITON_INTERPRET=1 the module holds an
    InterpretedFunction: rebuild the JITFunction from the same Python function)."""
    return fn if isinstance(fn, JITFunction) else JITFunction(fn.fn)


def _sampler_calls(monkeypatch):
    """(fn, grid, args, kwargs) of every launch of ``sampling.sample`` with top-k, top-p and a
    logit bias (K1, K2, K3 and ``_prep_masks``), recorded instead of launched."""
    from tokenspeed_kernel.triton import sampling as S
    calls = []
    monkeypatch.setattr(S, "launch", lambda fn, grid, *a, **k: calls.append((fn, grid, a, k)))
    rows, V = 2, 200
    i64 = dict(dtype=torch.int64)
    proc = [None] * 16
    proc[0] = torch.tensor([0, 1, 2], **i64)                 # bias_indptr
    proc[1] = torch.tensor([3, 5], **i64)                    # bias_ids
    proc[2] = torch.tensor([1.0, -1.0])                      # bias_values
    S.sample(torch.zeros(rows, V), torch.arange(rows, **i64), torch.zeros(rows, **i64),
             temperature=torch.ones(rows), top_k=torch.full((rows,), 5, dtype=torch.int32),
             top_p=torch.full((rows,), 0.9), want_logprobs=True, processing=proc)
    names = {c[0].fn.__name__ for c in calls}
    assert names == {"_k1_partial", "_k2_mass", "_k3_finalize", "_prep_masks"}, names
    return calls


def test_real_kernels_parameters_in_arg_names_order():
    from tokenspeed_kernel.triton import sampling as S
    for kern in (S._k1_partial, S._k3_finalize):
        fn = _jit(kern)
        ce, runtime, names, defaults = L._fn_info(fn)
        assert list(names) == fn.arg_names
        sig = inspect.signature(fn.fn)
        assert list(names) == list(sig.parameters)
        assert [n for n, c in zip(names, ce) if c] == [fn.arg_names[i] for i in fn.constexprs]
        assert runtime == {n for n, c in zip(names, ce) if not c}
        assert defaults == {n: p.default for n, p in sig.parameters.items()
                            if p.default is not EMPTY}


def test_sampler_call_sites_bind_to_our_order(monkeypatch):
    for kern, grid, args, kwargs in _sampler_calls(monkeypatch):
        fn = _jit(kern)
        ce, runtime, names, defaults = L._fn_info(fn)
        assert isinstance(grid, tuple) and 1 <= len(grid) <= 3
        unknown = set(kwargs) - set(names) - OPTIONS
        assert not unknown, f"{fn.fn.__name__}: not parameters: {unknown}"
        for k in set(kwargs) & set(names):   # the sampler passes constexprs only by keyword
            assert ce[names.index(k)], f"{fn.fn.__name__}: {k} is not a constexpr"
        ours = (*args, *L._rest_getter(names[len(args):])({**defaults, **kwargs}))
        b = inspect.signature(fn.fn).bind(*args, **{k: v for k, v in kwargs.items()
                                                    if k in names})
        b.apply_defaults()
        theirs = tuple(b.arguments.values())
        assert len(ours) == len(theirs) == len(names)
        assert all(a is t for a, t in zip(ours, theirs)), fn.fn.__name__
        L._key(fn, (ce, runtime), 0, args, kwargs)   # every argument has a key part


def test_triton_version_has_the_binder_protocol():
    """The installed triton's JITFunction still builds its launch binder as launch.py expects
    (on a GPU the binder check itself guards every key)."""
    src = inspect.getsource(JITFunction.run)
    assert "binder(*args, **kwargs)" in src and "*bound_args.values()" in src, triton.__version__


def test_cpu_tensors_take_tritons_path(monkeypatch):
    """A CPU tensor is never passed as a raw pointer: Triton's own path refuses it by name."""
    monkeypatch.setattr(L, "_on_device", lambda v: v.is_cuda)
    fn = FakeFn()
    for _ in range(2):
        L.launch(fn, (1,), _t(), 32, _t(), BLOCK=64)
    assert len(fn.slow) == 2 and fn.launches == [] and L._CACHE == {}


def test_a_launcher_refusing_raw_pointers_turns_the_key_off():
    """The first fast launch of an entry is guarded: an argument-parsing error (raised before
    anything launches) sends that call and every later one with the key through fn[grid], with
    one warning; the kernel is launched once per call either way."""
    class Refusing(FakeKernel):
        def __getitem__(self, grid):
            def runner(*args, stream=None):
                raise TypeError("Pointer argument must be either uint64 or have data_ptr method")
            return runner

    class RefusingFn(FakeFn):   # Triton's path launches, and returns a refusing kernel
        def __getitem__(self, grid):
            run = super().__getitem__(grid)

            def slow(*a, **k):
                run(*a, **k)
                return Refusing(self.launches)
            return slow

    fn = RefusingFn()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            L.launch(fn, (2,), _t(), 32, _t(), BLOCK=64)
    assert len(fn.slow) == 3, "miss, then the refused fast launch falls back, then off"
    assert fn.launches == []
    assert len([x for x in w if "fast Triton launch off" in str(x.message)]) == 1
    assert list(L._CACHE.values()) == [L._OFF]
