"""Tensor parallelism: tokens from vocab-sharded logits, by two routes that give the same tokens.

Under TP the LM head is split by vocabulary: rank r holds the logits columns
[r * w, (r + 1) * w) of every request (w >= V / world). Two ways to turn them into tokens:

* all-gather + sample: ``ops.all_gather_hidden`` builds the full ``[B, V]`` logits on every
  rank, and every rank samples the whole batch with ``ops.sample``;
* DP sampling: ``ops.dp_sample`` sends each rank whole rows for its share of the batch, samples
  only those and gathers the tokens, so that every rank gets every token.

The randomness is keyed per request (seed, offset), so both routes, every rank, and a
single-process ``ops.sample`` of the full logits give bit-identical tokens; the script asserts it
at every decode step, and that ``ops.sample_from_shards`` (which picks the faster route by batch
size, as an engine would call it) agrees.

    PYTHONPATH=python python examples/tp_all_gather_and_dp_sampling.py    # 2 CPU ranks (gloo)
    PYTHONPATH=python python examples/tp_all_gather_and_dp_sampling.py --device cuda  # NCCL
    PYTHONPATH=python torchrun --nproc-per-node 2 examples/tp_all_gather_and_dp_sampling.py

(``--device cuda``: one rank per GPU, ``--world-size`` of them.)
"""
from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tokenspeed_kernel import ops


def full_logits(step, B, V, dtype):
    """Stand-in for the model: the same [B, V] logits on every rank (seeded by the step)."""
    g = torch.Generator().manual_seed(100 + step)
    return (torch.randn(B, V, generator=g) * 4).to(dtype)


def worker(rank, world, args, init_method):
    cuda = args.device == "cuda"
    local = int(os.environ.get("LOCAL_RANK", rank))          # this host's GPU index
    if cuda:
        torch.cuda.set_device(local)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init_method, rank=rank,
                            world_size=world)
    B, V, dtype = args.batch, args.vocab, getattr(torch, args.dtype)
    # shard width: ceil(V / world) rounded up to 16 bytes (the all-gather's row alignment, as
    # engines pad the vocabulary); the last shard runs past V, those columns are ignored
    align = 16 // torch.empty((), dtype=dtype).element_size()
    w = -(-V // (world * align)) * align
    # once per group, outside CUDA-graph capture (collective: every rank, same arguments)
    ag = ops.create_all_gather_comm(max_tokens=B, max_total_width=world * w, dtype=dtype,
                                    device=device)
    dp = ops.create_dp_sampling_comm(max_rows=B, vocab_size=V, dtype=dtype, shard_width=w,
                                     device=device)

    # per-request sampling parameters, the whole batch on every rank
    seed = torch.arange(B, dtype=torch.int64, device=device) + 7
    offset = torch.zeros(B, dtype=torch.int64, device=device)
    temperature = torch.tensor([0.0, 0.6, 0.8, 1.0] * B, device=device)[:B]
    top_k = torch.tensor([0, 50, 0, 20] * B, device=device)[:B]
    top_p = torch.tensor([1.0, 0.9, 0.95, 1.0] * B, device=device)[:B]
    params = dict(temperature=temperature, top_k=top_k, top_p=top_p)

    for step in range(args.steps):
        logits = full_logits(step, B, V, dtype)
        padded = torch.nn.functional.pad(logits, (0, world * w - V))      # columns past V: 0
        shard = padded[:, rank * w:(rank + 1) * w].contiguous().to(device)  # this rank's [B, w]

        # route 1: all-gather the shards to [B, V], then sample the whole batch on every rank
        gathered = ops.all_gather_hidden(ag, shard)[:, :V]                 # [B, world * w]
        tok_ag = ops.sample(gathered, seed, offset, **params).tokens
        # route 2: DP sampling (each rank samples B / world rows; every rank gets every token)
        tok_dp = ops.dp_sample(dp, shard, seed, offset, **params).tokens

        assert torch.equal(tok_ag, tok_dp), (rank, step, tok_ag, tok_dp)
        # (in an engine: ops.sample_from_shards, which picks the faster route by batch size)
        tok_auto = ops.sample_from_shards(dp, shard, seed, offset, **params).tokens
        assert torch.equal(tok_auto, tok_dp), (rank, step)
        # the same as one process sampling the full logits ...
        ref = ops.sample(logits.to(device), seed, offset, **params).tokens
        assert torch.equal(tok_dp, ref), (rank, step)
        # ... and the same on every rank
        every = [torch.empty_like(tok_dp) for _ in range(world)]
        dist.all_gather(every, tok_dp)
        assert all(torch.equal(t, tok_dp) for t in every), (rank, step)
        if rank == 0:
            print(f"step {step}: tokens {tok_dp.tolist()}")
        offset += 1

    if rank == 0:
        print(f"{world} ranks, {args.steps} steps, B={B}, V={V}: all-gather + sample and "
              f"dp_sample gave identical tokens on every rank")
    ag.close()
    dp.close()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, a GPU per rank)")
    p.add_argument("--world-size", type=int, default=2, help="ranks to spawn (without torchrun)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=1001)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = p.parse_args()
    if "RANK" in os.environ:                   # under torchrun: this process is one rank
        worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, "env://")
        return
    with socket.socket() as s:                 # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.world_size, args, f"tcp://127.0.0.1:{port}"),
             nprocs=args.world_size)


if __name__ == "__main__":
    main()
