"""The model and what it takes to load and run one.

llama.py         a compact Llama-family decoder (``CausalLM``, ``ModelConfig``)
loader.py        "tiny", a hub name, a local path or a transformers model -> model + tokenizer
tokenizer.py     the byte-level tokenizer of "tiny" and a wrapper for Hugging Face's
download.py      the packaged models ("smollm2"): download once, check, convert, cache
sampler.py       logits -> next tokens: greedy, temperature, top-k, top-p
cpu_threads.py   how many CPU threads torch uses for a model, chosen on purpose
"""
