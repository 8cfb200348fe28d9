"""The CUDA platform's kernels for the layers' custom ops (Triton): the twin of
vllm/cpu (CPU) and vllm/hpu (Gaudi). The attention kernels live with the other
backends in vllm/attention/ops."""
