"""Speculative decoding: a small draft model proposes n tokens, ``ops.verify`` accepts a prefix.

Target: a transformers Llama model (tiny config, random weights). Draft: the same architecture
with fewer layers, sharing the target's first layer, embeddings and head (an "early exit" draft,
so that it agrees with the target often). Each round, for a batch of requests with their own
seeds and sampling parameters:

1. the draft samples a chain of n tokens per request (``ops.sample``, n draft forwards);
2. one target forward scores all n + 1 positions;
3. ``ops.verify`` emits the accepted drafts plus one target token per request, either
   ``mode="probabilistic"`` (rejection sampling: accept draft x with probability min(1, p/q))
   or ``mode="strict"`` (accept only a draft equal to the target's own sample). In both modes
   every emitted token is distributed exactly as the target alone would sample it.

``offset`` advances by n + 1 per round (the verify's positions use offset + j).

    PYTHONPATH=python python examples/speculative_decoding.py                # CPU
    PYTHONPATH=python python examples/speculative_decoding.py --device cuda  # GPU

``--damp 0`` makes the draft compute the target's distribution: probabilistic mode then accepts
(almost: rounding) every draft, while strict mode still accepts only drafts equal to the
target's own samples.

Without a KV cache for brevity: every forward recomputes the (tiny) right-padded batch.
"""
from __future__ import annotations

import argparse
import sys

import torch

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError:
    sys.exit("speculative_decoding.py needs transformers (pip install transformers); "
             "it is not installed.")

from tokenspeed_kernel import ops


def build_models(args, device, dtype):
    torch.manual_seed(0)
    cfg = dict(vocab_size=args.vocab, hidden_size=64, intermediate_size=128,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
               initializer_range=0.2)
    target = LlamaForCausalLM(LlamaConfig(num_hidden_layers=3, **cfg))
    draft = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, **cfg))   # the smaller config
    # early exit: the draft takes the target's embeddings, first layer, final norm and head
    draft.load_state_dict(target.state_dict(), strict=False)
    # random weights: damp the target's upper layers so that the draft approximates it, as a
    # trained early-exit draft would (a fully random draft accepts almost nothing)
    with torch.no_grad():
        for layer in target.model.layers[1:]:
            layer.mlp.down_proj.weight.mul_(args.damp)
            layer.self_attn.o_proj.weight.mul_(args.damp)
    return [m.to(device=device, dtype=dtype).eval() for m in (target, draft)]


def logits_at(model, seqs, first, count):
    """Logits of positions first[i] .. first[i] + count - 1 of each sequence: [bs, count, V].

    ``seqs`` is a list of 1-D token tensors of different lengths (right-padded into one batch;
    causal attention, so the padding never changes a real position's logits)."""
    lens = torch.tensor([len(s) for s in seqs])
    batch = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)
    mask = (torch.arange(batch.shape[1])[None, :] < lens[:, None]).to(batch.device)
    logits = model(input_ids=batch, attention_mask=mask.long()).logits
    pos = (first.to(batch.device)[:, None] + torch.arange(count, device=batch.device)[None, :])
    return logits[torch.arange(len(seqs), device=batch.device)[:, None], pos]


@torch.inference_mode()
def speculate(target, draft, prompts, params, n, rounds, mode, backend):
    seed, temperature, top_k, top_p = params
    draft_seed = seed + (1 << 32)          # the draft's own noise, independent of the verify's
    offset = torch.zeros_like(seed)
    seqs = [p.clone() for p in prompts]
    accepted = emitted = 0
    for _ in range(rounds):
        last = torch.tensor([len(s) - 1 for s in seqs])
        # 1. the draft proposes a chain of n tokens per request
        draft_ids, draft_logits = [], []
        for j in range(n):
            ext = [torch.cat([s, *[d[i:i + 1] for d in draft_ids]]) for i, s in enumerate(seqs)]
            q = logits_at(draft, ext, last + j, 1)[:, 0]                    # [bs, V]
            d = ops.sample(q, draft_seed, offset + j, temperature=temperature, top_k=top_k,
                           top_p=top_p, backend=backend)
            draft_ids.append(d.tokens)
            draft_logits.append(q)
        draft_ids = torch.stack(draft_ids, dim=1)                           # [bs, n]
        draft_logits = torch.stack(draft_logits, dim=1)                     # [bs, n, V]
        # 2. one target forward over prompt + drafts: n + 1 positions per request
        ext = [torch.cat([s, draft_ids[i]]) for i, s in enumerate(seqs)]
        target_logits = logits_at(target, ext, last, n + 1)                 # [bs, n + 1, V]
        # 3. verify (padded form: [bs, n] drafts, [bs, n + 1, V] target rows)
        out = ops.verify(target_logits, draft_ids, seed, offset, mode=mode,
                         draft_logits=draft_logits if mode == "probabilistic" else None,
                         temperature=temperature, top_k=top_k, top_p=top_p, backend=backend)
        assert bool(out.valid.all())
        for i in range(len(seqs)):
            k = int(out.num_accepted[i])
            seqs[i] = torch.cat([seqs[i], out.tokens[i, :k + 1]])   # accepted drafts + 1 token
            accepted += k
            emitted += k + 1
        offset += n + 1                     # verify used offset .. offset + n
    return seqs, accepted, emitted


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu (reference backend) or cuda")
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "triton", "reference"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--num-draft", type=int, default=4, help="n: drafts per request and round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--damp", type=float, default=0.1,
                   help="scale of the target's upper layers (0: the draft is the target)")
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target, draft = build_models(args, device, dtype)

    B, n = args.batch, args.num_draft
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, args.vocab, (args.prompt_len,), generator=g).to(device)
               for _ in range(B)]
    params = (torch.arange(B, dtype=torch.int64, device=device) + 1234,          # seed
              torch.tensor([0.0, 0.7, 1.0, 1.0] * B, device=device)[:B],         # temperature
              torch.tensor([0, 50, 0, 0] * B, device=device)[:B],                # top_k
              torch.tensor([1.0, 0.9, 1.0, 0.95] * B, device=device)[:B])        # top_p

    for mode in ("probabilistic", "strict"):
        seqs, accepted, emitted = speculate(target, draft, prompts, params, n, args.rounds, mode,
                                            args.backend)
        drafted = B * n * args.rounds
        print(f"{mode}: acceptance rate {accepted / drafted:.2f} ({accepted} of {drafted} "
              f"drafts), {emitted / (B * args.rounds):.2f} tokens per target forward")
        for i, s in enumerate(seqs):
            print(f"  request {i}: {s[args.prompt_len:].tolist()}")


if __name__ == "__main__":
    main()
