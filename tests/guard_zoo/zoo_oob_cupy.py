"""CuPy arrays: a RawKernel writes past the end of one, an elementwise kernel past
the end of another."""

import cupy

from zoo_common import write_kernel

x = cupy.zeros(1000, dtype=cupy.float32)  # SITE:x
write_kernel()((1,), (32,), (x, cupy.int64(1000), cupy.int32(8), cupy.float32(7.0)))
y = cupy.ones(256, dtype=cupy.float32)  # SITE:y
oob = cupy.ElementwiseKernel("int64 off", "raw float32 p", "p[i + off] = 5.0f", "zoo_oob")
oob(cupy.int64(256), y, size=4)
cupy.cuda.Device().synchronize()
print("ZOO sums", float(x.sum()), float(y.sum()))
del x, y
print("ZOO done")
