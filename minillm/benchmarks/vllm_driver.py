"""vLLM's side of ``minillm bench --baseline vllm``: run in vLLM's own virtual environment
(``minillm.benchmarks.vllm_venv``), never imported by minillm, so it needs only the standard library
and vLLM.

    <vllm venv>/bin/python vllm_driver.py JOB.json

``JOB.json`` names a checkpoint folder, the workload's token ids and output lengths, and the batch
limits. The driver builds one ``vllm.LLM`` (its engine process compiles the model the first time,
then reuses torch.compile's cache), runs a warm-up off the clock, prints ``ready``, and then, for
every ``run`` line it reads, generates the whole workload once and prints the round as one JSON
line. So the bench keeps one warm vLLM for all its rounds and interleaves them with minillm's.
Only ``generate`` is timed.
"""

import json
import sys
import time


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(
        model=job["model"],
        dtype=job["dtype"],
        skip_tokenizer_init=True,  # the prompts are token ids; no detokenizing, as in minillm's bench
        max_num_seqs=job["max_num_seqs"],
        max_num_batched_tokens=job["max_num_batched_tokens"],
        max_model_len=job["max_model_len"],
        enable_prefix_caching=False,  # random prompts share nothing; minillm's bench runs without it too
        seed=0,
    )
    prompts = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
    params = [
        SamplingParams(max_tokens=o, min_tokens=o, ignore_eos=True, temperature=0.0, detokenize=False)
        for o in job["outputs"]
    ]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # off the clock
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        start = time.perf_counter()
        results = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        lengths = [len(r.outputs[0].token_ids) for r in results]
        print(json.dumps({"seconds": seconds, "lengths": lengths}), flush=True)
    return 0


if __name__ == "__main__":  # vLLM's LLM spawns its engine process: the guard keeps it from rerunning this
    raise SystemExit(main(sys.argv[1]))
