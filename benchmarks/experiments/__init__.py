"""Experiments that reproduce the papers in miniature; each writes its results under results/."""
