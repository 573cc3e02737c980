"""``python -m tokenspeed_kernel.bench render``: merging sampling CSVs of one build; the sampling
bench's input draws (CPU)."""
from __future__ import annotations

import pytest
import torch

from tokenspeed_kernel.bench import report
from tokenspeed_kernel.bench.__main__ import main
from tokenspeed_kernel.bench.sampling import CSV_COLUMNS


def _row(dtype, provider, mode, B, us, sha="abc1234", date="2026-01-01T00:00:00Z"):
    return dict(gpu="NVIDIA H100 80GB HBM3", gpu_short="h100", torch="2.11", cuda="13.0",
                triton="3.6.0", flashinfer="0.7.2", git_sha=sha, date=date, provider=provider,
                impl="x", mode=mode, B=B, V=1000, dtype=dtype, status="ok", graph_us=us,
                eager_us=us * 2, bytes=4000 * B, floor_us=0.01 * B, hbm_gbps=3000.0,
                pct_floor=1.0, ratio_vs_flashinfer=0.5 if provider == "ours-cuda" else None)


def test_render_merges_runs_of_one_build(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    report.write_csv(a, [_row("fp32", "ours-cuda", "temp", 1, 12.5),
                         _row("fp32", "flashinfer", "temp", 1, 25.0)], CSV_COLUMNS)
    report.write_csv(b, [_row("bf16", "ours-cuda", "temp", 4, 7.25,
                              date="2026-01-01T00:05:00Z")], CSV_COLUMNS)
    out = tmp_path / "out"
    assert main(["render", str(a), str(b), "--out", str(out), "--no-plot",
                 "--note", "extra bullet"]) == 0
    rows = report.read_sampling_csv(out / "sampling.csv")
    assert len(rows) == 3 and {r["dtype"] for r in rows} == {"fp32", "bf16"}
    assert isinstance(rows[0]["B"], int) and isinstance(rows[0]["graph_us"], float)
    md = (out / "sampling.md").read_text()
    assert "git abc1234" in md and "## fp32, V = 1000" in md and "## bf16, V = 1000" in md
    assert "12.5" in md and "7.2" in md and "extra bullet" in md and "Merged from 2 runs" in md


def test_render_refuses_mixed_builds(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    report.write_csv(a, [_row("fp32", "ours-cuda", "temp", 1, 12.5)], CSV_COLUMNS)
    report.write_csv(b, [_row("bf16", "ours-cuda", "temp", 1, 9.0, sha="def5678")], CSV_COLUMNS)
    assert main(["render", str(a), str(b), "--out", str(tmp_path / "o"), "--no-plot"]) == 2
    assert not (tmp_path / "o" / "sampling.md").exists()


def test_table_ratios_proc_rows_use_the_fused_call_and_eager_when_uncapturable():
    """In mode "proc", "ours" is the fused call (ours-cuda+proc, else ours-triton+proc) and the
    torch baseline is the engines' way; a baseline without a graph time is compared eager to
    eager, never graph to eager."""
    fused = _row("fp32", "ours-triton+proc", "proc", 64, 100.0)          # eager 200
    plain = _row("fp32", "ours-cuda", "proc", 64, 40.0)
    tway = dict(_row("fp32", "torch-proc+ours-cuda", "proc", 64, 0.0), graph_us=None,
                eager_us=800.0)
    by = {r["provider"]: r for r in (fused, plain, tway)}
    ours, r_fi, r_torch = report.table_ratios(by, "proc")
    assert ours is fused and r_fi is None and r_torch == 200.0 / 800.0
    by["ours-cuda+proc"] = _row("fp32", "ours-cuda+proc", "proc", 64, 50.0)
    assert report.table_ratios(by, "proc")[0] is by["ours-cuda+proc"]
    # other modes: ours-cuda, graph to graph against torch
    t = {"ours-cuda": _row("fp32", "ours-cuda", "temp", 1, 10.0),
         "torch": _row("fp32", "torch", "temp", 1, 40.0),
         "flashinfer": dict(_row("fp32", "flashinfer", "temp", 1, 20.0), status="FAILED: x")}
    ours, r_fi, r_torch = report.table_ratios(t, "temp")
    assert ours is t["ours-cuda"] and r_fi is None and r_torch == 0.25


def test_bench_ratio_columns_use_the_modes_torch_baseline():
    """The CSV ratio columns (bench.sampling._ratios) pick the same torch baseline as the
    table: in mode "proc" the engines' way, eager to eager when it has no graph time."""
    from tokenspeed_kernel.bench import sampling as S
    rows = [_row("fp32", "ours-cuda+proc", "proc", 4, 50.0),                   # eager 100
            dict(_row("fp32", "torch-proc+ours-cuda", "proc", 4, 0.0), graph_us=None,
                 eager_us=400.0),
            _row("fp32", "torch", "proc", 4, 1000.0),
            _row("fp32", "flashinfer", "proc", 4, 10.0)]
    S._ratios(rows)
    assert rows[0]["ratio_vs_torch"] == 100.0 / 400.0
    assert rows[0]["ratio_vs_flashinfer"] == 5.0


def test_input_draws_rotate_through_the_timed_copies():
    """The sampling bench times several input draws per shape: before sample i, copy j of the N
    timed calls holds draw (i + j) mod K; the draws themselves are never written (providers are
    verified on draw 0); one draw: no rotation."""
    from tokenspeed_kernel.bench.sampling import input_draws, rotation
    draws = input_draws(2, 50, torch.float32, torch.device("cpu"), seed=7, k=4)
    assert all(not torch.equal(draws[0], d) for d in draws[1:])
    keep = [d.clone() for d in draws]
    pool = [draws[0].clone() for _ in range(3)]
    prep = rotation(pool, draws, 3)
    for i in range(6):
        prep(i)
        for j in range(3):
            assert torch.equal(pool[j], draws[(i + j) % 4])
    assert all(torch.equal(a, b) for a, b in zip(keep, draws))
    assert rotation(pool, draws[:1], 3) is None


def test_timed_runs_prepare_before_each_sample(monkeypatch):
    """``timing._timed`` calls the prepare hook once per sample, before the sample's flush and
    start event (CUDA events and synchronize replaced by stand-ins: the order is what counts)."""
    from tokenspeed_kernel.bench import timing
    log = []

    class Ev:
        def __init__(self, **kw):
            pass

        def record(self):
            log.append("event")

        def elapsed_time(self, other):
            return 1.0

    monkeypatch.setattr(torch.cuda, "Event", Ev)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: log.append("sync"))
    xs = timing._timed(lambda: log.append("run"), 2, 3, cold_l2=False, spin=False,
                       sync_first=True, device=torch.device("cpu"),
                       prepare=lambda: log.append("prepare"))
    assert xs == [500.0] * 3
    assert log == ["prepare", "sync", "event", "run", "event"] * 3 + ["sync"]


def test_sampling_plot_one_vocab_column_with_processing_providers(tmp_path):
    """The narrow figure of one vocabulary (wrapped title, legend in several columns) and the
    processing row's providers, each with its own style (no default-cycle colour)."""
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    provs = ["ours-cuda", "ours-triton", "ours-cuda+proc", "ours-triton+proc",
             "torch-proc+ours-cuda", "torch-proc+ours-triton", "flashinfer"]
    rows = [dict(_row("fp32", p, "proc" if "proc" in p else "top_k", B, 10.0 * B), B=B)
            for p in provs for B in (1, 4)]
    rows += [dict(_row("fp32", p, "proc", B, 5.0 * B), B=B) for p in ("ours-cuda", "ours-triton")
             for B in (1, 4)]
    seen = []
    orig = plt.Figure.savefig

    def spy(fig, path, *a, **k):
        seen.append(fig)
        return orig(fig, path, *a, **k)

    plt.Figure.savefig = spy
    try:
        paths = report.sampling_plots(rows, tmp_path)
    finally:
        plt.Figure.savefig = orig
    assert [p.name for p in paths] == ["sampling.png"] and paths[0].stat().st_size > 0
    fig = seen[0]
    styles = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_label() in provs:
                styles.setdefault(line.get_label(), set()).add((line.get_color(),
                                                                line.get_linestyle()))
    assert set(styles) == set(provs)
    assert all(len(s) == 1 for s in styles.values())            # one style per provider
    assert len({next(iter(s)) for s in styles.values()}) == len(provs)   # all different
    assert "\n" in fig._suptitle.get_text()                     # wrapped for one column
    leg = fig.legends[0]
    ncols = getattr(leg, "_ncols", getattr(leg, "_ncol", None))
    assert ncols is not None and ncols < len(leg.get_texts())   # several legend rows
