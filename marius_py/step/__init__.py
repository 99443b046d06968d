"""The training step: what one batch computes, handed to the pipeline (``pipeline/``) as objects.

- ``model``: the model (decoder, losses, optimizers), batch planning and the autograd step;
- ``fused``, ``edge_kernels``, ``fused_loss``: the fused step of dot-product decoders, with hand-written
  gradients (Triton kernels on CUDA, torch versions as the reference);
- ``graph``: the fused step replayed as a CUDA graph;
- ``runners``: which step each placement gets.
"""
