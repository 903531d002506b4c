"""minillm: a compact LLM serving engine, built one chapter at a time."""

from minillm.llm import LLM
from minillm.request import RequestOutput
from minillm.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput"]
