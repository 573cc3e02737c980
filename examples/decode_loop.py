"""Decode loop: a transformers Llama model (tiny config, random weights) + ``ops.sample``.

A batch of requests, each with its own seed and sampling parameters (per-request tensors on the
model's device), one ``ops.sample`` call per decode step, ``offset`` advanced by one per step.
Because the randomness is stateless (Philox keyed by seed, counter = offset), running the same
requests again gives the same tokens: the script decodes twice and checks it.

    PYTHONPATH=python python examples/decode_loop.py                  # CPU: reference backend
    PYTHONPATH=python python examples/decode_loop.py --device cuda    # GPU: CUDA kernel

No download: the model is built from a small ``LlamaConfig`` with random weights.
"""
from __future__ import annotations

import argparse
import inspect
import sys

import torch

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError:
    sys.exit("decode_loop.py needs transformers (pip install transformers); it is not installed.")

from tokenspeed_kernel import ops

# the KV cache argument / output field: `cache` in recent transformers, `past_key_values` before
CACHE = ("cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters
         else "past_key_values")


def build_model(args, device, dtype):
    torch.manual_seed(0)                       # the weights; sampling has its own seeds below
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256,
                         initializer_range=0.2)  # larger than the default: peakier logits
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


@torch.inference_mode()
def generate(model, prompt, seed, temperature, top_k, top_p, steps, backend):
    """Decode ``steps`` tokens for every request of the batch; returns [batch, steps]."""
    offset = torch.zeros_like(seed)            # per request; +1 per decode step
    out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)    # prefill
    tokens = []
    for _ in range(steps):
        logits = out.logits[:, -1, :]          # [batch, V] view: any row stride is accepted
        s = ops.sample(logits, seed, offset, temperature=temperature, top_k=top_k,
                       top_p=top_p, backend=backend)
        assert bool(s.valid.all())
        tokens.append(s.tokens)
        offset += 1                            # the next step draws fresh noise
        out = model(input_ids=s.tokens[:, None], **{CACHE: getattr(out, CACHE)},
                    use_cache=True, logits_to_keep=1)
    return torch.stack(tokens, dim=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu (reference backend) or cuda")
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "triton", "reference"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--vocab", type=int, default=1000)
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32   # logits: bf16 / fp32
    model = build_model(args, device, dtype)

    B = args.batch
    prompt = torch.randint(0, args.vocab, (B, args.prompt_len),
                           generator=torch.Generator().manual_seed(1)).to(device)
    # per-request sampling parameters (tensors on the model's device; CUDA-graph friendly)
    seed = torch.arange(B, dtype=torch.int64, device=device) + 1234
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3] * B, device=device)[:B]   # 0 = greedy
    top_k = torch.tensor([0, 50, 0, 20] * B, device=device)[:B]                # 0 = off
    top_p = torch.tensor([1.0, 0.9, 0.95, 1.0] * B, device=device)[:B]         # 1 = off

    tokens = generate(model, prompt, seed, temperature, top_k, top_p, args.steps, args.backend)
    for i in range(B):
        print(f"request {i} (seed {int(seed[i])}, T={float(temperature[i]):.1f}, "
              f"top_k={int(top_k[i])}, top_p={float(top_p[i]):.2f}): {tokens[i].tolist()}")

    again = generate(model, prompt, seed, temperature, top_k, top_p, args.steps, args.backend)
    assert torch.equal(tokens, again), "same seeds and offsets must give the same tokens"
    print(f"decoded {B} requests x {args.steps} steps on {device}; "
          f"replay with the same seeds: identical tokens")


if __name__ == "__main__":
    main()
