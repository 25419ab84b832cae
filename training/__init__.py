"""Training tools built on hf_deepnmt: data, tokenizer, trainer, metrics, CLI and recipes."""
