"""The NumPy convolution that the network and CPU-kernel tests check against, and the kernel's skip mark."""

import numpy as np
import pytest

from ppo_eqx.host import kernel_build

ATARI_SHAPE = (4, 84, 84)
needs_compiler = pytest.mark.skipif(
    kernel_build.find_compiler() is None, reason="no C++ compiler to build the CPU kernel"
)
needs_kernel = pytest.mark.skipif(
    kernel_build.find_compiler() is None or not kernel_build.cpu_supports("native"),
    reason="the CPU kernel needs a C++ compiler and AVX2 with FMA",
)


def numpy_conv(x, weight, bias, stride):
    """A direct VALID convolution, NHWC input and HWIO kernel, as nested loops over output positions."""
    batch, height, width, _ = x.shape
    size, _, _, cout = weight.shape
    out_h, out_w = (height - size) // stride + 1, (width - size) // stride + 1
    y = np.zeros((batch, out_h, out_w, cout))
    for i in range(out_h):
        for j in range(out_w):
            window = x[:, i * stride : i * stride + size, j * stride : j * stride + size, :]
            y[:, i, j, :] = np.tensordot(window, weight, axes=([1, 2, 3], [0, 1, 2]))
    return y + bias
