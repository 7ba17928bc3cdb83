"""Shared by the zoo programs: a CuPy RawKernel that writes ``count`` floats at
``p[start:start+count]`` (``start`` may be negative or past the end: the bug)."""

WRITE_SRC = r'''
extern "C" __global__ void zoo_write(float* p, long long start, int count, float v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) p[start + i] = v;
}
'''


def write_kernel():
    import cupy
    return cupy.RawKernel(WRITE_SRC, "zoo_write")
