"""Speed, memory and scaling benchmarks of hf_deepnmt against transformers.MarianMTModel.

Run ``python -m benchmarks.run`` from the repository root (``--quick`` for a two-minute smoke run); see
``benchmarks/RESULTS.md`` for the latest results and the method.
"""
