"""Chapter 1's KV cache. It lives in ``minillm.attention.contiguous`` beside the other attention
backends; this name stays because chapter 1's notebook and exercise import it from here."""

from minillm.attention.contiguous import ContiguousKVCache

__all__ = ["ContiguousKVCache"]
