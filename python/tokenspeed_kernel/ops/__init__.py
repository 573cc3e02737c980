"""Public API: validate -> allocate -> pick backend -> call."""
from .sampling import Csr, LogitsInputs, SampleLogprobsOutput, SampleOutput, sample, sample_with_logprobs  # noqa: F401,E501
from .verify import VerifyLogprobsOutput, VerifyOutput, verify, verify_with_logprobs  # noqa: F401
from .comm import AllGatherComm, CommError, all_gather_hidden, all_gather_hidden_out, all_gather_hidden_view, create_all_gather_comm  # noqa: F401,E501
from .dp import DPOutput, DPSamplingComm, DPVerifyOutput, create_dp_sampling_comm, dp_sample, dp_verify, sample_from_shards, swap_vocab_to_batch  # noqa: F401,E501
from .logits_processing import TokenCounts, add_output_tokens, admit_requests, new_token_counts  # noqa: F401,E501
try:   # the Triton backends as torch ops (torch.compile); eager calls do not need them
    from . import _triton_library  # noqa: F401,E402
except Exception as _e:  # noqa: BLE001
    import warnings
    warnings.warn(f"tokenspeed_kernel: defining the Triton backends' torch ops failed "
                  f"({type(_e).__name__}: {_e}); torch.compile of backend='triton' calls will "
                  f"fail, eager calls and CUDA graphs are unaffected", RuntimeWarning)
