"""Model cards for hf_deepnmt models: templates per model type and the renderer."""
