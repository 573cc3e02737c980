"""Benchmark harness: ``python -m tokenspeed_kernel.bench {sampling,comm,verify,all,smoke}``.

* ``timing``   the one timing helper (warm-up, CUDA-graph replay and eager, CUDA events, cold L2,
               median with p20/p80, host overhead, HBM read bandwidth);
* ``report``   environment capture (GPU, versions, git sha), CSV / markdown / PNG writers;
* ``sampling`` ours (CUDA, Triton) vs torch and FlashInfer, every provider verified first;
* ``comm`` / ``verify`` (``run_comm_bench(args)`` / ``run_verify_bench(args)``) live in their
  own modules and are imported only when asked for.

Public names for scripts that reuse the harness (bench/lab/tools/): ``timing.measure``,
``verify.Problem`` / ``verify.ours_call``, ``verify_filters.filter_params`` /
``verify_filters.ours_call``, ``comm.time_provider`` / ``comm.bench_input``; names with a leading
underscore are internal and may change.

Nothing here is imported by the library itself; importing this package needs no GPU.
docs/BENCHMARKS.md describes the method and where results go.
"""
