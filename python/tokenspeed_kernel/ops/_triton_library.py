"""torch.library ops of the Triton backends, for torch.compile.

The Triton backends launch their kernels from Python (``triton/launch.py``: raw pointers, a
launch cache, driver calls), which Dynamo cannot trace. Under ``torch.compile`` the ``ops``
functions call these custom ops instead (opaque to the compiler; fake kernels give the output
shapes); in eager mode and under CUDA-graph capture they call the backend directly (no
dispatcher cost). Each op's implementation is the direct call, so the tokens are the same.

Ops (namespace ``tokenspeed_kernel``, beside the extension's; they exist without it):

* ``triton_sample``: ``triton.sampling.sample`` (functional; logprob outputs are empty
  ``[0]`` tensors when not wanted);
* ``triton_verify_probabilistic``, ``triton_verify_strict_accept``: ``triton.verify``'s, writing
  into the given output tensors (mutating ops);
* ``triton_verify_process_target``: ``triton.verify_processing.process_target`` (functional:
  the processed rows and, when asked, the raw rows' log-sum-exp);
* ``triton_admit_requests``, ``triton_add_output_tokens``: ``triton.token_counts``' in-place
  updates of the penalty state (mutating ops).

The Triton modules are imported by the implementations only (defining the ops needs no triton).
"""
from typing import Optional, Sequence

import torch
from torch import Tensor

_NS = "tokenspeed_kernel"


def _proc_list(proc: Sequence[Optional[Tensor]]) -> list:
    return list(proc)


@torch.library.custom_op(f"{_NS}::triton_sample", mutates_args=())
def triton_sample(logits: Tensor, seed: Tensor, offset: Tensor, temperature: Optional[Tensor],
                  top_k: Optional[Tensor], top_p: Optional[Tensor], min_p: Optional[Tensor],
                  tokens_per_request: int, want_logprobs: bool,
                  processing: Sequence[Optional[Tensor]]) -> tuple[Tensor, Tensor, Tensor,
                                                                    Tensor]:
    from ..triton import sampling as tri
    tok, valid, lp, plp = tri.sample(logits, seed, offset, temperature, top_k, top_p, min_p,
                                     tokens_per_request, want_logprobs, _proc_list(processing))
    if lp is None:
        lp = logits.new_empty(0, dtype=torch.float32)
        plp = logits.new_empty(0, dtype=torch.float32)
    return tok, valid, lp, plp


@triton_sample.register_fake
def _(logits, seed, offset, temperature, top_k, top_p, min_p, tokens_per_request,
      want_logprobs, processing):
    rows = logits.shape[0]
    nl = rows if want_logprobs else 0
    return (logits.new_empty(rows, dtype=torch.int64), logits.new_empty(rows, dtype=torch.bool),
            logits.new_empty(nl, dtype=torch.float32), logits.new_empty(nl, dtype=torch.float32))


@torch.library.custom_op(f"{_NS}::triton_verify_probabilistic",
                         mutates_args=("tokens", "num_accepted", "valid", "logprobs",
                                       "processed_logprobs"))
def triton_verify_probabilistic(tgt: Tensor, drf: Optional[Tensor], ids: Tensor, cu: Tensor,
                                seed: Tensor, offset: Tensor, temperature: Optional[Tensor],
                                min_p: Optional[Tensor], top_k: Optional[Tensor],
                                top_p: Optional[Tensor], max_n: int, padded: bool, ngram: bool,
                                tokens: Tensor, num_accepted: Tensor, valid: Tensor,
                                logprobs: Optional[Tensor],
                                processed_logprobs: Optional[Tensor]) -> None:
    from ..triton import verify as tri
    tri.verify_probabilistic(tgt, drf, ids, cu, seed, offset, temperature, min_p, max_n, padded,
                             ngram, tokens, num_accepted, valid, logprobs, processed_logprobs,
                             top_k=top_k, top_p=top_p)


@triton_verify_probabilistic.register_fake
def _(*args):
    return None


@torch.library.custom_op(f"{_NS}::triton_verify_strict_accept",
                         mutates_args=("tokens", "num_accepted", "valid", "logprobs",
                                       "processed_logprobs"))
def triton_verify_strict_accept(row_tokens: Tensor, row_valid: Tensor,
                                row_lp: Optional[Tensor], row_plp: Optional[Tensor], ids: Tensor,
                                cu: Tensor, max_n: int, padded: bool, tokens: Tensor,
                                num_accepted: Tensor, valid: Tensor, logprobs: Optional[Tensor],
                                processed_logprobs: Optional[Tensor]) -> None:
    from ..triton import verify as tri
    tri.strict_accept(row_tokens, row_valid, row_lp, row_plp, ids, cu, max_n, padded, tokens,
                      num_accepted, valid, logprobs, processed_logprobs)


@triton_verify_strict_accept.register_fake
def _(*args):
    return None


@torch.library.custom_op(f"{_NS}::triton_verify_process_target", mutates_args=())
def triton_verify_process_target(tgt: Tensor, proc: Sequence[Optional[Tensor]],
                                 allowed_per_row: bool, ids: Tensor, cu: Tensor, max_n: int,
                                 padded: bool, raw_lse: bool) -> tuple[Tensor, Tensor]:
    """(processed rows, the raw rows' log-sum-exp [R_t], or an empty [0] without raw_lse)."""
    from ..triton import verify_processing as tvp
    res = tvp.process_target(tgt, _proc_list(proc), allowed_per_row, ids, cu, max_n, padded,
                             raw_lse=raw_lse)
    return res if raw_lse else (res, tgt.new_empty(0, dtype=torch.float32))


@triton_verify_process_target.register_fake
def _(tgt, proc, allowed_per_row, ids, cu, max_n, padded, raw_lse):
    return (tgt.new_empty(tgt.shape, dtype=torch.float32),
            tgt.new_empty(tgt.shape[0] if raw_lse else 0, dtype=torch.float32))


@torch.library.custom_op(f"{_NS}::triton_admit_requests", mutates_args=("seen", "output"))
def triton_admit_requests(seen: Tensor, output: Tensor, slots: Tensor, ids: Tensor,
                          indptr: Tensor) -> None:
    from ..triton import token_counts as tri
    tri.admit(seen, output, slots, ids, indptr)


@triton_admit_requests.register_fake
def _(*args):
    return None


@torch.library.custom_op(f"{_NS}::triton_add_output_tokens", mutates_args=("seen", "output"))
def triton_add_output_tokens(seen: Tensor, output: Tensor, tokens: Tensor,
                             valid: Optional[Tensor], slots: Optional[Tensor]) -> None:
    from ..triton import token_counts as tri
    tri.add_tokens(seen, output, tokens, valid, slots)


@triton_add_output_tokens.register_fake
def _(*args):
    return None
