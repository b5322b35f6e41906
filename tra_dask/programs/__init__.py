"""The paper's workloads (§6) written in the TRA."""

from .linalg import matmul, softmax_rows
from .ffnn import ffnn_forward, ffnn_sgd_step
from .nearest_neighbor import RowIndex, nearest_neighbor
from .data import UniformChunks, UniformRegion, random_uniform, uniform_array
from .arrays import ffnn_forward_array, ffnn_sgd_step_array, matmul_array, nearest_neighbor_array

__all__ = ["matmul", "softmax_rows", "ffnn_forward", "ffnn_sgd_step", "nearest_neighbor", "RowIndex", "random_uniform", "UniformChunks", "UniformRegion", "uniform_array",
           "matmul_array", "nearest_neighbor_array", "ffnn_forward_array", "ffnn_sgd_step_array"]
