"""The paper's workloads (§6) written in the TRA."""

from .linalg import matmul, softmax_rows
from .ffnn import ffnn_forward
from .nearest_neighbor import RowIndex, nearest_neighbor
from .data import UniformChunks, random_uniform

__all__ = ["matmul", "softmax_rows", "ffnn_forward", "nearest_neighbor", "RowIndex", "random_uniform", "UniformChunks"]
