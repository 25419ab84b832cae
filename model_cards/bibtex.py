"""BibTeX of the papers a model card cites (the baseline always; each paper when its method is switched on)."""

from __future__ import annotations

BIBTEX: dict[str, str] = {
    "vaswani2017": """@inproceedings{vaswani2017attention,
  title     = {Attention Is All You Need},
  author    = {Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob and Jones, Llion and Gomez, Aidan N. and Kaiser, {\\L}ukasz and Polosukhin, Illia},
  booktitle = {Advances in Neural Information Processing Systems},
  volume    = {30},
  year      = {2017}
}""",
    "li2022": """@inproceedings{li2022deepdecoder,
  title     = {What Works and Doesn't Work, A Deep Decoder for Neural Machine Translation},
  author    = {Li, Zuchao and Wang, Yiran and Utiyama, Masao and Sumita, Eiichiro and Zhao, Hai and Watanabe, Taro},
  booktitle = {Findings of the Association for Computational Linguistics: ACL 2022},
  pages     = {459--471},
  year      = {2022}
}""",
    "dou2018": """@inproceedings{dou2018exploiting,
  title     = {Exploiting Deep Representations for Neural Machine Translation},
  author    = {Dou, Zi-Yi and Tu, Zhaopeng and Wang, Xing and Shi, Shuming and Zhang, Tong},
  booktitle = {Proceedings of the 2018 Conference on Empirical Methods in Natural Language Processing},
  pages     = {4253--4262},
  year      = {2018}
}""",
    "liu2020": """@article{liu2020verydeep,
  title   = {Very Deep Transformers for Neural Machine Translation},
  author  = {Liu, Xiaodong and Duh, Kevin and Liu, Liyuan and Gao, Jianfeng},
  journal = {arXiv preprint arXiv:2008.07772},
  year    = {2020}
}""",
    "meng2019": """@inproceedings{meng2019dtmt,
  title     = {{DTMT}: A Novel Deep Transition Architecture for Neural Machine Translation},
  author    = {Meng, Fandong and Zhang, Jinchao},
  booktitle = {Proceedings of the AAAI Conference on Artificial Intelligence},
  volume    = {33},
  pages     = {224--231},
  year      = {2019}
}""",
}


def papers_for_config(config: dict) -> list[str]:
    """Keys of `BIBTEX` for the methods a config.json uses (Vaswani et al. for every Transformer)."""
    model_type = config.get("model_type", "")
    if model_type == "dtmt":
        return ["meng2019"]
    papers = ["vaswani2017"]
    if (
        model_type == "deep_decoder_transformer"
        or config.get("cross_attention_drop_depth", 0)
        or config.get("ddr_weight", 0)
        or config.get("ald_weight", 0)
    ):
        papers.append("li2022")
    if (
        model_type == "deep_representation_transformer"
        or config.get("encoder_layer_aggregation", "none") != "none"
        or config.get("decoder_layer_aggregation", "none") != "none"
        or config.get("multi_layer_attention_k", 1) != 1
        or config.get("diversity_weight", 0)
    ):
        papers.append("dou2018")
    if model_type == "admin_transformer" or config.get("residual_scaling", "none") == "admin":
        papers.append("liu2020")
    return papers
