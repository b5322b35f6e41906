"""The paper's workloads (§6) written in the TRA."""

from .linalg import matmul, softmax_rows
from .ffnn import ffnn_forward, ffnn_sgd_step
from .nearest_neighbor import RowIndex, nearest_neighbor
from .data import UniformChunks, random_uniform

__all__ = ["matmul", "softmax_rows", "ffnn_forward", "ffnn_sgd_step", "nearest_neighbor", "RowIndex", "random_uniform", "UniformChunks"]
