"""Public API: validate -> allocate -> pick backend -> call."""
from .sampling import SampleLogprobsOutput, SampleOutput, sample, sample_with_logprobs  # noqa: F401
from .verify import VerifyLogprobsOutput, VerifyOutput, verify, verify_with_logprobs  # noqa: F401
