"""`deepnmt` CLI entry point for the FSDP tests: CPU processes over gloo that really shard (FSDP2, `fully_shard`).

accelerate (1.15) turns on FSDP only for GPU-like process groups: on CPU processes it silently trains as DDP over
gloo, even when launched with an FSDP config or given an FSDP plugin. PyTorch's FSDP2 itself runs on a CPU device
mesh over gloo, so for the tests this worker lets accelerate's state take the FSDP plugin on CPU processes too; the
rest (accelerate's FSDP2 preparation, transformers' Trainer, `deepnmt train`) runs unchanged. Launch it like
``-m hf_deepnmt_training.cli``: ``accelerate launch --config_file training/configs/accelerate_fsdp.yaml tests/fsdp_cpu_worker.py
train ARGS``.
"""

from __future__ import annotations

import sys
from typing import Any

from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType

_accelerator_state_init = AcceleratorState.__init__


def _init_with_fsdp_on_cpu(self: AcceleratorState, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
    """`AcceleratorState.__init__`, then the FSDP plugin is used on CPU processes as it would be on GPUs.

    Every later ``AcceleratorState()`` copies `PartialState`'s ``distributed_type`` (MULTI_CPU) back in, so the
    switch is made again whenever the shared state holds an FSDP plugin."""
    _accelerator_state_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    plugin = fsdp_plugin if fsdp_plugin is not None else getattr(self, "fsdp_plugin", None)
    if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = plugin


AcceleratorState.__init__ = _init_with_fsdp_on_cpu  # type: ignore[method-assign]

if __name__ == "__main__":
    from hf_deepnmt_training.cli import main

    sys.exit(main(sys.argv[1:]))
