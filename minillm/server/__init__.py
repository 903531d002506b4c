"""Chapter 8: serving minillm over HTTP, the way vLLM and SGLang are served.

    minillm serve --model tiny --engine chunked --max-num-seqs 8 --port 8000

starts an OpenAI-compatible server (FastAPI + uvicorn). One module per idea:

  async_llm.py    the engine in its own thread; HTTP requests join the running batch between steps
  serving.py      OpenAI request -> engine request -> streamed tokens -> OpenAI responses
  detokenizer.py  token ids -> text deltas, and stop strings
  protocol.py     the request bodies (pydantic) and OpenAI's error body
  prometheus.py   /metrics: vLLM's Prometheus metric names under ``minillm:``
  api_server.py   the routes, errors, API key
  limits.py       what one client may hold: a deadline to read a request, uvicorn's limits
  launcher.py     ``minillm serve`` and ``serve_in_thread`` (tests, notebooks)
"""

from minillm.server.api_server import build_app
from minillm.server.async_llm import AsyncLLM
from minillm.server.launcher import Server, serve_in_thread

__all__ = ["AsyncLLM", "Server", "build_app", "serve_in_thread"]
